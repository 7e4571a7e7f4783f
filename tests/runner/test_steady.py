"""A step that carries state to the next (a Transformer-XL's memory) grows for its first steps:
a trial measuring them is told its step time is not steady, and one whose warm-up outlasts the
growth is not."""

from __future__ import annotations

import pytest

from autotune.config import make_config
from autotune.report import format_trial
from autotune.runner.launch import run_trial
from autotune.runner.request import TrialOptions
from autotune.runner.workload import WorkloadSpec
from tests.fixtures.stateful import MEMORY, SEQUENCE

MODEL = WorkloadSpec(model="tests.fixtures.stateful:Remembering")
CONFIG = make_config({"global_batch_size": 16, "device": "cpu"})


def _trial(warmup_steps: int) -> tuple[float | None, str]:
    options = TrialOptions(warmup_steps=warmup_steps, measured_steps=30, target_interval=0)
    result = run_trial(CONFIG, MODEL, options)
    assert result.status == "ok", result.message
    return result.step_time_drift, format_trial(result)


# Slow tier: on a 2-core box the trend test reads this machine's own noise over 30 steps of
# about 15 ms, either way (CI runs saw a warm trial "fall to 0.71x" and "rise 1.5x", a cold one
# steady); a heavier fixture (attention over a 2,048-token memory) still rose 1.4x warm.
@pytest.mark.slow
def test_a_step_whose_memory_fills_is_not_steady_until_warm_up_outlasts_the_filling() -> None:
    filling = MEMORY // SEQUENCE  # steps until the memory holds all it keeps: 32
    # measured while the attended context grows 16x; the machine's noise can hide the rise in
    # one trial of 30 steps of about 7 ms (a slow-tier run, 2026-12-07: steps spread 90%, no
    # trend; the test alone passed twice after): one trial more, then it counts
    for _ in range(2):
        drift, said = _trial(warmup_steps=1)
        if drift is not None and drift >= 1.5:
            break
    assert drift is not None and drift >= 1.5, said
    assert "not steady    step time rose" in said and "raise --warmup-steps" in said
    # no rise left; a fall is this machine's own noise (a CI run on a 2-core box measured
    # "fell to 0.71x" here, its steps spread 47%), not the memory's filling. So is a rise of
    # 1.28x with steps spread 47% (a slow-tier run, 2026-11-30): one trial more, then it counts
    for _ in range(2):
        drift, said = _trial(warmup_steps=filling + 8)
        if drift is None or drift < 1.0:
            break
    assert drift is None or drift < 1.0, said
    assert "step time rose" not in said
