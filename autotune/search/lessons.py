"""What earlier trials teach the search about the model on this machine."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from autotune.config import TrainConfig
from autotune.records import Exclusion, TrialRecord
from autotune.runner.outcome import (
    UNUSED_PARAMETERS_ERROR,
    is_peer_failure,
    unused_parameters_failure,
)
from autotune.runner.window import COMPILED_WARMUP, STEP_PHASES

__all__ = [
    "UNUSED_PARAMETERS_ERROR",
    "FailingValue",
    "accumulation_cut_memory",
    "failing_alike",
    "failing_values",
    "needs_unused_parameters",
]


ALIKE_FAILURES = 3
"""Failed trials, the baseline's among them, none run, one error: the step fails whatever the
configuration, and the search stops (``failing_alike``)."""
_STEPS = "|".join(map(re.escape, (COMPILED_WARMUP, *STEP_PHASES)))
_WHERE = re.compile(rf"^rank \d+: (?:(?:{_STEPS}) \d+(?: \([^)]*\))*: )?")


def _error(record: TrialRecord) -> str:
    """A failure's error, which rank and which step aside."""
    return _WHERE.sub("", record.message.splitlines()[0]) if record.message else ""


def _numbers_aside(error: str) -> str:
    """``error`` with its numbers blanked: sizes, shapes and versions that move with the
    configuration (an in-place edit of a buffer backward needs was "at version 3" under DDP,
    "at version 2" on one device and under FSDP: one error)."""
    return re.sub(r"\d+", "#", error)


def failing_alike(records: list[TrialRecord], parallel_modes: int) -> tuple[str, int] | None:
    """(the error the baseline failed with, how many trials failed with it), when no trial
    has run (fit or not) and at least ``ALIKE_FAILURES`` trials, the baseline's included,
    failed with it (which rank, which step and its numbers aside) across every parallel mode
    of the space (``parallel_modes`` of them) or at least two: not a value's failure, which
    ``failing_values`` learns from a neighbour that ran, but the step's own (a path the ranks
    cannot read, say), which would fail every trial left. Other failures beside it (the same
    error as a DataLoader worker words it) do not count either way. None otherwise."""
    measured = [r for r in records if r.counts_toward_budget and r.config is not None]
    baseline = next((r for r in measured if r.role == "baseline"), None)
    if baseline is None or any(r.status not in ("error", "crashed") for r in measured):
        return None
    error = _error(baseline)
    alike = [r for r in measured if _numbers_aside(_error(r)) == _numbers_aside(error)]
    modes = {r.config.parallel for r in alike if r.config is not None}
    if not error or len(alike) < ALIKE_FAILURES or len(modes) < min(2, parallel_modes):
        return None
    return error, len(alike)


def needs_unused_parameters(record: TrialRecord) -> bool:
    """Whether ``record`` is a DDP run without ``find_unused_parameters`` that failed because a
    step left some parameters without a gradient (an unused head, a conditional branch)."""
    return record.config is not None and unused_parameters_failure(record.config, record.message)


def accumulation_cut_memory(records: list[TrialRecord], baseline: TrialRecord) -> bool:
    """Whether doubling accumulation brought ``baseline``'s peak at least 5% under the baseline
    run before it (true when there is none to compare with). On CPU most of a rank's memory is
    the process itself, and accumulating further would spend the budget on baselines that
    cannot fit either."""
    assert baseline.config is not None
    half = baseline.config.grad_accum_steps // 2
    earlier = [
        r.memory_used_bytes
        for r in records
        if r.role == "baseline"
        and r.config is not None
        and r.config.grad_accum_steps == half
        and r.memory_used_bytes
    ]
    if not earlier or not baseline.memory_used_bytes:
        return True
    return baseline.memory_used_bytes < 0.95 * earlier[-1]


IMPLICATED = (
    ("_fused_", "optimizer_impl", "fused"),
    ("_foreach_", "optimizer_impl", "foreach"),
)
"""(text of an error, knob, value): an error naming an op of that implementation implicates
that value beside the knob that failed. Seen: FSDP with a fused SGD failed on
``aten._fused_sgd_.default does not have a sharding strategy registered`` (DTensor has none),
and the lesson excluded FSDP, which runs with SGD's default implementation."""


@dataclass(frozen=True)
class FailingValue:
    """A knob's value that made a trial fail where the configuration one knob away ran; with
    ``company``, only beside those other values, which the error names (``IMPLICATED``)."""

    knob: str
    value: Any
    failed: TrialRecord
    ran: TrialRecord
    company: tuple[tuple[str, Any], ...] = ()

    def matches(self, config: TrainConfig) -> bool:
        wanted = ((self.knob, self.value), *self.company)
        return all(getattr(config, knob) == value for knob, value in wanted)

    @property
    def label(self) -> str:
        """``knob=value``, and the company it fails in."""
        beside = " and ".join(f"{k}={v}" for k, v in self.company)
        return f"{self.knob}={self.value}" + (f" with {beside}" if beside else "")

    def reason(self) -> str:
        cause = self.failed.message.splitlines()[0] if self.failed.message else "no message"
        named = " (its error names the company it fails in)" if self.company else ""
        return (
            f"failed in trial {self.failed.number} ({cause[:160]}) "
            f"where trial {self.ran.number}, {self.knob}={getattr(self.ran.config, self.knob)} "
            f"and otherwise the same, ran{named}"
        )

    def exclusion(self) -> Exclusion:
        """The value as one of the recommendation's exclusions."""
        beside = self.label.removeprefix(f"{self.knob}={self.value}").strip()
        reason = f"{beside}: {self.reason()}" if beside else self.reason()
        return Exclusion(knob=self.knob, value=self.value, reason=reason)


def _one_knob_apart(a: TrainConfig, b: TrainConfig) -> str | None:
    """The one field ``a`` and ``b`` set differently, or None (none, or several)."""
    left, right = a.model_dump(), b.model_dump()
    differ = [name for name in left if left[name] != right[name]]
    return differ[0] if len(differ) == 1 else None


def failing_values(records: list[TrialRecord]) -> list[FailingValue]:
    """Knob values whose trial failed in its own code (an error or a crash, not a rank that
    only echoed another's failure, not DDP's unused parameters, which have their own lesson)
    while the configuration differing in that knob alone ran: the value, not the model or the
    machine, is the cause (bf16 autocast of an LSTM on a CPU without bf16 units: oneDNN has no
    such primitive), and every other configuration with it would fail the same way. A value that
    ran in some other configuration is not one of them."""
    failed = [
        r
        for r in records
        if r.status in ("error", "crashed")
        and r.config is not None
        and not is_peer_failure(r.message)
        and not needs_unused_parameters(r)
    ]
    ran = [r for r in records if r.status == "ok" and r.config is not None]
    found: dict[tuple[str, Any, tuple[tuple[str, Any], ...]], FailingValue] = {}
    for bad in failed:
        for good in ran:
            assert bad.config is not None and good.config is not None
            knob = _one_knob_apart(bad.config, good.config)
            if knob is None:
                continue
            value = getattr(bad.config, knob)
            company = tuple(
                (other, implicated)
                for text, other, implicated in IMPLICATED
                if other != knob
                and text in bad.message
                and getattr(bad.config, other) == implicated
            )
            failing = FailingValue(knob, value, bad, good, company)
            # a value that ran elsewhere fails only in company: the lesson would over-reach
            if not any(r.config is not None and failing.matches(r.config) for r in ran):
                found.setdefault((knob, value, company), failing)
    return list(found.values())
