"""Every export parses back, and is constructed for real where its library is installed."""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.config import TrainConfig, load_config, make_config
from autotune.export import notes_for, render
from autotune.recommendation import Recommendation
from autotune.runner.platform import detect_platform

HOOKED = {
    "parallel": "ddp",
    "world_size": 2,
    "comm_hook": "powersgd",
    "amp": "bf16",
    "grad_accum_steps": 2,
    "checkpoint_segments": 2,
    "num_workers": 2,
    "prefetch_factor": 4,
    "persistent_workers": True,
}
SHARDED = {"parallel": "fsdp", "world_size": 2, "amp": "fp16", "checkpoint_segments": 1}


def _recommendation(values: dict[str, Any]) -> Recommendation:
    config = make_config({"global_batch_size": 32, "device": "cpu", **values})
    return Recommendation(
        config=config,
        samples_per_s=100.0,
        samples_per_s_runs=[100.0],
        spread=0.0,
        memory_used_bytes=1 << 30,
        memory_budget_bytes=4 << 30,
        memory_limit_bytes=3 << 30,
        platform=detect_platform("cpu"),
        storage="autotune.db",
        study_name="s",
        block_class="Block",
    )


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("values", [HOOKED, SHARDED, {}])
def test_yaml_and_json_load_back_as_the_same_config(values: dict, tmp_path: Path) -> None:
    recommendation = _recommendation(values)
    for fmt in ("yaml", "json"):
        path = tmp_path / f"best.{fmt}"
        path.write_text(render(recommendation, fmt))
        assert load_config(path) == recommendation.config
    assert json.loads(render(recommendation, "json"))["global_batch_size"] == 32


def test_torchrun_command_matches_the_config() -> None:
    assert "torchrun --standalone --nnodes=1 --nproc-per-node=2 train.py" in render(
        _recommendation(HOOKED), "torchrun"
    )
    assert (
        render(_recommendation({}), "torchrun", script="t.py")
        .strip()
        .endswith("python t.py --config autotune-best.yaml")
    )


def test_hugging_face_arguments_and_what_they_cannot_say(tmp_path: Path) -> None:
    recommendation = _recommendation(HOOKED)
    kwargs = yaml.safe_load(render(recommendation, "hf"))
    assert kwargs["per_device_train_batch_size"] == 8
    assert kwargs["gradient_accumulation_steps"] == 2
    assert kwargs["bf16"] is True and kwargs["fp16"] is False
    assert kwargs["dataloader_num_workers"] == 2 and kwargs["dataloader_prefetch_factor"] == 4
    assert kwargs["gradient_checkpointing"] is True
    notes = notes_for(recommendation, "hf")
    assert any("comm_hook=powersgd cannot be set in TrainingArguments" in n for n in notes)
    assert "# note: comm_hook=powersgd" in render(recommendation, "hf")
    if not _installed("transformers"):
        pytest.skip("transformers is not installed: TrainingArguments not constructed")
    from transformers import TrainingArguments

    kwargs.pop("bf16")  # bf16 needs hardware support that a CPU test machine may lack
    args = TrainingArguments(output_dir=str(tmp_path), **kwargs)
    assert args.gradient_accumulation_steps == 2


@pytest.mark.parametrize("values", [HOOKED, SHARDED])
def test_lightning_arguments(values: dict) -> None:
    recommendation = _recommendation(values)
    data = yaml.safe_load(render(recommendation, "lightning"))
    trainer, loader = data["trainer"], data["dataloader"]
    config: TrainConfig = recommendation.config
    assert trainer["accumulate_grad_batches"] == config.grad_accum_steps
    assert trainer["devices"] == 2
    assert loader["batch_size"] == config.micro_batch_size
    if config.amp == "fp16":  # Lightning swaps fp16 for bf16 on CPU: the export says so
        assert trainer["precision"] == "bf16-mixed"
        assert any("fp16 AMP on CPU" in n for n in notes_for(recommendation, "lightning"))
    if config.parallel == "fsdp":
        assert trainer["strategy"] == "ddp"  # Lightning's FSDP needs GPUs; this is on CPU
        assert any("FSDP on GPUs only" in n for n in notes_for(recommendation, "lightning"))
    if config.comm_hook == "powersgd":
        strategy = trainer["strategy"]
        assert strategy["init_args"]["ddp_comm_hook"].endswith("powerSGD_hook.powerSGD_hook")
        assert (
            strategy["init_args"]["ddp_comm_state"]["init_args"]["matrix_approximation_rank"]
            == config.powersgd_rank
        )
    if not _installed("lightning"):
        pytest.skip("lightning is not installed: Trainer not constructed")
    from lightning.pytorch import Trainer

    kwargs = dict(trainer)
    if isinstance(kwargs["strategy"], dict):
        kwargs["strategy"] = _instantiate(kwargs["strategy"])
    Trainer(**kwargs, logger=False, enable_checkpointing=False)


def _instantiate(spec: dict[str, Any]) -> Any:
    """What LightningCLI does with a class_path / init_args mapping."""
    module, _, name = spec["class_path"].rpartition(".")
    args = {}
    for key, value in spec.get("init_args", {}).items():
        if isinstance(value, dict) and "class_path" in value:
            value = _instantiate(value)
        elif isinstance(value, str) and value.startswith("torch."):
            owner, _, attr = value.rpartition(".")
            value = getattr(importlib.import_module(owner), attr)
        args[key] = value
    return getattr(importlib.import_module(module), name)(**args)


def test_accelerate_config(tmp_path: Path) -> None:
    recommendation = _recommendation(SHARDED)
    data = yaml.safe_load(render(recommendation, "accelerate"))
    assert data["distributed_type"] == "FSDP" and data["num_processes"] == 2
    assert data["mixed_precision"] == "fp16"
    assert data["fsdp_config"]["fsdp_activation_checkpointing"] is True
    assert data["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "Block"
    notes = notes_for(recommendation, "accelerate")
    assert any("gradient_accumulation_steps=1" in n for n in notes)
    hooked = yaml.safe_load(render(_recommendation(HOOKED), "accelerate"))
    assert hooked["distributed_type"] == "MULTI_CPU"
    assert any(
        "DDPCommunicationHookType.POWERSGD" in n
        for n in notes_for(_recommendation(HOOKED), "accelerate")
    )
    if not _installed("accelerate"):
        pytest.skip("accelerate is not installed: its config loader not run")
    from accelerate.commands.config.config_args import load_config_from_file

    path = tmp_path / "accelerate.yaml"
    path.write_text(render(recommendation, "accelerate"))
    loaded = load_config_from_file(str(path))
    assert loaded.num_processes == 2
