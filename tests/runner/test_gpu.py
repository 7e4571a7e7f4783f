"""The same runner on CUDA: NCCL, CUDA memory accounting, CUDA OOM. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from autotune.config import make_config
from autotune.result import TrialResult
from autotune.runner.launch import run_trial
from autotune.runner.request import TrialOptions
from autotune.runner.workload import WorkloadSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.usefixtures("no_leftover_processes"),
]


def _trial(model: str, options: TrialOptions | None = None, **values: object) -> TrialResult:
    config = make_config({"global_batch_size": 16, "device": "cuda", **values})
    return run_trial(config, WorkloadSpec(model=model), options or TrialOptions(timeout_s=180))


def test_cuda_trial_reports_allocator_and_device_memory() -> None:
    result = _trial("workloads.gpt:gpt_tiny", amp="bf16", checkpoint_segments=2)
    assert result.status == "ok", result.message
    assert result.platform is not None and result.platform.device_type == "cuda"
    rank = result.ranks[0]
    assert rank.peak_memory_bytes > 0
    assert (
        rank.peak_reserved_bytes is not None and rank.peak_reserved_bytes >= rank.peak_memory_bytes
    )
    if rank.peak_device_used_bytes is not None:  # NVML present
        assert rank.peak_device_used_bytes >= rank.peak_reserved_bytes


def test_checkpointing_lowers_the_cuda_allocator_peak() -> None:
    plain = _trial("workloads.gpt:gpt_long_context", global_batch_size=8)
    checkpointed = _trial(
        "workloads.gpt:gpt_long_context", global_batch_size=8, checkpoint_segments=6
    )
    assert plain.ok and checkpointed.ok
    assert checkpointed.peak_memory_bytes < 0.7 * plain.peak_memory_bytes  # type: ignore[operator]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("hook", ["fp16", "bf16", "powersgd"])
def test_nccl_comm_hooks(hook: str) -> None:
    result = _trial("workloads.gpt:gpt_tiny", parallel="ddp", world_size=2, comm_hook=hook)
    assert result.status == "ok", result.message
    assert result.platform is not None and result.platform.backend == "nccl"


def test_cuda_oom_is_classified_as_oom() -> None:
    options = TrialOptions(timeout_s=180, memory_limit_bytes=256 << 20)
    result = _trial("workloads.gpt:gpt_long_context", options, global_batch_size=64)
    assert result.status == "oom", result.message
