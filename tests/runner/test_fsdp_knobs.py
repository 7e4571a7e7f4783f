"""FSDP2's reshard_after_forward reaches the blocks: with false, a block's parameters stay
gathered (whole tensors, not shards) from its forward to its backward. The memory that costs
is the memory model's to predict (tests/search/test_memory_model.py) and the allocator's to show
(tests/runner/test_gpu.py): on CPU, the resident peak hides it in the heap the build freed."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy
from torch.distributed.tensor import DTensor

from autotune.config import TrainConfig
from autotune.runner.training import HookCounter, wrap_model
from tests.fixtures.traced import WideBlocks


def _gathered_after_forward(reshard: bool) -> list[bool]:
    config = TrainConfig(
        global_batch_size=8, parallel="fsdp", world_size=1, device="cpu",
        reshard_after_forward=reshard,
    )  # fmt: skip
    model = wrap_model(WideBlocks(), config, torch.device("cpu"), HookCounter())
    model(torch.randn(2, 2048)).sum()  # forward only: backward has not come yet
    return [not isinstance(b[0].weight, DTensor) for b in model.blocks]  # type: ignore[union-attr]


@pytest.mark.usefixtures("one_rank_group")
def test_blocks_stay_gathered_until_backward_only_when_not_resharded() -> None:
    assert _gathered_after_forward(reshard=True) == [False] * 4
    assert _gathered_after_forward(reshard=False) == [True] * 4


def _step_dtypes(policy: str) -> tuple[torch.dtype, torch.dtype]:
    config = TrainConfig(
        global_batch_size=8, parallel="fsdp", world_size=1, device="cpu",
        fsdp_mixed_precision=policy,  # type: ignore[arg-type]
    )  # fmt: skip
    model = wrap_model(WideBlocks(), config, torch.device("cpu"), HookCounter())
    output = model(torch.randn(2, 2048))
    output.float().sum().backward()
    grad = model.blocks[0][0].weight.grad  # type: ignore[index]
    return output.dtype, grad.dtype


@pytest.mark.usefixtures("one_rank_group")
def test_the_mixed_precision_policy_computes_in_bf16_and_keeps_fp32_shards() -> None:
    assert _step_dtypes("off") == (torch.float32, torch.float32)
    assert _step_dtypes("bf16")[0] == torch.bfloat16
    assert _step_dtypes("bf16-reduce-fp32") == (torch.bfloat16, torch.float32)


def test_two_gloo_ranks_train_under_the_policy_with_offloaded_shards() -> None:
    from autotune.api import run_trial

    config = {
        "global_batch_size": 8, "parallel": "fsdp", "world_size": 2, "device": "cpu",
        "fsdp_mixed_precision": "bf16", "fsdp_cpu_offload": True, "grad_accum_steps": 2,
    }  # fmt: skip
    result = run_trial(
        "tests.fixtures.models:Small", config, warmup_steps=1, measured_steps=2, target_interval=0
    )
    assert result.status == "ok", result.message
    assert result.ranks[0].diagnostics is not None
    assert result.ranks[0].diagnostics.output_dtype == "bfloat16"


@pytest.mark.usefixtures("one_rank_group")
def test_cpu_offload_reaches_every_fully_sharded_module() -> None:
    config = TrainConfig(
        global_batch_size=8, parallel="fsdp", world_size=1, device="cpu", fsdp_cpu_offload=True
    )
    model = wrap_model(WideBlocks(), config, torch.device("cpu"), HookCounter())
    # FSDP2's parameter group keeps its policy under a private name: this pins where it is.
    groups = [m._get_fsdp_state()._fsdp_param_group for m in (*model.blocks, model)]
    policies = [g.offload_policy for g in groups if g is not None]
    # One per block; the root holds no parameters of its own here, so it has no group.
    assert len(policies) == 4 and all(isinstance(p, CPUOffloadPolicy) for p in policies)
    assert not any(p.pin_memory for p in policies)  # nothing to pin for on a CPU
    model(torch.randn(2, 2048)).sum().backward()  # and it trains
