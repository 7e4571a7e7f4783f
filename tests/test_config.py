from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.config import TrainConfig, load_config, make_config, save_config
from autotune.errors import ConfigError


def test_micro_batch_is_derived_from_global_batch() -> None:
    config = make_config(
        {"global_batch_size": 64, "parallel": "ddp", "world_size": 2, "grad_accum_steps": 4}
    )
    assert config.micro_batch_size == 8
    assert config.processes == 2


def test_config_is_frozen() -> None:
    config = make_config({"global_batch_size": 8})
    with pytest.raises(Exception, match="frozen"):
        config.amp = "bf16"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"global_batch_size": 30, "parallel": "ddp", "world_size": 4},
            "global_batch_size=30 is not divisible by world_size * grad_accum_steps = 4 * 1 = 4",
        ),
        ({"global_batch_size": 8, "comm_hook": "fp16"}, "comm_hook=fp16 needs parallel=ddp"),
        (
            {"global_batch_size": 8, "parallel": "fsdp", "world_size": 2, "comm_hook": "powersgd"},
            "comm_hook=powersgd needs parallel=ddp, got parallel=fsdp",
        ),
        (
            {
                "global_batch_size": 8,
                "parallel": "ddp",
                "world_size": 2,
                "static_graph": True,
                "grad_accum_steps": 2,
            },
            "static_graph=true cannot be combined with grad_accum_steps=2",
        ),
        (
            {
                "global_batch_size": 8,
                "device": "cuda",
                "parallel": "ddp",
                "world_size": 2,
                "compile": "reduce-overhead",
                "grad_accum_steps": 2,
            },
            "compile=reduce-overhead (CUDA graphs) cannot be combined with grad_accum_steps=2 "
            "under parallel=ddp",
        ),
        (
            {"global_batch_size": 8, "parallel": "dp", "world_size": 2, "device": "cpu"},
            "parallel=dp (DataParallel) needs device=cuda, got device=cpu",
        ),
        (
            {"global_batch_size": 8, "parallel": "dp", "world_size": 1},
            "parallel=dp needs world_size >= 2",
        ),
        ({"global_batch_size": 8, "world_size": 2}, "parallel=single needs world_size=1"),
        ({"global_batch_size": 8, "prefetch_factor": 2}, "prefetch_factor=2 needs num_workers"),
        (
            {"global_batch_size": 8, "checkpoint_policy": "selective"},
            "checkpoint_policy=selective needs checkpoint_segments >= 1, got checkpoint_segments=0",
        ),
        ({"global_batch_size": 8, "persistent_workers": True}, "persistent_workers=true needs"),
        ({"global_batch_size": 8, "pin_memory": True, "device": "cpu"}, "pin_memory=true needs"),
        (
            {
                "global_batch_size": 8,
                "parallel": "ddp",
                "world_size": 2,
                "comm_hook": "bf16",
                "device": "cpu",
            },
            "comm_hook=bf16 needs device=cuda (NCCL)",
        ),
        ({"global_batch_size": 8, "amp": "fp8"}, "amp='fp8'"),
        ({"global_batch_size": 8, "checkpoint_segments": -1}, "checkpoint_segments=-1"),
        ({"global_batch_size": 8, "amp_mode": "bf16"}, "unknown field 'amp_mode'; known fields:"),
        (
            {"global_batch_size": 8, "paralel": "ddp"},
            "unknown field 'paralel'; did you mean 'parallel'?",
        ),
        ({}, "missing required field 'global_batch_size'"),
    ],
)
def test_invalid_combinations_are_rejected_naming_fields(values: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        make_config(values)
    message = str(error.value)
    assert expected in message
    assert "\n" not in message


def test_cuda_graphs_with_accumulation_are_allowed_on_one_device() -> None:
    # The trainer keeps gradients of their own for it (TrainStep.keep_grads), shown on an H100
    # to accumulate as eager does; under DDP and FSDP it stays refused until shown there.
    config = make_config(
        {"global_batch_size": 8, "device": "cuda", "compile": "reduce-overhead",
         "grad_accum_steps": 2}
    )  # fmt: skip
    assert config.grad_accum_steps == 2 and config.compile == "reduce-overhead"


def test_all_problems_are_reported_together() -> None:
    with pytest.raises(ConfigError) as error:
        make_config(
            {
                "global_batch_size": 7,
                "comm_hook": "fp16",
                "prefetch_factor": 2,
                "parallel": "ddp",
                "world_size": 2,
                "num_workers": 0,
            }
        )
    assert "prefetch_factor=2" in str(error.value)
    assert "global_batch_size=7" in str(error.value)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_round_trip_through_files(tmp_path: Path, suffix: str) -> None:
    config = make_config(
        {
            "global_batch_size": 32,
            "parallel": "ddp",
            "world_size": 2,
            "comm_hook": "powersgd",
            "num_workers": 2,
            "prefetch_factor": 4,
        }
    )
    path = tmp_path / f"best{suffix}"
    save_config(config, path)
    assert load_config(path) == config


def test_file_values_are_overridden_by_flags(tmp_path: Path) -> None:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"global_batch_size": 32, "amp": "fp16"}))
    assert load_config(path, {"amp": "bf16"}).amp == "bf16"


