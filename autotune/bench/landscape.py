"""A recorded landscape: every configuration of a space measured, so that search strategies can
be judged against the true optimum, live or by replaying the measurements.

A landscape is JSON (``Landscape.save``/``load``). Each point keeps every run of its
configuration; its value is the median samples/s of the runs that finished, and it is feasible
when it finished and its peak memory stays under the landscape's memory limit.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from autotune.config import TrainConfig
from autotune.result import Platform, TrialResult, TrialStatus
from autotune.runner.platform import AUTOCASTS
from autotune.search.space import SearchSpace

_FROZEN = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True)
class Measured:
    """One measurement made by a strategy: what it ran, what came out, when it ended."""

    config: TrainConfig
    status: str
    samples_per_s: float | None
    memory_used_bytes: int | None
    feasible: bool
    measured_s: float = 0.0
    elapsed_s: float = 0.0  # since the strategy started, when this measurement ended

    @property
    def fits(self) -> bool:
        return self.status == "ok" and self.feasible


Measure = Callable[[TrainConfig], Measured]


def within_limit(status: str, used: int | None, limit: int | None) -> bool:
    """Whether a trial finished with a known peak at most ``limit`` (None: no limit yet)."""
    return status == "ok" and used is not None and (limit is None or used <= limit)


def memory_line(peaks: list[int], low: float = 0.2, high: float = 0.9) -> int:
    """A memory limit that run-to-run noise cannot cross: the middle of the widest relative gap
    between consecutive peaks, among limits that leave between ``low`` and ``high`` of the
    configurations under it. A limit inside a dense cluster (on CPU, two ranks' resident memory
    spans 800-950 MiB in steps of a few MiB, and one configuration's peak moves by up to
    ~40 MiB between runs) would make feasibility a coin toss for every method."""
    ordered = sorted(peaks)
    n = len(ordered)
    candidates = [i for i in range(n - 1) if low * n <= i + 1 <= high * n] or [n // 2]
    i = max(candidates, key=lambda i: ordered[i + 1] / max(ordered[i], 1))
    return (ordered[i] + ordered[min(i + 1, n - 1)]) // 2


def fastest_fitting(measurements: list[Measured]) -> Measured | None:
    """The fastest measurement that finished within the limit, if any."""
    fitting = [m for m in measurements if m.fits]
    return max(fitting, key=lambda m: m.samples_per_s or 0.0, default=None)


class Run(BaseModel):
    """One trial of one configuration, as much of it as strategies and replay need."""

    model_config = _FROZEN

    status: TrialStatus
    samples_per_s: float | None = None
    memory_used_bytes: int | None = None
    step_time_spread: float | None = None
    measured_steps: int = 0
    total_s: float = 0.0
    measured_s: float = 0.0
    message: str = ""
    steady_samples_per_s: float | None = None
    data_wait_share: float | None = None

    @classmethod
    def of(cls, result: TrialResult, memory_used_bytes: int | None) -> Run:
        return cls(
            status=result.status,
            samples_per_s=result.samples_per_s,
            memory_used_bytes=memory_used_bytes,
            step_time_spread=result.step_time_spread,
            measured_steps=result.measured_steps,
            total_s=result.total_s,
            measured_s=result.measured_s,
            message=result.message[:200],
            steady_samples_per_s=result.steady_samples_per_s,
            data_wait_share=result.data_wait_share,
        )


class Point(BaseModel):
    """A configuration and all its runs."""

    model_config = _FROZEN

    config: TrainConfig
    runs: list[Run] = Field(min_length=1)

    @property
    def ok_runs(self) -> list[Run]:
        return [r for r in self.runs if r.status == "ok" and r.samples_per_s is not None]

    @property
    def status(self) -> str:
        return "ok" if self.ok_runs else self.runs[0].status

    @property
    def value(self) -> float | None:
        """Median samples/s over the runs that finished."""
        runs = self.ok_runs
        return statistics.median(r.samples_per_s or 0.0 for r in runs) if runs else None

    @property
    def memory_used_bytes(self) -> int | None:
        """The largest peak seen over its runs."""
        peaks = [r.memory_used_bytes for r in self.ok_runs if r.memory_used_bytes is not None]
        return max(peaks) if peaks else None

    @property
    def steady_ratio(self) -> float | None:
        """Median samples/s without the epoch boundary over samples/s with it (None: not
        recorded)."""
        ratios = [r.steady_samples_per_s / r.samples_per_s for r in self.ok_runs
                  if r.steady_samples_per_s and r.samples_per_s]  # fmt: skip
        return statistics.median(ratios) if ratios else None

    @property
    def data_wait_share(self) -> float | None:
        """Median share of the measured time spent waiting for data (None: not recorded)."""
        shares = [r.data_wait_share for r in self.ok_runs if r.data_wait_share is not None]
        return statistics.median(shares) if shares else None

    @property
    def spread(self) -> float:
        spreads = [r.step_time_spread for r in self.ok_runs if r.step_time_spread is not None]
        return statistics.median(spreads) if spreads else 0.0


class LandscapeHeading(BaseModel):
    """What a landscape was recorded of, and how: its workload, machine, space and protocol."""

    model_config = _FROZEN

    workload: str
    platform: Platform
    devices: int
    space: SearchSpace
    global_batch_size: int
    warmup_steps: int
    measured_steps: int
    native_amp: tuple[str, ...] | None = Field(
        None,
        description="The autocasts the recording's device computed natively "
        "(platform.native_autocast), the recipe's; None: recorded before this was kept, and "
        "the replay's recipe takes every autocast the space offers, as it did then.",
    )


class Landscape(LandscapeHeading):
    """Every configuration of ``space`` for one workload on one platform, measured."""

    memory_limit_bytes: int = Field(description="Feasible: peak memory at most this.")
    points: list[Point]

    def recipe_native_amp(self) -> tuple[str, ...]:
        """The autocasts the standard recipe may take on this landscape's device."""
        return AUTOCASTS if self.native_amp is None else self.native_amp

    @cached_property
    def _by_key(self) -> dict[str, Point]:
        return {p.config.key(): p for p in self.points}

    def lookup(self, config: TrainConfig) -> Point | None:
        return self._by_key.get(config.key())

    def feasible(self, point: Point) -> bool:
        return within_limit(point.status, point.memory_used_bytes, self.memory_limit_bytes)

    @cached_property
    def _optimum(self) -> Point | None:
        feasible = [p for p in self.points if self.feasible(p)]
        return max(feasible, key=lambda p: p.value or 0.0, default=None)

    def optimum(self) -> Point:
        if self._optimum is None:
            raise ValueError(f"no configuration of {self.workload} fits the memory limit")
        return self._optimum

    def ratio(self, config: TrainConfig | None) -> float:
        """The true value of ``config`` as a share of the optimum; 0 if it does not fit."""
        point = self.lookup(config) if config is not None else None
        if point is None or not self.feasible(point):
            return 0.0
        return (point.value or 0.0) / (self.optimum().value or 1.0)

    @cached_property
    def run_noise(self) -> float:
        """Run-to-run noise: the pooled relative standard deviation of the throughput of the
        configurations measured more than once (what one trial cannot see of its own).

        Only the repeats count, not a point's first run: the grid repeats the configurations
        whose first run was among the fastest, so that run is biased upward (the winner's
        curse), and counting it inflated the estimate 1.3-1.9x on the recorded landscapes."""
        deviations = []
        for point in self.points:
            speeds = [r.samples_per_s or 0.0 for r in point.ok_runs[1:]]
            if len(speeds) >= 2 and statistics.fmean(speeds) > 0:
                mean = statistics.fmean(speeds)
                deviations.append(statistics.variance(speeds) / mean**2)
        return math.sqrt(statistics.fmean(deviations)) if deviations else 0.0

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Landscape:
        return cls.model_validate_json(Path(path).read_text())
