from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.errors import ConfigError
from autotune.search.space import SPACES_DIR, load_space, parse_space


@pytest.mark.parametrize("name", ["default", "quick", "bench"])
def test_built_in_spaces_load(name: str) -> None:
    space = load_space(name)
    assert "parallel" in space.params


def test_default_space_covers_every_searchable_knob() -> None:
    from autotune.config import TrainConfig

    knobs = set(TrainConfig.model_fields) - {
        "global_batch_size",
        "device",
        "find_unused_parameters",  # set by the search when the model needs it, never a choice
        "max_grad_norm",  # training semantics, given by the user
    }
    assert knobs <= set(load_space("default").params)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"amp_mode": ["off"]}, "unknown knob 'amp_mode'; knobs: global_batch_size,"),
        ({"paralel": ["ddp"]}, "unknown knob 'paralel'; did you mean 'parallel'?"),
        ({"amp": []}, "amp: empty choice list"),
        ({"grad_accum_steps": {"range": [8, 1]}}, "range [8, 1] is impossible"),
        ({"amp": {"choices": ["off"], "sometimes": True}}, "unknown key; allowed: choices"),
        (
            {"comm_hook": {"choices": ["fp16"], "when": {"parallel": ["ddp"]}}},
            "condition on 'parallel', which is not a knob listed before it",
        ),
        ({"global_batch_size": [8, 16]}, "never searched"),
        ({"amp": ["off", "off"]}, "duplicate choices"),
        ({"\n": []}, "'\\n': empty choice list"),  # a name that would break the line
        (["amp"], "expected a mapping of knobs to choices"),
        ({"amp": ["off", "fp8"]}, "amp: 'fp8': Input should be 'off', 'fp16' or 'bf16'"),
        ({"world_size": [0, 2]}, "world_size: 0: Input should be greater than or equal to 1"),
        (
            {"parallel": ["ddp"], "world_size": {"choices": [2], "when": {"parallel": ["dpp"]}}},
            "parallel: 'dpp': Input should be",
        ),
    ],
)
def test_bad_spaces_are_one_line(data: object, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_space(data, "'test.yaml'")
    assert expected in str(error.value)
    assert "\n" not in str(error.value)


def test_an_unquoted_off_in_a_space_file_is_the_choice_off(tmp_path: Path) -> None:
    # YAML reads ``off`` as False; enumerating the space dropped it without a word, as a
    # configuration the config refuses.
    from autotune.search.space import enumerate_configs

    path = tmp_path / "space.yaml"
    path.write_text("amp: [off, bf16]\ncompile: {choices: [off], when: {amp: [off]}}\n")
    space = load_space(str(path))
    assert space.params["amp"].choices == ("off", "bf16")
    assert space.params["compile"].when == {"amp": ("off",)}
    configs = enumerate_configs(space, {"global_batch_size": 8})
    assert sorted(c.amp for c in configs) == ["bf16", "off"]


def test_unknown_space_name_lists_the_built_in_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="built-in: bench, default, gpu_single, quick"):
        load_space("nope")
    broken = tmp_path / "s.yaml"
    broken.write_text("amp: [off\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_space(str(broken))
    assert SPACES_DIR.is_dir()


def test_conditional_knobs_are_only_sampled_when_their_condition_holds() -> None:
    space = parse_space(
        {
            "parallel": ["single", "ddp"],
            "comm_hook": {"choices": ["none", "fp16"], "when": {"parallel": ["ddp"]}},
            "num_workers": [0, 2],
            "prefetch_factor": {"choices": [2, 4], "when_not": {"num_workers": [0]}},
        },
        "test",
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = []
    for _ in range(40):
        trial = study.ask()
        values: dict[str, object] = {}
        for name, param in space.params.items():
            if param.active(values):
                values[name] = trial.suggest_categorical(name, list(param.choices))
        study.tell(trial, 0.0)
        seen.append(trial.params)
    assert all(("comm_hook" in p) == (p["parallel"] == "ddp") for p in seen)
    assert all(("prefetch_factor" in p) == (p["num_workers"] != 0) for p in seen)
    assert {p["parallel"] for p in seen} == {"single", "ddp"}


def test_removing_the_last_choice_removes_the_knob() -> None:
    space = parse_space({"amp": ["off", "bf16"]}, "test")
    assert space.without("amp", "bf16").params["amp"].choices == ("off",)
    assert "amp" not in space.without("amp", "bf16").without("amp", "off").params


def test_enumerating_the_benchmark_space_gives_every_valid_configuration_once() -> None:
    from autotune.search.space import enumerate_configs

    configs = enumerate_configs(load_space("bench"), {"global_batch_size": 32, "device": "cpu"})
    # parallel: single + ddp x 2 hooks + fsdp = 4; amp 2; ckpt 2; accum 2; loader: no workers,
    # or one worker x 2 prefetch x persistent or not.
    assert len(configs) == 4 * 2 * 2 * 2 * (1 + 2 * 2)
    assert len({c.key() for c in configs}) == len(configs)
    assert all((c.prefetch_factor is None) == (c.num_workers == 0) for c in configs)
    assert any(c.persistent_workers for c in configs)
    assert not any(c.persistent_workers for c in configs if c.num_workers == 0)
    assert all(c.comm_hook == "none" for c in configs if c.parallel != "ddp")


def test_enumeration_leaves_out_what_the_config_refuses() -> None:
    from autotune.search.space import enumerate_configs

    space = parse_space({"grad_accum_steps": [1, 2, 3]}, "test")
    configs = enumerate_configs(space, {"global_batch_size": 4})
    assert [c.grad_accum_steps for c in configs] == [1, 2]  # 4 is not divisible by 3
