"""Skip configurations that cannot fit, judging by what earlier trials measured.

The memory model (``autotune.search.memory_model``) predicts every configuration from the model
itself; these rules are the measured evidence beside it, and the fallback where the model
defeats its fake tensors. Two rules, both comparing only configurations that differ in knobs
whose effect on memory has a known direction (every other knob that moves memory the same):

- dominance: a configuration that needs at least as much memory as one that already ran out
  (micro-batch no smaller, no more checkpointing, no fewer DataLoader workers) cannot fit;
- trend: with two or more micro-batch sizes measured for the same checkpointing, peak memory is
  fitted as a line in the micro-batch size; a prediction above the limit plus a tolerance is
  skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config import CHECKPOINT_POLICIES, TrainConfig
from autotune.search.memory_model import MEMORY_FIELDS

TREND_TOLERANCE = 0.10


@dataclass(frozen=True)
class Observation:
    """What one trial showed about memory: its peak, or that it ran out."""

    config: TrainConfig
    peak_bytes: int | None  # None: out of memory
    trial_number: int


ORDERED = (
    "grad_accum_steps",
    "checkpoint_segments",
    "checkpoint_policy",
    "optimizer_in_backward",
    "num_workers",
)
"""The knobs the dominance rule compares by direction (the micro-batch through accumulation)."""
FAMILY = tuple(sorted(set(MEMORY_FIELDS) - set(ORDERED)))
"""Every other knob that moves memory must match: a configuration that offloads FSDP's shards,
or reshards after forward, is no hungrier than one that ran out without."""


def _family(config: TrainConfig) -> tuple[object, ...]:
    return tuple(getattr(config, name) for name in FAMILY)


def _at_least_as_hungry(candidate: TrainConfig, known: TrainConfig) -> bool:
    return (
        _family(candidate) == _family(known)
        and candidate.micro_batch_size >= known.micro_batch_size
        and _recomputes_no_more(candidate, known)
        # stepped in backward holds fewer gradients: one stepped after holds no less
        and (known.optimizer_in_backward or not candidate.optimizer_in_backward)
        and candidate.num_workers >= known.num_workers
        and (candidate.prefetch_factor or 0) >= (known.prefetch_factor or 0)
    )


def _recomputes_no_more(candidate: TrainConfig, known: TrainConfig) -> bool:
    """Whether ``candidate``'s checkpointing keeps at least what ``known``'s keeps: nothing
    checkpointed keeps everything; else no more blocks checkpointed, and a policy that keeps no
    less (selective keeps what full recomputes)."""
    if not candidate.checkpoint_segments:
        return True
    keeps = CHECKPOINT_POLICIES.index  # the least kept first
    return candidate.checkpoint_segments <= known.checkpoint_segments and keeps(
        candidate.checkpoint_policy
    ) >= keeps(known.checkpoint_policy)


def _fit(points: list[tuple[int, int]]) -> tuple[float, float] | None:
    sizes = {x for x, _ in points}
    if len(sizes) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var
    return mean_y - slope * mean_x, slope


def _family_points(candidate: TrainConfig, history: list[Observation]) -> list[tuple[int, int]]:
    """(micro-batch, peak) of the measured trials that differ from ``candidate`` in nothing
    that moves memory but the micro-batch."""
    return [
        (s.config.micro_batch_size, s.peak_bytes)
        for s in history
        if s.peak_bytes is not None
        and _family(s.config) == _family(candidate)
        and s.config.checkpoint_segments == candidate.checkpoint_segments
        and s.config.checkpoint_policy == candidate.checkpoint_policy
        and s.config.optimizer_in_backward == candidate.optimizer_in_backward
        and s.config.num_workers == candidate.num_workers
    ]


def measured_estimate(candidate: TrainConfig, history: list[Observation]) -> tuple[int, str] | None:
    """(peak, how it was estimated) of ``candidate`` from measured trials alone, for a model
    the memory model cannot trace: the median of earlier runs with its memory (a race run of
    it, say), else the trend's line over its family's micro-batch sizes; None when neither is
    at hand."""
    points = _family_points(candidate, history)
    same = sorted(y for x, y in points if x == candidate.micro_batch_size)
    if same:
        return same[len(same) // 2], f"measured trials: {len(same)} earlier run(s) of its memory"
    line = _fit(points)
    if line is None:
        return None
    predicted = int(line[0] + line[1] * candidate.micro_batch_size)
    return predicted, f"measured trials: a line over {len(points)} of its family by micro-batch"


def precheck(
    candidate: TrainConfig, history: list[Observation], limit_bytes: int, trend: bool = True
) -> tuple[str, float] | None:
    """(reason, estimated violation) if ``candidate`` cannot fit ``limit_bytes``, else None.
    ``trend=False`` keeps to dominance (when a better prediction than the trend is at hand)."""
    for seen in history:
        over = seen.peak_bytes is None or seen.peak_bytes > limit_bytes
        if over and _at_least_as_hungry(candidate, seen.config):
            what = "ran out of memory" if seen.peak_bytes is None else "exceeded the limit"
            violation = 1.0 if seen.peak_bytes is None else seen.peak_bytes / limit_bytes - 1
            return (
                f"needs at least the memory of trial {seen.trial_number}, which {what}",
                violation,
            )
    if not trend:
        return None
    points = _family_points(candidate, history)
    line = _fit(points)
    if line is not None:
        predicted = line[0] + line[1] * candidate.micro_batch_size
        if predicted > limit_bytes * (1 + TREND_TOLERANCE):
            return (
                f"predicted peak {predicted / 2**20:.0f} MiB (a fit over {len(points)} measured "
                f"trials of the same family) exceeds the limit {limit_bytes / 2**20:.0f} MiB",
                predicted / limit_bytes - 1,
            )
    return None