def test_an_unquoted_off_in_a_yaml_file_means_off(tmp_path: Path) -> None:
    # YAML 1.1 reads off (and no, false) as False: "amp=False: Input should be 'off', ..."
    path = tmp_path / "hand.yaml"
    path.write_text("global_batch_size: 8\namp: off\ncompile: no\nfsdp_mixed_precision: false\n")
    config = load_config(path)
    assert (config.amp, config.compile, config.fsdp_mixed_precision) == ("off", "off", "off")
    path.write_text("global_batch_size: 8\namp: on\n")  # True names no choice: still refused
    with pytest.raises(ConfigError, match="amp=True: Input should be 'off', 'fp16' or 'bf16'"):
        load_config(path)


def test_bad_files_give_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("amp: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML/JSON"):
        load_config(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping of fields, got list"):
        load_config(listing)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")


def test_auto_device_is_resolved_and_revalidated() -> None:
    config = make_config({"global_batch_size": 8, "pin_memory": True})
    assert config.device == "auto"
    with pytest.raises(ConfigError, match="pin_memory=true needs device=cuda"):
        config.resolved("cpu")
    assert TrainConfig(global_batch_size=8).resolved("cpu").device == "cpu"


def test_every_knob_a_search_turns_shows_in_the_summary() -> None:
    from autotune.search.space import load_space

    base = {"global_batch_size": 64, "parallel": "ddp", "world_size": 2, "device": "cuda"}
    seen = set()
    for knob, param in load_space("default").params.items():
        for value in param.choices:
            values = {**base, knob: value}
            if knob in ("prefetch_factor", "persistent_workers"):
                values["num_workers"] = 1
            if knob in ("powersgd_rank", "powersgd_start_iter"):
                values["comm_hook"] = "powersgd"
            if knob in ("reshard_after_forward", "fsdp_mixed_precision", "fsdp_cpu_offload"):
                values["parallel"] = "fsdp"
            if knob == "checkpoint_policy":
                values["checkpoint_segments"] = 2
            if (knob == "parallel" and value == "single") or knob == "optimizer_in_backward":
                values["parallel"], values["world_size"] = "single", 1
            if knob == "world_size" or (knob == "static_graph" and value):
                values["grad_accum_steps"] = 1
            try:
                config = make_config(values)
            except ConfigError:
                continue
            seen.add((knob, config.summary()))
    by_knob: dict[str, set[str]] = {}
    for knob, summary in seen:
        by_knob.setdefault(knob, set()).add(summary)
    for knob, summaries in by_knob.items():  # a knob with 2+ values reads 2+ ways
        assert len(summaries) > 1, f"{knob}: its values look the same in summaries"
