"""matmul_precision reaches the rank, and ``default`` restores the process's own setting even
in a process that ran a trial with another one before (a reused Ray rank)."""

from __future__ import annotations

import torch

from autotune.api import run_trial
from autotune.config import TrainConfig
from autotune.runner.session import set_matmul_precision
from tests.helpers import FEW


def test_default_restores_the_process_setting_after_another_trial() -> None:
    own = torch.get_float32_matmul_precision()
    try:
        set_matmul_precision(TrainConfig(global_batch_size=8, matmul_precision="high"))
        assert torch.get_float32_matmul_precision() == "high"
        set_matmul_precision(TrainConfig(global_batch_size=8))
        assert torch.get_float32_matmul_precision() == own
    finally:
        torch.set_float32_matmul_precision(own)


def test_the_setting_reaches_the_rank() -> None:
    config = {"global_batch_size": 8, "device": "cpu", "matmul_precision": "high"}
    result = run_trial("tests.fixtures.models:Small", config, **FEW)
    assert result.status == "ok", result.message
    assert result.ranks[0].diagnostics is not None
    assert result.ranks[0].diagnostics.matmul_precision == "high"
