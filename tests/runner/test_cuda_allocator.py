"""expandable_segments reaches the rank for every trial, on or off, so a reused rank does not
keep the previous trial's setting; the private calls it relies on are pinned here."""

from __future__ import annotations

import pytest
import torch

from autotune.config import make_config
from autotune.runner.cuda_allocator import apply_expandable_segments
from autotune.runner.rank import run_rank
from autotune.runner.request import TrialOptions, TrialRequest
from autotune.runner.workload import WorkloadCache, WorkloadSpec
from tests.helpers import FEW


def test_the_private_setter_and_getter_still_exist_and_round_trip() -> None:
    assert hasattr(torch._C, "_accelerator_setAllocatorSettings")
    assert apply_expandable_segments(True) == "expandable_segments:True"
    assert apply_expandable_segments(False) == "expandable_segments:False"


@pytest.mark.usefixtures("rank_in_this_process")
def test_a_reused_rank_sets_it_for_each_trial() -> None:
    workloads = WorkloadCache()  # one process, trial after trial, as a Ray rank actor
    options = TrialOptions(**FEW)
    seen = []
    for on in (True, False):
        config = make_config({"global_batch_size": 8, "device": "cpu", "expandable_segments": on})
        request = TrialRequest(
            config=config,
            workload=WorkloadSpec(model="tests.fixtures.models:Small"),
            options=options,
        )
        report = run_rank(request, 0, workloads=workloads)
        assert report.status == "ok", report.message
        assert report.diagnostics is not None
        seen.append(report.diagnostics.allocator_settings)
    assert seen == ["expandable_segments:True", "expandable_segments:False"]
