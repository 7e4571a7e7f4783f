"""The benchmark of the optimizer stepped in backward: its rows and its paired ratio."""

from __future__ import annotations

import pytest

from autotune.bench.in_backward import StepRow, measure, paired_ratio
from autotune.runner.workload import WorkloadSpec


def test_the_ratio_is_paired_round_by_round() -> None:
    after = StepRow("m", False, 0, 1, 100, 100, 1.0, (1.0, 2.0, 1.0))
    during = StepRow("m", True, 0, 1, 90, 99, 1.1, (1.1, 2.2, 1.1))
    assert paired_ratio([after, during]) == pytest.approx((1.1, 1.1, 1.1))
    assert during.as_dict()["trace_error"] == pytest.approx(0.1)


def test_a_checkpointed_small_model_holds_less_stepped_in_backward_as_traced() -> None:
    # at micro-batch 1 with every block checkpointed the step's end is its peak
    rows = measure(WorkloadSpec(model="workloads.gpt:gpt_tiny"), 1, True, rounds=1, steps=1)
    after, during = rows
    assert not after.in_backward and during.in_backward and during.segments == 4
    assert during.real_bytes < 0.9 * after.real_bytes
    assert all(r.traced_bytes == pytest.approx(r.real_bytes, rel=0.001) for r in rows)
