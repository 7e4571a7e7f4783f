"""autotune.apply in a user's own loop: 2 ranks under torchrun (gloo), real training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import mean

import pytest

from autotune.config import make_config, save_config

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

CONFIGS = {
    "ddp-fp16-hook-accum": {
        "parallel": "ddp",
        "world_size": 2,
        "comm_hook": "fp16",
        "grad_accum_steps": 2,
    },
    "fsdp-bf16-selective-ckpt-workers": {
        "parallel": "fsdp",
        "world_size": 2,
        "amp": "bf16",
        "checkpoint_segments": 2,
        "checkpoint_policy": "selective",
        "num_workers": 1,
    },
    "single-fp16-scaler": {"amp": "fp16"},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_user_loop_trains_under_torchrun(name: str, tmp_path: Path) -> None:
    values = CONFIGS[name]
    config = make_config({"global_batch_size": 32, "device": "cpu", **values})
    path = tmp_path / "best.yaml"
    save_config(config, path)
    steps = 40
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={config.processes}",
            "tests/fixtures/user_loop.py",
            "--config",
            str(path),
            "--steps",
            str(steps),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"},
    )
    assert process.returncode == 0, process.stderr[-3000:]
    result = json.loads(process.stdout.strip().splitlines()[-1])
    losses = result["losses"]
    assert mean(losses[-5:]) < 0.7 * mean(losses[:5]), losses
    assert result["optimizer_steps"] == steps
    assert result["micro_steps"] == steps * config.grad_accum_steps
    if config.comm_hook == "fp16":
        assert result["hook_calls"] >= steps  # once per bucket, on synced micro-steps only
        assert result["hook_calls"] % steps == 0


def test_apply_trains_on_a_stream_that_shards_itself() -> None:
    from autotune.apply import prepare
    from autotune.config import TrainConfig
    from tests.fixtures.models import Small
    from tests.fixtures.streams import ShardedStream

    config = TrainConfig(global_batch_size=8, device="cpu")
    training = prepare(config, Small(), ShardedStream())
    assert training.sampler is None and training.batches_per_epoch is None
    batches = training.batches()
    losses = [training.step(batches).loss for _ in range(3)]
    assert all(loss == loss for loss in losses)  # finite, not NaN
    training.close()


@pytest.mark.usefixtures("one_rank_group")
def test_apply_gives_a_lazy_model_its_shapes_before_ddp_wraps_it() -> None:
    from autotune.apply import prepare
    from autotune.config import TrainConfig
    from tests.fixtures.lazy import LazyMLP, Rows

    config = TrainConfig(global_batch_size=8, parallel="ddp", world_size=1, device="cpu")
    training = prepare(config, LazyMLP(), Rows())
    batches = training.batches()
    losses = [training.step(batches).loss for _ in range(2)]
    assert all(loss == loss for loss in losses)  # finite, not NaN
    training.close()


def _checkpointing_rank(rank: int, store_path: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.utils.data import TensorDataset

    from autotune.apply import prepare
    from autotune.config import TrainConfig
    from autotune.runner.session import leave_process_group
    from tests.fixtures.traced import Stack

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    config = TrainConfig(
        global_batch_size=8, parallel="fsdp", world_size=2, checkpoint_segments=2, device="cpu"
    )
    data = TensorDataset(torch.randn(64, 256), torch.randn(64, 256))
    torch.manual_seed(0)
    training = prepare(config, Stack(), data)
    batches = training.batches()
    for _ in range(2):
        training.step(batches)
    state = training.state_dict()  # a collective: every rank
    torch.manual_seed(1)  # other weights, a fresh optimizer
    resumed = prepare(config, Stack(), data)
    resumed.load_state_dict(state)
    if rank == 0:
        torch.save({"state": state, "again": resumed.state_dict()}, out)
    else:
        resumed.state_dict()
    leave_process_group()


def _equal(one: dict, other: dict) -> bool:
    import torch

    return one.keys() == other.keys() and all(
        _equal(a, other[k]) if isinstance(a, dict) else torch.equal(a, other[k])
        for k, a in one.items()
        if isinstance(a, (dict, torch.Tensor))
    )


def test_a_checkpoint_of_fsdp_training_loads_into_the_plain_model_and_resumes(
    tmp_path: Path,
) -> None:
    # training.model.state_dict() held DTensor shards under FSDP, keys under DDP's "module."
    # and compile's "_orig_mod.": nothing a user's own model loads.
    import torch
    from torch.utils.data import TensorDataset

    from autotune.apply import prepare
    from autotune.config import TrainConfig
    from tests.fixtures.traced import Stack
    from tests.helpers import on_two_gloo_ranks

    result = on_two_gloo_ranks(_checkpointing_rank, tmp_path)
    state, again = result["state"], result["again"]
    assert sorted(state) == ["model", "optimizer"]
    plain = Stack()
    plain.load_state_dict(state["model"])  # keys and full tensors as the model's own
    assert all(type(t) is torch.Tensor for t in state["model"].values())
    assert _equal(state["model"], again["model"])  # resumed on two ranks, sharded again
    assert _equal(state["optimizer"]["state"], again["optimizer"]["state"])
    # and resumed under another configuration: one process, compiled, fp16 with its scaler
    config = TrainConfig(global_batch_size=8, compile="default", amp="fp16", device="cpu")
    data = TensorDataset(torch.randn(64, 256), torch.randn(64, 256))
    single = prepare(config, Stack(), data)
    single.load_state_dict(state)
    mine = single.state_dict()
    assert _equal(state["model"], mine["model"]) and "scaler" in mine
    assert _equal(state["optimizer"]["state"], mine["optimizer"]["state"])
    single.close()


def test_a_lightning_modules_checkpoint_has_its_own_keys() -> None:
    from autotune.apply import prepare
    from autotune.config import TrainConfig
    from tests.fixtures.lit import Classifier, autotune_dataset

    config = TrainConfig(global_batch_size=8, device="cpu")
    training = prepare(config, Classifier(), autotune_dataset(None))
    training.step(training.batches())
    state = training.state_dict()
    assert sorted(state["model"]) == sorted(Classifier().state_dict())
    assert state["optimizer"]["param_groups"][0]["params"][0] == "net.0.weight"
    training.load_state_dict(state)  # its prefix put back
    training.close()


def test_a_checkpoint_of_training_stepped_in_backward_holds_its_optimizers_state() -> None:
    # the per-parameter optimizers keep their state in the optimizer's: a checkpoint saves it,
    # the same as stepping after backward made, and loads it back into either
    import torch
    from torch.utils.data import TensorDataset

    from autotune.apply import prepare
    from autotune.config import TrainConfig
    from tests.fixtures.traced import Stack

    data = TensorDataset(torch.randn(64, 256), torch.randn(64, 256))

    def trained(in_backward: bool) -> dict:
        config = TrainConfig(global_batch_size=8, device="cpu", optimizer_in_backward=in_backward)
        torch.manual_seed(0)
        training = prepare(config, Stack(), data)
        batches = training.batches()
        for _ in range(2):
            training.step(batches)
        state = training.state_dict()
        training.close()
        return state

    after, during = trained(False), trained(True)
    assert during["optimizer"]["state"] and _equal(after["optimizer"], during["optimizer"])
    assert _equal(after["model"], during["model"])
    config = TrainConfig(global_batch_size=8, device="cpu", optimizer_in_backward=True)
    torch.manual_seed(1)
    resumed = prepare(config, Stack(), data)
    resumed.load_state_dict(after)
    assert _equal(resumed.state_dict()["optimizer"]["state"], after["optimizer"]["state"])
    resumed.close()
