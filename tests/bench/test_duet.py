"""Duet benchmarking's pieces: a trial pinned to one core, both of a round at once, and the
comparison with sequential rounds."""

from __future__ import annotations

import os

import pytest

from autotune.bench import duet
from autotune.config import make_config
from autotune.runner.workload import WorkloadSpec

pytestmark = pytest.mark.skipif(
    duet.cores_for_duet() is not None, reason=str(duet.cores_for_duet())
)


def _request(workers: int = 0):
    config = make_config(
        {"global_batch_size": 16, "parallel": "single", "device": "cpu", "num_workers": workers}
    )
    return duet.request_of(config, WorkloadSpec(model="tests.fixtures.models:Small"), 0.2, 2)


@pytest.mark.slow  # a benchmark's pinned trial
def test_a_pinned_trial_runs_on_its_core_alone_and_leaves_the_caller_unpinned() -> None:
    before = os.sched_getaffinity(0)
    result = duet.run_pinned(_request(), {1})
    assert result.status == "ok", result.message
    assert result.ranks[0].torch_threads == 1  # the rank saw one core
    assert os.sched_getaffinity(0) == before  # only the launching thread was pinned


@pytest.mark.slow
def test_a_duet_round_measures_both_and_a_sequential_one_too() -> None:
    a, b = _request(), _request()
    both = duet.measure_round(a, b, duet=True, number=0)
    one_by_one = duet.measure_round(a, b, duet=False, number=1)
    for round_ in (both, one_by_one):
        assert round_["log_ratio"] == pytest.approx(round_["log_b"] - round_["log_a"])
        assert round_["wall_s"] > 0
    assert both["a_first"] is True and one_by_one["a_first"] is False


def test_the_summary_says_how_much_less_error_the_duet_leaves() -> None:
    rows = {
        "sequential": {"se_after_minute": 0.08, "ratio_sd": 0.2},
        "duet": {"se_after_minute": 0.02, "ratio_sd": 0.1},
    }
    summary = duet.summary_of(rows)
    assert summary["se_ratio_sequential_over_duet"] == pytest.approx(4.0)
    assert summary["ratio_sd_sequential_over_duet"] == pytest.approx(2.0)
    assert duet.summary_of({"duet": rows["duet"]}) == {}
