"""What earlier trials teach the search about the model on this machine."""

from __future__ import annotations

from autotune.records import TrialRecord
from autotune.runner.outcome import UNUSED_PARAMETERS_ERROR, unused_parameters_failure

__all__ = ["UNUSED_PARAMETERS_ERROR", "accumulation_cut_memory", "needs_unused_parameters"]


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
