"""Gradient hooks on a model's parameters (``autotune.runner.tensor_hooks``): where torch keeps
them (private, pinned here), that FSDP drops them (pinned on two gloo ranks: should FSDP keep
them, the refusal should go), and the refusal in one line before any trial."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from autotune.api import run_trial
from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.runner.session import leave_process_group
from autotune.runner.tensor_hooks import fsdp_drops_hooks, gradient_hooked
from autotune.runner.training import HookCounter, wrap_model
from autotune.search.refusals import fsdp_refusal
from tests.fixtures.hooked import CLIP, Clipped
from tests.helpers import on_two_gloo_ranks

FSDP = TrainConfig(global_batch_size=8, parallel="fsdp", world_size=2, device="cpu")


def test_torch_keeps_a_parameters_gradient_hooks_where_this_module_reads_them() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    assert gradient_hooked(model) == []
    model[1].bias.register_hook(lambda grad: grad * 2)
    model[0].weight.register_post_accumulate_grad_hook(lambda parameter: None)
    model[1].weight.register_hook(lambda grad: grad)
    model[1].weight.requires_grad_(False)  # frozen since: it never trains
    assert gradient_hooked(model) == ["0.weight", "1.bias"]
    # where a release keeps them elsewhere: unknown, not "none"
    bare = SimpleNamespace(named_parameters=lambda: [("w", SimpleNamespace(requires_grad=True))])
    assert gradient_hooked(bare) is None and fsdp_drops_hooks(bare) is None


def _clipped_rank(rank: int, store_path: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    torch.manual_seed(0)
    largest = {}
    for mode in ("ddp", "fsdp"):
        model = Clipped()
        if mode == "fsdp":
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
        else:
            model = torch.nn.parallel.DistributedDataParallel(model)
        x = torch.randn(8, 32) * 100
        model(x).logsumexp(-1).sum().backward()
        grads = [p.grad.full_tensor() if mode == "fsdp" else p.grad for p in model.parameters()]
        largest[mode] = max(float(g.abs().max()) for g in grads)
    if rank == 0:
        torch.save(largest, out)
    leave_process_group()


@pytest.mark.slow  # pins torch's behaviour on two ranks; the refusal is checked in process
def test_fsdp_trains_a_hooked_parameters_gradients_unhooked_and_ddp_does_not(
    tmp_path: object,
) -> None:
    largest = on_two_gloo_ranks(_clipped_rank, tmp_path)
    assert largest["ddp"] <= CLIP * 1.0001  # each rank's clipped gradient, averaged
    assert largest["fsdp"] > 100 * CLIP  # the hooks stayed on the parameters FSDP dropped


def test_fsdp_of_a_model_with_gradient_hooks_is_refused_in_one_line() -> None:
    said = fsdp_refusal("tests.fixtures.hooked:Clipped")
    assert said is not None
    assert "gradient hooks the model registers on them (blocks.0.weight, blocks.0.bias" in said
    assert "and 3 more" in said and "unclipped" in said
    with pytest.raises(ConfigError, match=r"^parallel=fsdp: FSDP replaces the parameters"):
        run_trial("tests.fixtures.hooked:Clipped", FSDP)
    # autotune.apply wraps a user's model as trials do: the same refusal, before any sharding
    with pytest.raises(ConfigError, match=r"use ddp or single$"):
        wrap_model(Clipped(), FSDP, torch.device("cpu"), HookCounter())
    assert fsdp_refusal("tests.fixtures.models:Small") is None
