"""What a search stores about each trial, and what it removed before searching: immutable values.

A ``TrialRecord`` is one trial of a study: measured (it ran, whatever its outcome) or not run at
all (skipped by the memory pre-check, a duplicate of an earlier trial, or invalid). A number
that was predicted rather than measured has its own field and is never shown as a measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.config import TrainConfig

_FROZEN = ConfigDict(frozen=True, extra="forbid")

Value = str | int | bool | None
"""One choice of a knob in a search space."""

Role = Literal["baseline", "search", "race", "remeasure", "verify"]
"""remeasure: what studies stored before the race replaced re-measurement; read, never written."""
RecordStatus = Literal[
    "ok", "pruned", "oom", "crashed", "timed_out", "error", "invalid", "skipped", "duplicate"
]
NOT_RUN: tuple[RecordStatus, ...] = ("skipped", "duplicate", "invalid")
"""Statuses of trials that never ran: they cost no measurement and count toward no budget."""

SEARCH_ROLES: tuple[Role, ...] = ("baseline", "search")
"""Roles whose measurements the trial budget counts (re-measurement and verification come
after the budget is spent)."""
PREDICTED_NOT_TO_FIT = "predicted not to fit"
"""How the message of a trial skipped for its predicted peak begins (``memory_gate``)."""


class Exclusion(BaseModel):
    """A choice removed from the space before the search, and why."""

    model_config = ConfigDict(frozen=True)

    knob: str
    value: Value
    reason: str


def exclusion_lines(exclusions: Sequence[Exclusion]) -> list[str]:
    """One ``knob=v1, v2: reason`` per knob and reason, in the order first excluded (five
    checkpoint counts the model cannot take are one line, not five)."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for e in exclusions:
        grouped.setdefault((e.knob, e.reason), []).append(str(e.value))
    return [f"{knob}={', '.join(values)}: {reason}" for (knob, reason), values in grouped.items()]


class TrialRecord(BaseModel):
    """One trial of a study, as stored: measured, failed, skipped or a duplicate."""

    model_config = _FROZEN

    number: int
    role: Role
    status: RecordStatus
    config: TrainConfig | None
    samples_per_s: float | None = None
    memory_used_bytes: int | None = Field(
        None,
        description="Measured: per-device peak on CUDA; all ranks' peaks together on CPU. "
        "None when nothing was measured.",
    )
    allocated_bytes: int | None = Field(
        None,
        description="CUDA: the caching allocator's peak of allocated memory (the largest "
        "rank's), under memory_used_bytes' reserved peak: what the traced tensors are held to. "
        "None on CPU and when nothing was measured.",
    )
    predicted_memory_bytes: int | None = Field(
        None,
        description="A prediction, made before the trial ran (or instead of running it), judged "
        "like memory_used_bytes; never a measurement.",
    )
    predicted_memory_source: str = Field(
        "", description="What predicted it: the fake-tensor trace and its calibration, or a fit."
    )
    feasible: bool | None = None
    samples_per_s_low: float | None = Field(None, description="95% interval of samples_per_s.")
    samples_per_s_high: float | None = None
    steady_samples_per_s: float | None = Field(
        None, description="Samples/s of the measured steps alone, without the epoch boundary."
    )
    step_time_drift: float | None = Field(
        None,
        description="Its step time rose or fell steadily over its steps: the last third's "
        "median over the first third's (None: level).",
    )
    data_wait_share: float | None = Field(
        None, description="Share of the measured time spent waiting for data (slowest rank)."
    )
    race_round: int | None = Field(None, description="The round of the race this run was in.")
    message: str = ""
    overhead_s: float = 0.0
    warmup_s: float = 0.0
    measured_s: float = 0.0
    compile_s: float | None = Field(None, description="torch.compile's one-time cost (in warm-up).")
    compiled_before: bool = Field(
        False, description="Its processes had compiled before it: compile_s is under a fresh run's."
    )

    @property
    def is_measurement(self) -> bool:
        """The trial ran and so cost time, whatever its outcome (ok, oom, crash, hang, error).

        The one definition used by the tuner's budget and de-duplication, the progress display
        and the benchmarks."""
        return self.config is not None and self.status not in NOT_RUN

    @property
    def counts_toward_budget(self) -> bool:
        """A measurement the trial budget counts: the baseline's and the search's."""
        return self.is_measurement and self.role in SEARCH_ROLES

    @property
    def prediction_error(self) -> float | None:
        """(measured - predicted) / measured of a trial that ran with a prediction: positive
        when the prediction was low."""
        measured, predicted = self.memory_used_bytes, self.predicted_memory_bytes
        if not measured or predicted is None or self.status != "ok":
            return None
        return (measured - predicted) / measured

    @property
    def prediction_miss(self) -> str | None:
        """``prediction_error`` in words, as every output says it: "19% low", "4% high"."""
        error = self.prediction_error
        if error is None:
            return None
        return f"{abs(error):.0%} {'low' if error > 0 else 'high'}"

    @property
    def fits(self) -> bool:
        """Measured ok with a peak under the memory limit."""
        return self.status == "ok" and bool(self.feasible)


def last_baseline(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The last baseline attempt, whatever its outcome (None before any)."""
    return next((r for r in reversed(records) if r.role == "baseline"), None)
