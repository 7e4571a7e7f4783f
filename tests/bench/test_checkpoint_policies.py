"""The checkpoint-policy benchmark's library: its rows and its paired ratio."""

from __future__ import annotations

import pytest

from autotune.bench.checkpoint_policies import POLICIES, PolicyRow, measure, paired_ratio
from autotune.runner.workload import WorkloadSpec


def _row(policy: str, rounds: tuple[float, ...]) -> PolicyRow:
    return PolicyRow(
        "m", policy, 2, 4, 100, 110, None, "h100", "cpu", "off", sorted(rounds)[1], rounds
    )


def test_the_ratio_is_paired_round_by_round() -> None:
    # a machine that slows down in round 3 slows every policy of it: the ratio stays 1.2
    rows = [_row("full", (1.0, 1.0, 2.0)), _row("selective", (1.2, 1.2, 2.4))]
    assert paired_ratio(rows, "selective", "full") == pytest.approx((1.2, 1.2, 1.2))
    assert rows[0].trace_error == pytest.approx(0.1)


def test_every_policy_of_a_small_model_is_measured_and_traced_as_it_runs() -> None:
    rows = measure(WorkloadSpec(model="workloads.gpt:gpt_tiny"), 4, rounds=1, steps=1)
    assert [r.policy for r in rows] == list(POLICIES)
    none, full, selective = rows
    assert none.segments == 0 and full.segments == selective.segments > 0
    assert full.real_bytes < selective.real_bytes < none.real_bytes
    assert all(r.traced_bytes == pytest.approx(r.real_bytes, rel=0.01) for r in rows)
    assert all(r.cuda_bf16_bytes for r in rows) and len(none.rounds_s) == 1
