"""A landscape recorded one run at a time: saved after every run, so a recording that a time
limit stops (a lent GPU's 15 minutes) goes on where it stopped, on another machine of the kind.

The order is the grid's (``autotune.bench.live.run_grid`` follows it too): every configuration
once, then the memory line drawn through their peaks, then the fastest ``ORACLE_TOP`` that fit
measured ``ORACLE_REPEATS`` more times, in rounds. It depends only on the runs so far, so a
resumed recording makes the same choices as one that never stopped.
"""

from __future__ import annotations

from pathlib import Path

from autotune.bench.landscape import (
    Landscape,
    LandscapeHeading,
    Point,
    Run,
    memory_line,
    within_limit,
)
from autotune.bench.output import write_whole
from autotune.config import TrainConfig

ORACLE_TOP, ORACLE_REPEATS = 8, 3
"""The grid's optimum is the best median of its eight fastest (that fit) after three more runs
each, in rounds: a single run moves by several percent on a shared CPU."""


class GridState(LandscapeHeading):
    """A landscape still being recorded: its configurations and the runs each has had."""

    configs: list[TrainConfig]
    runs: list[list[Run]]  # per configuration, in the order run

    @classmethod
    def start(cls, configs: list[TrainConfig], **fields: object) -> GridState:
        return cls(configs=configs, runs=[[] for _ in configs], **fields)

    def with_run(self, index: int, run: Run) -> GridState:
        runs = [list(r) for r in self.runs]
        runs[index].append(run)
        return self.model_copy(update={"runs": runs})

    @property
    def first_pass_done(self) -> bool:
        return all(self.runs)

    def limit(self) -> int:
        """The memory line through every configuration's first run (the grid's rule)."""
        return memory_line([r[0].memory_used_bytes for r in self.runs if r[0].memory_used_bytes])

    def ranked(self) -> list[int]:
        """The configurations the oracle measures again: the fastest first runs that fit."""
        limit = self.limit()
        fitting = [
            i
            for i, r in enumerate(self.runs)
            if within_limit(r[0].status, r[0].memory_used_bytes, limit)
        ]
        fitting.sort(key=lambda i: self.runs[i][0].samples_per_s or 0.0, reverse=True)
        return fitting[:ORACLE_TOP]

    def next_run(self) -> int | None:
        """The configuration to run next, or None when the recording is complete."""
        for i, runs in enumerate(self.runs):
            if not runs:
                return i
        ranked = self.ranked()
        for repeat in range(1, ORACLE_REPEATS + 1):
            for i in ranked:
                if len(self.runs[i]) <= repeat:
                    return i
        return None

    def runs_left(self) -> int:
        """How many runs the recording still needs (the repeats counted as eight, before the
        first pass has found which eight)."""
        first = sum(not r for r in self.runs)
        top = min(ORACLE_TOP, len(self.runs))
        if first:
            return first + top * ORACLE_REPEATS
        return sum(max(0, 1 + ORACLE_REPEATS - len(self.runs[i])) for i in self.ranked())

    def landscape(self) -> Landscape:
        """The finished landscape (``next_run`` is None)."""
        heading = {name: getattr(self, name) for name in LandscapeHeading.model_fields}
        points = [Point(config=c, runs=r) for c, r in zip(self.configs, self.runs, strict=True)]
        return Landscape(**heading, memory_limit_bytes=self.limit(), points=points)

    def save(self, path: str | Path) -> None:
        write_whole(path, self.model_dump_json(indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> GridState:
        return cls.model_validate_json(Path(path).read_text())
