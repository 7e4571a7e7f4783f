"""SyncBatchNorm on a CPU: torch synchronises batch norms across ranks on GPUs only, so a model
converted for a GPU recipe (``convert_sync_batchnorm``) cannot run DDP or FSDP here. Pinned on
this torch (should it learn to, these fail and the refusal should go), and refused before any
trial on a CPU, never on CUDA."""

from __future__ import annotations

import pytest

from autotune.api import run_trial
from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.runner.launch import run_trial as launch
from autotune.runner.request import TrialOptions
from autotune.runner.workload import WorkloadSpec
from autotune.search.refusals import model_refusals
from tests.helpers import FEW

MODEL = "tests.fixtures.synced:synced"


FAILS_WITH = [("ddp", "SyncBatchNorm layers only work with GPU modules"),
              ("fsdp", "SyncBatchNorm expected input tensor to be on GPU")]  # fmt: skip


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_ranks_of_sync_batch_norms_are_refused_on_a_cpu_before_any_trial(parallel: str) -> None:
    config = TrainConfig(global_batch_size=8, parallel=parallel, world_size=2, device="cpu")
    with pytest.raises(ConfigError, match=rf"^parallel={parallel}: torch synchronises batch norm"):
        run_trial(MODEL, config)
    (refusal,) = [r for r in model_refusals(MODEL) if r.value == parallel]
    assert "1.norm, 2.norm, 3.norm are SyncBatchNorm" in refusal.reason
    assert refusal.holds("cpu") and not refusal.holds("cuda")  # on CUDA they train


@pytest.mark.slow  # ~6 s a case: pins torch's behaviour behind the refusal above
@pytest.mark.parametrize(("parallel", "says"), FAILS_WITH)
def test_ranks_of_sync_batch_norms_fail_on_a_cpu(parallel: str, says: str) -> None:
    config = TrainConfig(global_batch_size=8, parallel=parallel, world_size=2, device="cpu")
    options = TrialOptions(**FEW)
    result = launch(config, WorkloadSpec(model=MODEL), options)  # past the refusal
    assert result.status == "error" and says in result.message, result.message
