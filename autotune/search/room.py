"""Room for a finalist that went over the memory limit in the race.

A configuration whose search trial fitted can measure over the limit in a later run: its peak
moves by a few percent from run to run, and a search of a model that barely fits finds its
fastest configurations right at the limit. Where that happens to every finalist, the search
does not end without a recommendation: each finalist is taken to persistent DataLoader workers,
else to its optimizer stepped in backward, else the least larger gradient accumulation (a
smaller micro-batch: the global batch, and so the training, unchanged), else the least larger
count of checkpointed blocks, else compiling off, whose peak is expected to leave room, and
those race in its place.

Expected from what was measured: the finalist's largest measured peak less what the move is
predicted to save (the memory model's prediction of the two configurations, whose error
largely cancels in the difference), and it must lie below the limit by the spread of the
finalist's own measured peaks (a configuration expected just under the limit goes over as
often as not: seen in a search of a small GPT at 520 MiB, two moved finalists expected 1 MiB
under the limit measured 3 and 15 MiB over it). Without a prediction (the model is off, or the
fake tensors cannot trace it) the first larger value is taken, and the race's runs show
whether it fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config import TrainConfig
from autotune.records import TrialRecord
from autotune.search import race

ROOM_KNOBS = (
    "persistent_workers",
    "optimizer_in_backward",
    "grad_accum_steps",
    "checkpoint_policy",
    "checkpoint_segments",
    "compile",
)
"""The knobs a finalist moves along to make room, in turn: none changes the training's
semantics or numerics. Persistent DataLoader workers first, where it has workers that are not:
they cost no speed (an epoch no longer restarts them), and on CPU a worker forked again at
every epoch keeps old copies of its rank's whole step (``MemoryModel.forked``; on a GPU the
prediction says the move saves no device memory). Then the optimizer stepped in backward, where
the finalist can (one device, no accumulation): the same updates, without every gradient held
at once at the step's end. Then accumulation (it costs the least when a
step's micro-batch still fills the device), then selective checkpointing made full (the same
blocks, every op recomputed), then more blocks checkpointed, then, for a compiled finalist,
compiling off: on CPU a compiled rank holds Inductor's modules and caches (53-88 MiB a rank
here), and on a GPU, where compiling can hold less, the prediction says the move saves
nothing."""


@dataclass(frozen=True)
class Room:
    """A finalist that went over the limit, and the configuration that races in its place."""

    finalist: TrainConfig
    config: TrainConfig
    peak_bytes: int
    """The finalist's largest measured peak."""
    spread: float
    """How far its measured peaks lay apart, as a share of the largest: the room kept."""
    expected_bytes: int | None
    """The peak expected of ``config``: ``peak_bytes`` less the predicted saving (None: nothing
    predicted)."""

    def describe(self) -> str:
        moved = ", ".join(
            f"{knob} {getattr(self.finalist, knob)} -> {getattr(self.config, knob)}"
            for knob in ROOM_KNOBS
            if getattr(self.finalist, knob) != getattr(self.config, knob)
        )
        expected = (
            f"~{self.expected_bytes / 2**20:,.0f} MiB expected: its peak less the predicted "
            f"saving, {self.spread:.1%} (its peaks' spread) or more under the limit"
            if self.expected_bytes is not None
            else "nothing predicted: the race shows it"
        )
        return (
            f"{self.finalist.summary()} (measured up to {self.peak_bytes / 2**20:,.0f} MiB) "
            f"with {moved} ({expected})"
        )


def over_in_race(records: Sequence[TrialRecord], config: TrainConfig) -> bool:
    """``config`` left the race for memory alone: a race run measured over the limit or ran
    out of memory, and none failed otherwise."""
    runs = race.race_runs(records, config).values()
    over = [r for r in runs if r.status == "oom" or (r.status == "ok" and not r.feasible)]
    return bool(over) and all(r.status in ("ok", "oom") for r in runs)


def peaks(records: Sequence[TrialRecord], config: TrainConfig) -> list[int]:
    """Every peak measured of ``config``."""
    key = config.key()
    return [
        r.memory_used_bytes
        for r in records
        if r.config and r.config.key() == key and r.memory_used_bytes
    ]


def peaks_spread(records: Sequence[TrialRecord], config: TrainConfig) -> float:
    """How far ``config``'s measured peaks lie apart, as a share of the largest."""
    measured = peaks(records, config)
    return (max(measured) - min(measured)) / max(measured) if measured else 0.0


def no_room(records: Sequence[TrialRecord], finalists: Sequence[TrainConfig]) -> str:
    """Why none of ``finalists`` (all over the limit in the race) raced again, for the error."""
    spreads = ", ".join(f"{peaks_spread(records, c):.1%}" for c in finalists)
    return (
        "; no larger accumulation or checkpointing of the space (nor persistent workers or "
        "compiling off) is "
        "expected to fit under the limit by the spread of the finalists' own peaks "
        f"({spreads}): raise --memory-budget, or allow larger values of grad_accum_steps or "
        "checkpoint_segments"
    )


def make_room(
    finalist: TrainConfig,
    records: Sequence[TrialRecord],
    choices: dict[str, list[Any]],
    predict: Callable[[TrainConfig], int | None],
    limit_bytes: int,
) -> Room | None:
    """``finalist`` at the least larger value of a ``ROOM_KNOBS`` knob (of the space's
    ``choices``) whose peak is expected under ``limit_bytes`` by the spread of the finalist's
    measured peaks, not measured over it already; None where no such value is in the space.
    ``predict`` gives a configuration's predicted peak (None: nothing predicted)."""
    peak = max(peaks(records, finalist), default=0)
    spread = peaks_spread(records, finalist)
    before = predict(finalist)
    measured = {r.config.key(): r for r in records if r.config and r.is_measurement}
    for knob, value in _moves(finalist, choices):
        try:
            config = TrainConfig(**{**finalist.model_dump(), knob: value})
        except ValueError:  # e.g. accumulation with DDP's static graph
            continue
        seen = measured.get(config.key())
        if seen is not None and not seen.fits:
            continue
        after = predict(config)
        expected = peak - (before - after) if before and after else None
        if expected is None or expected <= limit_bytes * (1 - spread):
            return Room(finalist, config, peak, spread, expected)
    return None


def _moves(finalist: TrainConfig, choices: dict[str, list[Any]]) -> Iterator[tuple[str, Any]]:
    """The values ``make_room`` tries, in ``ROOM_KNOBS``'s order, each the least first."""
    workers = finalist.num_workers and not finalist.persistent_workers
    if workers and True in choices.get("persistent_workers", ()):
        yield "persistent_workers", True
    if not finalist.optimizer_in_backward and True in choices.get("optimizer_in_backward", ()):
        yield "optimizer_in_backward", True  # refused where it cannot (TrainConfig)
    for knob in ("grad_accum_steps", "checkpoint_segments"):
        now = getattr(finalist, knob)
        yield from ((knob, c) for c in sorted(
            c for c in choices.get(knob, ()) if isinstance(c, int) and c > now
        ))  # fmt: skip
        selective = finalist.checkpoint_policy == "selective"
        if (
            knob == "grad_accum_steps"
            and selective
            and "full" in choices.get("checkpoint_policy", ())
        ):
            yield "checkpoint_policy", "full"  # the same blocks, keeping less
    if finalist.compile != "off" and "off" in choices.get("compile", ()):
        yield "compile", "off"
