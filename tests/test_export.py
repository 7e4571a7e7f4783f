"""Every export parses back, and is constructed for real where its library is installed."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
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


def test_hugging_face_checkpointing_where_the_class_refuses_it(tmp_path: Path) -> None:
    """ConvNeXt has no gradient checkpointing of its own: the Trainer's flag raises, so the
    export leaves it false and checkpoints in code, and the Trainer then trains."""
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainingArguments

    from autotune.runner.checkpointing import apply_checkpointing
    from autotune.search.model_facts import refuses_own_checkpointing
    from tests.fixtures import hf_zoo

    refused = refuses_own_checkpointing("tests.fixtures.hf_zoo:convnext")
    assert refused == "ConvNextForImageClassification"
    assert refuses_own_checkpointing("tests.fixtures.hf_zoo:gpt2") is None
    recommendation = _recommendation({"checkpoint_segments": 1}).model_copy(
        update={"checkpointing_refused_by": refused}
    )
    kwargs = yaml.safe_load(render(recommendation, "hf"))
    assert kwargs["gradient_checkpointing"] is False
    notes = notes_for(recommendation, "hf")
    assert any(
        "ConvNextForImageClassification refuses" in n and "apply_checkpointing(model, 1)" in n
        for n in notes
    )
    assert not any("checkpoints every layer" in n for n in notes)
    assert yaml.safe_load(render(_recommendation({"checkpoint_segments": 1}), "hf"))[
        "gradient_checkpointing"
    ]  # where the class is not known to refuse, the Trainer's flag stays

    common = {"output_dir": str(tmp_path), "max_steps": 1, "report_to": [], "save_strategy": "no"}
    data = hf_zoo.data_convnext()
    flagged = TrainingArguments(**common, **{**kwargs, "gradient_checkpointing": True})
    # transformers 5.25's wording; 5.17's (the lent GPU machines') says "gradient checkpointing"
    with pytest.raises(ValueError, match=r"does not support (activation|gradient) checkpointing"):
        Trainer(model=hf_zoo.convnext(), args=flagged, train_dataset=data).train()
    model = hf_zoo.convnext()
    assert len(apply_checkpointing(model, 1)) == 1  # the note's call
    trainer = Trainer(model=model, args=TrainingArguments(**common, **kwargs), train_dataset=data)
    assert trainer.train().training_loss > 0


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
    hooked_notes = " ".join(notes_for(_recommendation(HOOKED), "accelerate"))
    assert "DDPCommunicationHookType.POWER_SGD" in hooked_notes  # the enum member's real name
    if not _installed("accelerate"):
        pytest.skip("accelerate is not installed: its config loader not run")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DDPCommunicationHookType

    assert DDPCommunicationHookType.POWER_SGD.value == "power_sgd"

    path = tmp_path / "accelerate.yaml"
    path.write_text(render(recommendation, "accelerate"))
    loaded = load_config_from_file(str(path))
    assert loaded.num_processes == 2


TUNED_DDP = {
    "parallel": "ddp",
    "world_size": 2,
    "comm_hook": "powersgd",
    "powersgd_rank": 4,
    "powersgd_start_iter": 10,
    "static_graph": True,
}


@pytest.mark.parametrize("fmt", ["hf", "accelerate"])
def test_every_ddp_knob_a_trainer_cannot_express_is_noted(fmt: str) -> None:
    notes = " ".join(notes_for(_recommendation(TUNED_DDP), fmt))
    for knob in ("comm_hook=powersgd", "powersgd_rank=4", "powersgd_start_iter=10", "static_graph"):
        assert knob in notes, f"{fmt} export neither sets nor notes {knob}: {notes}"
    if fmt != "accelerate" or not _installed("accelerate"):
        return
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    # The code the note gives runs as written.
    code = notes[notes.index("DistributedDataParallelKwargs(") : notes.rindex(")])") + 1]
    names = {"DistributedDataParallelKwargs": DistributedDataParallelKwargs}
    handler = eval(code, {**names, "DDPCommunicationHookType": DDPCommunicationHookType})
    assert handler.static_graph is True
    assert handler.comm_hook == DDPCommunicationHookType.POWER_SGD
    assert handler.comm_state_option == {"matrix_approximation_rank": 4, "start_powerSGD_iter": 10}


def test_lightning_sets_every_ddp_knob_in_its_strategy() -> None:
    data = yaml.safe_load(render(_recommendation(TUNED_DDP), "lightning"))
    init = data["trainer"]["strategy"]["init_args"]
    assert init["static_graph"] is True
    state = init["ddp_comm_state"]["init_args"]
    assert state["matrix_approximation_rank"] == 4 and state["start_powerSGD_iter"] == 10


def test_export_takes_a_config_file_as_users_keep_it(tmp_path: Path) -> None:
    # The file search --out writes (or a hand-written one) exports without a stored study.
    from tests.helpers import run_cli

    hf = run_cli("export", "--config", "examples/trial.yaml", "--format", "hf", check=True)
    assert yaml.safe_load(hf.stdout)["gradient_accumulation_steps"] == 2
    command = run_cli(
        "export", "--config", "examples/trial.yaml", "--format", "torchrun", check=True
    )
    assert command.stdout.rstrip().endswith("train.py --config examples/trial.yaml")
    bad = run_cli("export", "--config", str(tmp_path / "missing.yaml"))
    assert bad.returncode == 2 and "missing.yaml" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_processes")
def test_the_exported_torchrun_command_runs_as_printed(tmp_path: Path) -> None:
    # A stored recommendation, exported as a torchrun command: the config it names exists
    # and a user script that reads --config trains with it under real torchrun.
    import os
    import subprocess

    import optuna

    from autotune.search.driver import RECOMMENDATION_ATTR
    from tests.helpers import run_cli

    recommendation = _recommendation({"parallel": "ddp", "world_size": 2, "comm_hook": "fp16"})
    db = tmp_path / "s.db"
    study = optuna.create_study(storage=f"sqlite:///{db}", study_name="s")
    study.set_user_attr(RECOMMENDATION_ATTR, recommendation.model_dump(mode="json"))
    launch = tmp_path / "launch.sh"
    run_cli(
        "export",
        "--storage",
        str(db),
        "--format",
        "torchrun",
        "--script",
        "tests/fixtures/user_loop.py",
        "--out",
        str(launch),
        check=True,
    )
    command = launch.read_text().strip()
    bin_dir = Path(sys.executable).parent
    assert command.startswith("OMP_NUM_THREADS=") and "--nproc-per-node=2" in command
    process = subprocess.run(
        command + " --steps 4",
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        # torchrun as the user's shell finds it: in the environment autotune is installed in
        env={**os.environ, "PYTHONPATH": os.getcwd(), "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert process.returncode == 0, process.stderr[-3000:]
    result = json.loads(process.stdout.strip().splitlines()[-1])
    assert result["optimizer_steps"] == 4 and result["hook_calls"] >= 4


def test_find_unused_parameters_reaches_every_trainer() -> None:
    config = {"global_batch_size": 16, "parallel": "ddp", "world_size": 2, "device": "cpu",
              "find_unused_parameters": True}  # fmt: skip
    recommendation = _recommendation(config)
    hf = yaml.safe_load(render(recommendation, "hf"))
    assert hf["ddp_find_unused_parameters"] is True
    lightning = yaml.safe_load(render(recommendation, "lightning"))
    assert lightning["trainer"]["strategy"]["init_args"]["find_unused_parameters"] is True
    notes = " ".join(notes_for(recommendation, "accelerate"))
    assert "DistributedDataParallelKwargs(find_unused_parameters=True)" in notes


def test_compile_reaches_every_trainer() -> None:
    config = {"global_batch_size": 16, "device": "cpu", "compile": "max-autotune"}
    recommendation = _recommendation(config)
    hf = yaml.safe_load(render(recommendation, "hf"))
    assert hf["torch_compile"] is True and hf["torch_compile_mode"] == "max-autotune"
    accelerate = yaml.safe_load(render(recommendation, "accelerate"))
    assert accelerate["dynamo_config"]["dynamo_backend"] == "INDUCTOR"
    assert accelerate["dynamo_config"]["dynamo_mode"] == "max-autotune"
    notes = " ".join(notes_for(recommendation, "lightning"))
    assert 'trainer.fit(torch.compile(model, mode="max-autotune"))' in notes
    exported = yaml.safe_load(render(recommendation, "yaml"))
    assert exported["compile"] == "max-autotune"  # what apply.prepare and torchrun runs read
    plain = yaml.safe_load(render(_recommendation({**config, "compile": "off"}), "hf"))
    assert "torch_compile" not in plain


def test_the_yaml_says_when_the_race_could_not_tell_the_pick_from_the_runner_up(
    tmp_path: Path,
) -> None:
    from autotune.recommendation import RunnerUp

    recommendation = _recommendation(HOOKED)
    other = make_config({"global_batch_size": 32, "device": "cpu", "amp": "bf16"})
    for high, ruled_out, said in ((1.06, False, True), (0.99, True, False)):
        close = RunnerUp(config=other, ratio=0.95, ratio_low=0.9, ratio_high=high, rounds=4,
                         ruled_out=ruled_out)  # fmt: skip
        text = render(recommendation.model_copy(update={"runner_up": close}), "yaml")
        assert ("could not tell it from singlex1 amp=bf16" in text) is said
        path = tmp_path / "best.yaml"
        path.write_text(text)
        assert load_config(path) == recommendation.config  # still loads: the caveat is a comment
    faster = RunnerUp(config=other, ratio=1.02, ratio_low=1.001, ratio_high=1.04, rounds=4,
                      faster=True)  # fmt: skip
    text = render(recommendation.model_copy(update={"runner_up": faster}), "yaml")
    assert "a gain its 95% interval does not show: this one changes less" in text
    assert "could not tell" not in text  # the race had told them apart, at its own level


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_search_out_writes_the_config_with_the_export_s_header(
    suffix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import autotune.cli
    from autotune.recommendation import RunnerUp

    other = make_config({"global_batch_size": 32, "device": "cpu", "amp": "bf16"})
    close = RunnerUp(config=other, ratio=0.97, ratio_low=0.9, ratio_high=1.05, rounds=4)
    recommendation = _recommendation(HOOKED).model_copy(update={"runner_up": close})
    monkeypatch.setattr(autotune.cli, "tune", lambda *args, **kwargs: recommendation)
    out = tmp_path / f"best{suffix}"
    assert autotune.cli.main(["search", "--model", "tests.fixtures.models:Small",
                              "--out", str(out)]) == 0  # fmt: skip
    assert load_config(out) == recommendation.config
    assert out.read_text() == render(recommendation, suffix.removeprefix("."))
    if suffix == ".yaml":
        assert out.read_text().startswith("# autotune recommendation for study s:")
        assert "could not tell it from singlex1 amp=bf16" in out.read_text()


def test_cpu_offload_reaches_every_trainer_in_its_own_words(tmp_path: Path) -> None:
    offloaded = make_config(
        {"global_batch_size": 32, "device": "cuda", "parallel": "fsdp", "world_size": 2,
         "fsdp_cpu_offload": True, "reshard_after_forward": False}
    )  # fmt: skip
    recommendation = _recommendation({}).model_copy(update={"config": offloaded})
    hf = yaml.safe_load(render(recommendation, "hf"))
    assert hf["fsdp"].split() == ["shard_grad_op", "auto_wrap", "offload"]
    strategy = yaml.safe_load(render(recommendation, "lightning"))["trainer"]["strategy"]
    assert strategy["init_args"] == {"sharding_strategy": "SHARD_GRAD_OP", "cpu_offload": True}
    path = tmp_path / "accelerate.yaml"
    path.write_text(render(recommendation, "accelerate"))
    assert yaml.safe_load(path.read_text())["fsdp_config"]["fsdp_offload_params"] is True
    if not all(_installed(m) for m in ("transformers", "lightning", "accelerate")):
        pytest.skip("the trainers extra is not installed: their parsers not run")
    from accelerate.commands.config.config_args import load_config_from_file
    from transformers.trainer_utils import FSDPOption

    assert {FSDPOption(word) for word in hf["fsdp"].split()} >= {FSDPOption.OFFLOAD}
    fsdp = _instantiate(strategy)
    assert fsdp.cpu_offload.offload_params is True
    assert load_config_from_file(str(path)).fsdp_config["fsdp_offload_params"] is True


def test_a_memory_caveat_reaches_the_yaml_and_the_report(tmp_path: Path) -> None:
    from autotune.report import format_recommendation

    caveat = "the measured peak is a lower bound for a long run"
    recommendation = _recommendation({"amp": "bf16"}).model_copy(
        update={"memory_caveats": [caveat]}
    )
    text = render(recommendation, "yaml")
    assert f"# memory caveat: {caveat}" in text
    path = tmp_path / "best.yaml"
    path.write_text(text)
    assert load_config(path) == recommendation.config  # a comment: it still loads
    assert f"memory caveat: {caveat}" in format_recommendation(recommendation)
    assert "memory caveat" not in format_recommendation(_recommendation({"amp": "bf16"}))


def test_the_html_report_says_caveats_in_the_text_reports_order() -> None:
    from autotune.html_report import render_html
    from autotune.report import format_recommendation

    caveats = ["first caveat", "second caveat"]
    recommendation = _recommendation({"amp": "bf16"}).model_copy(update={"memory_caveats": caveats})
    page, text = render_html(recommendation), format_recommendation(recommendation)
    assert page.index("first caveat") < page.index("second caveat")
    assert text.index("first caveat") < text.index("second caveat")
    assert page.index("numerics") < page.index("first caveat")


def test_a_trainer_s_fsdp_is_told_of_the_scalar_parameters_fully_shard_refuses() -> None:
    sharded = _recommendation(SHARDED).model_copy(update={"scalar_parameters": ["logit_scale"]})
    for fmt in ("hf", "lightning", "accelerate"):
        assert any("0-dim parameters (logit_scale)" in n for n in notes_for(sharded, fmt))
        assert "# note: FSDP2's fully_shard refuses 0-dim parameters" in render(sharded, fmt)
    replicated = _recommendation(HOOKED).model_copy(update={"scalar_parameters": ["logit_scale"]})
    assert not any("0-dim" in n for n in notes_for(replicated, "accelerate"))  # DDP takes them


def test_the_search_names_a_model_s_scalar_parameters() -> None:
    from autotune.search.model_facts import scalar_parameters

    assert scalar_parameters("tests.fixtures.traced:Stack") == []
    pytest.importorskip("transformers")
    assert scalar_parameters("tests.fixtures.hf_zoo:clip") == ["logit_scale"]


def test_fsdps_bf16_parameters_on_batch_norms_are_noted_for_another_trainer() -> None:
    values = {"parallel": "fsdp", "world_size": 2, "fsdp_mixed_precision": "bf16"}
    normed = _recommendation(values).model_copy(update={"model": "workloads.convnet:resnet_tiny"})
    assert any("fail on batch norms" in n for n in notes_for(normed, "accelerate"))
    assert not any("fail on batch norms" in n for n in notes_for(normed, "yaml"))
    plain = normed.model_copy(update={"model": "workloads.mlp:mlp_tiny"})
    assert not any("fail on batch norms" in n for n in notes_for(plain, "lightning"))


def test_a_looped_layers_checkpointing_is_applied_in_code_with_its_calls() -> None:
    # ALBERT's searched k counts its looped group's calls: apply_checkpointing(model, k) alone
    # finds no block (or, beside fallback blocks, checkpoints those instead of the calls)
    values = {"parallel": "ddp", "world_size": 2, "checkpoint_segments": 3}
    looped = _recommendation(values).model_copy(update={"looped_layer": True})
    for fmt in ("lightning", "accelerate", "hf"):
        assert (
            "apply_checkpointing(model, 3, autotune.runner.training.loop_calls(model, batch))"
            in (render(looped, fmt))
        )
        plain = render(_recommendation(values), fmt)
        assert "apply_checkpointing(model, 3)" in plain or fmt == "hf"
        assert "loop_calls" not in plain
