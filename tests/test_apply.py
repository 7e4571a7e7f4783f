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
    "fsdp-bf16-ckpt-workers": {
        "parallel": "fsdp",
        "world_size": 2,
        "amp": "bf16",
        "checkpoint_segments": 2,
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
