"""Ending a hopeless step from outside: when an executor may, and what the trial then reports
(no processes: the executors' own runs are in test_executor_contract.py)."""

from __future__ import annotations

import pytest

from autotune.config import make_config
from autotune.result import RankReport
from autotune.runner.executor import CUT_FLOOR_S, cut_reason, cut_report
from autotune.runner.outcome import assemble_result
from autotune.runner.request import TrialOptions, TrialRequest
from autotune.runner.workload import WorkloadSpec


def _request(prune_below: float | None) -> TrialRequest:
    return TrialRequest(
        config=make_config({"global_batch_size": 32, "device": "cpu"}),
        workload=WorkloadSpec(model="tests.fixtures.models:Small"),
        options=TrialOptions(prune_below_samples_per_s=prune_below),
    )


def test_a_step_is_cut_only_past_the_limit_and_past_what_a_restart_costs() -> None:
    request = _request(100.0)  # a step at the line takes 0.32 s: the limit is 3.2 s
    assert cut_reason(request, "warm-up step 1", 3.0) is None  # the rule may still pass it
    assert cut_reason(request, "warm-up step 1", 3.3) is not None
    # fresh ranks would take 5 s: waiting that long first bounds what a wrong cut loses
    assert cut_reason(request, "warm-up step 1", 4.9, restart_s=5.0) is None
    assert cut_reason(request, "warm-up step 1", 5.1, restart_s=5.0) is not None
    assert cut_reason(request, "compiling (first step)", 60.0) is None
    assert cut_reason(_request(None), "measured step 3", 60.0) is None  # nothing to prune against


def test_a_short_step_over_a_tiny_limit_is_left_to_end_by_itself() -> None:
    request = _request(1e9)  # the limit is a fraction of a microsecond
    assert cut_reason(request, "measured step 2", CUT_FLOOR_S * 0.9) is None
    assert cut_reason(request, "measured step 2", CUT_FLOOR_S * 1.1) is not None


def test_a_cut_trial_is_pruned_with_its_step_so_far_as_an_upper_bound() -> None:
    request = _request(100.0)
    why = cut_reason(request, "measured step 2", 4.0)
    assert why is not None
    reports = [cut_report(0, why, 4.0), cut_report(1, why, 4.0)]
    result = assemble_result(request, None, reports, launch_s=0.1, total_s=6.0)
    assert result.status == "pruned"
    assert result.samples_per_s == pytest.approx(32 / 4.0)  # at most: the step is not over
    assert result.message.startswith("measured step 2 still running after 4 s")
    assert result.message.endswith("at most 8.0 samples/s")
    assert result.peak_memory_bytes is None and result.measured_steps == 0  # never read


def test_a_crash_beside_a_cut_is_still_the_root_cause() -> None:
    request = _request(100.0)
    why = cut_reason(request, "measured step 2", 4.0)
    assert why is not None
    crash = RankReport(rank=1, status="crashed", message="killed by SIGABRT")
    result = assemble_result(request, None, [cut_report(0, why, 4.0), crash], launch_s=0, total_s=5)
    assert result.status == "crashed" and "SIGABRT" in result.message
