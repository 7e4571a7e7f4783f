"""The standard recipe: what a skilled engineer writes by hand, measured beside the baseline;
and the numerics a configuration changes, which a pick must earn."""

from __future__ import annotations

import random

import pytest

from autotune.config import TrainConfig
from autotune.report import format_recommendation
from autotune.result import TrialResult
from autotune.search.model_facts import batch_norm
from autotune.search.recipe import (
    Coupling,
    knobs_moved,
    norm_samples,
    numerics_changes,
    recipe_candidates,
    recipe_fallback,
    recipe_values,
    simplicity,
)
from autotune.search.space import SearchSpace, parse_space
from tests.search.fakes import FakeExecutor, Said, failed, make_tuner, ok

GPU_CHOICES = {
    "parallel": ["single", "dp", "ddp", "fsdp"],
    "world_size": [2, 4, 8],
    "amp": ["off", "fp16", "bf16"],
    "compile": ["off", "default", "reduce-overhead"],
    "num_workers": [0, 1, 2, 4, 8],
    "persistent_workers": [False, True],
    "pin_memory": [False, True],
    "optimizer_impl": ["default", "foreach", "fused"],
    "grad_accum_steps": [1, 2, 4, 8],
}


def _complete(values: dict) -> dict:
    return {**values, "global_batch_size": 64, "device": values.get("device", "cuda")}


def test_the_recipe_on_gpus_is_bf16_compiled_ddp_fused_with_four_pinned_workers() -> None:
    values = recipe_values(GPU_CHOICES, "cuda", devices=8, cores_per_rank=12)
    assert values == {
        "amp": "bf16",
        "parallel": "ddp",
        "world_size": 8,
        "compile": "default",
        "num_workers": 4,
        "persistent_workers": True,
        "pin_memory": True,
        "optimizer_impl": "fused",
    }
    # fewer cores than four per rank: as many workers as cores, from what the space offers
    assert recipe_values(GPU_CHOICES, "cuda", 8, cores_per_rank=3)["num_workers"] == 2


def test_the_recipe_takes_only_what_the_probe_left() -> None:
    # no bf16 on this device, no compile (the probe dropped it), one device, a CPU
    choices = {**GPU_CHOICES, "amp": ["off", "fp16"], "compile": ["off"]}
    values = recipe_values(choices, "cpu", devices=1, cores_per_rank=1)
    assert values["amp"] == "fp16" and "compile" not in values
    assert values["parallel"] == "single" and values["world_size"] == 1
    assert "pin_memory" not in values and "persistent_workers" not in values  # CUDA only
    assert values["num_workers"] == 1
    none = recipe_values({"amp": ["off"]}, "cpu", devices=2, cores_per_rank=1)
    assert none == {"amp": "off", "parallel": "single", "world_size": 1}


def test_the_recipe_takes_autocast_only_where_the_device_computes_it_natively() -> None:
    # A CPU without AVX512-BF16 or AMX emulates both (54 against 404 samples/s on the AMD EPYC
    # of the README): an engineer leaves autocast off there, and so does the recipe.
    assert recipe_values(GPU_CHOICES, "cpu", 2, 1, native_amp=())["amp"] == "off"
    assert recipe_values(GPU_CHOICES, "cpu", 2, 1, native_amp=("bf16",))["amp"] == "bf16"
    assert recipe_values(GPU_CHOICES, "cpu", 2, 1, native_amp=("fp16",))["amp"] == "fp16"
    offered_fp32 = {**GPU_CHOICES, "amp": ["off"]}  # nothing offered: native or not, off
    assert recipe_values(offered_fp32, "cuda", 2, 1, native_amp=("bf16", "fp16"))["amp"] == "off"


def _space(**choices: list) -> SearchSpace:
    return parse_space(dict(choices), "test")


def test_recipe_candidates_go_from_the_largest_micro_batch_down_then_fsdp_then_one_device() -> None:
    values = recipe_values(GPU_CHOICES, "cuda", devices=2, cores_per_rank=4)
    space = _space(parallel=["single", "ddp", "fsdp"], grad_accum_steps=[4, 1, 2])
    found = recipe_candidates(values, space, _complete)
    assert [(c.parallel, c.grad_accum_steps) for c in found] == [
        ("ddp", 1), ("ddp", 2), ("ddp", 4), ("fsdp", 1), ("fsdp", 2), ("fsdp", 4),
        ("single", 1), ("single", 2), ("single", 4),
    ]  # fmt: skip
    assert all(c.amp == "bf16" and c.optimizer_impl == "fused" for c in found)
    no_fsdp = recipe_candidates(values, _space(parallel=["ddp"], grad_accum_steps=[1]), _complete)
    assert [c.parallel for c in no_fsdp] == ["ddp"]


def test_a_knob_the_recipe_leaves_alone_takes_a_choice_the_space_offers() -> None:
    # workers on: the space's prefetch factor exists, and the recipe takes PyTorch's default 2
    values = {"amp": "off", "parallel": "single", "world_size": 1, "num_workers": 1}
    space = parse_space(
        {"num_workers": [0, 1], "prefetch_factor": {"choices": [2, 4],
                                                    "when_not": {"num_workers": [0]}}}, "test"
    )  # fmt: skip
    (config,) = recipe_candidates(values, space, _complete)
    assert config.prefetch_factor == 2


def test_a_knob_a_combination_refuses_is_left_at_its_default() -> None:
    # pin_memory needs CUDA: on a CPU config the recipe drops it rather than the whole recipe
    values = {"amp": "bf16", "parallel": "single", "world_size": 1, "pin_memory": True}
    cpu = lambda v: {**v, "global_batch_size": 8, "device": "cpu"}  # noqa: E731
    (config,) = recipe_candidates(values, _space(grad_accum_steps=[1]), cpu)
    assert config.amp == "bf16" and config.pin_memory is False


def test_numerics_changes_name_each_change_to_the_arithmetic() -> None:
    plain = TrainConfig(global_batch_size=64, parallel="ddp", world_size=2, device="cuda")
    assert numerics_changes(plain) == []
    changed = plain.model_copy(
        update={"amp": "bf16", "comm_hook": "fp16", "matmul_precision": "high"}
    )
    assert numerics_changes(changed) == ["amp=bf16", "comm_hook=fp16", "matmul_precision=high"]
    fsdp = TrainConfig(
        global_batch_size=64, parallel="fsdp", world_size=2, device="cuda",
        fsdp_mixed_precision="bf16",
    )  # fmt: skip
    assert numerics_changes(fsdp) == ["fsdp_mixed_precision=bf16"]
    workers = plain.model_copy(update={"num_workers": 2, "grad_accum_steps": 2})
    assert numerics_changes(workers) == [] and knobs_moved(workers, plain) == 2
    assert simplicity(workers, plain) < simplicity(changed, plain)  # numerics first


def test_a_batch_norm_over_other_samples_than_the_baselines_is_a_numerics_change() -> None:
    # A BatchNorm model's search said "numerics: unchanged" of a pick that normalised over half
    # the baseline's samples: the micro-batch is part of such a model's numerics.
    assert batch_norm("tests.fixtures.norms:Normed") == "local"
    assert batch_norm("tests.fixtures.norms:Synced") == "synced"
    assert batch_norm("tests.fixtures.norms:LazyNormed") == "local"
    assert batch_norm("tests.fixtures.models:Small") is None
    base = TrainConfig(global_batch_size=32, parallel="ddp", world_size=2, device="cpu")
    accumulating = base.model_copy(update={"grad_accum_steps": 2})
    single = TrainConfig(global_batch_size=32, device="cpu")
    assert [norm_samples(c, "local") for c in (base, accumulating, single)] == [16, 8, 32]
    assert [norm_samples(c, "synced") for c in (base, accumulating, single)] == [32, 16, 32]
    assert numerics_changes(accumulating) == []  # a model without batch norms
    assert numerics_changes(accumulating, Coupling("local"), base) == [
        "batch_norm_samples=8 (the baseline's 16)"
    ]
    assert numerics_changes(single, Coupling("local"), base) == [
        "batch_norm_samples=32 (the baseline's 16)"
    ]
    assert numerics_changes(single, Coupling("synced"), base) == []  # SyncBatchNorm: 32 either way
    assert numerics_changes(base, Coupling("local"), base) == []
    # and a tie in the race goes to the one that keeps the baseline's statistics
    assert simplicity(accumulating, base) == (0, 1)
    assert simplicity(accumulating, base, Coupling("local")) == (1, 1)


def test_a_search_of_a_batch_norm_model_names_the_samples_its_pick_normalises_over() -> None:
    space = {"parallel": ["ddp"], "world_size": [2], "grad_accum_steps": [1, 2]}
    rng = random.Random(3)

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        speed = 1500.0 if config.grad_accum_steps == 2 else 1000.0
        return ok(config, speed * rng.gauss(1, 0.005), 100)

    tuner = make_tuner(FakeExecutor(outcome), space, trials=2, race_rounds=3)
    tuner.coupling = Coupling("local")
    recommendation = tuner.run([], "s.db", "s")
    assert recommendation.config.grad_accum_steps == 2
    assert recommendation.numerics_changes == ["batch_norm_samples=4 (the baseline's 8)"]
    assert (
        "numerics changed: batch_norm_samples=4 (the baseline's 8)"
        in format_recommendation(recommendation).splitlines()
    )


def _speeds(recipe_speed: float, noise: float):
    rng = random.Random(5)

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        speed = 1000.0 + 100 * config.num_workers  # a worker helps
        if config.amp == "bf16":
            speed = recipe_speed if config.num_workers else speed * 1.01
        return ok(config, speed * rng.gauss(1, noise), 100)

    return outcome


SPACE = {"parallel": ["ddp"], "world_size": [2], "amp": ["off", "bf16"], "num_workers": [0, 1]}


def test_every_search_measures_the_recipe_and_states_the_speed_up_over_it() -> None:
    tuner = make_tuner(FakeExecutor(_speeds(900.0, 0.005)), SPACE, trials=4, race_rounds=4)
    recommendation = tuner.run([], "s.db", "s")
    recipe = recommendation.recipe
    assert recipe is not None and (recipe.amp, recipe.num_workers) == ("bf16", 1)
    raced = {r.config.key() for r in recommendation.trials if r.role == "race" and r.config}
    assert recipe.key() in raced  # raced beside the baseline, in the same rounds
    # the pick: fp32 with a worker, 1100 against the recipe's 900
    assert (recommendation.config.amp, recommendation.config.num_workers) == ("off", 1)
    assert recommendation.speedup_over_recipe == pytest.approx(1100 / 900, rel=0.03)
    low, high = recommendation.speedup_over_recipe_low, recommendation.speedup_over_recipe_high
    assert low is not None and high is not None and low < 1100 / 900 < high
    assert recommendation.numerics_changes == []
    text = format_recommendation(recommendation)
    assert "over the standard recipe (" in text and "numerics: unchanged" in text
    assert '"speedup_over_recipe"' in recommendation.to_json()


def test_a_search_on_a_device_that_emulates_bf16_measures_the_recipe_without_it() -> None:
    tuner = make_tuner(FakeExecutor(_speeds(900.0, 0.005)), SPACE, trials=4, race_rounds=2)
    tuner.native_amp = ((), "oneDNN's check of this CPU's instructions")
    tuner.reporter = phases = Said()
    recommendation = tuner.run([], "s.db", "s")
    assert recommendation.recipe is not None and recommendation.recipe.amp == "off"
    assert recommendation.recipe.num_workers == 1  # the rest of the recipe stands
    assert (
        "standard recipe: autocast off, bf16 would be emulated on this CPU, not computed "
        "natively (oneDNN's check of this CPU's instructions)"
    ) in phases.lines


def test_a_search_on_a_gpu_emulating_bf16_measures_the_recipe_in_fp16() -> None:
    # A V100 or a T4 (platform.native_autocast): bf16 stays in the space, the recipe takes fp16.
    space = {**SPACE, "amp": ["off", "bf16", "fp16"]}
    tuner = make_tuner(FakeExecutor(_speeds(900.0, 0.005)), space, trials=4, race_rounds=2)
    tuner.platform = tuner.platform.model_copy(update={"device_type": "cuda"})
    tuner.native_amp = (("fp16",), "CUDA capability 7.0: bf16 native from 8.0 on")
    tuner.reporter = phases = Said()
    recommendation = tuner.run([], "s.db", "s")
    assert recommendation.recipe is not None and recommendation.recipe.amp == "fp16"
    assert (
        "standard recipe: autocast fp16, bf16 would be emulated on this GPU, not computed "
        "natively (CUDA capability 7.0: bf16 native from 8.0 on)"
    ) in phases.lines


def test_the_recipe_gives_up_compile_then_autocast_and_nothing_else() -> None:
    values = {"amp": "bf16", "compile": "default", "num_workers": 4}
    assert recipe_fallback(values) == (
        "compile=default",
        {"amp": "bf16", "compile": "off", "num_workers": 4},
    )
    assert recipe_fallback({"amp": "bf16", "num_workers": 4}) == (
        "amp=bf16",
        {"amp": "off", "num_workers": 4},
    )
    assert recipe_fallback({"amp": "off", "compile": "off", "num_workers": 4}) is None


AUTOCAST_BREAKS = (
    "rank 0: warm-up step 1: RuntimeError: index_add_(): self (Float) and source (BFloat16) "
    "must have the same scalar type"
)


def test_a_model_that_fails_under_autocast_gets_the_recipe_without_it() -> None:
    # A user's graph network adds bf16 messages into an fp32 buffer: every trial under autocast
    # failed, the recipe's among them, and the search said the recipe "fits at no micro-batch".
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        if config.amp == "bf16":
            return failed(config, "error", AUTOCAST_BREAKS)
        return ok(config, 1000.0 + 100 * config.num_workers, 100)

    tuner = make_tuner(FakeExecutor(outcome), SPACE, trials=4, race_rounds=2)
    tuner.reporter = phases = Said()
    recommendation = tuner.run([], "s.db", "s")
    recipe = recommendation.recipe
    assert recipe is not None and (recipe.amp, recipe.num_workers) == ("off", 1)
    said = [line for line in phases.lines if "standard recipe" in line]
    assert said[0].startswith("standard recipe: failed with amp=bf16 (rank 0: warm-up step 1:")
    assert said[0].endswith("tried without it, as an engineer who saw the error would")
    assert not any("fits at no micro-batch" in line for line in phases.lines)

    def everything_fails(config: TrainConfig, before: int) -> TrialResult:
        if config.amp == "off" and config.num_workers == 0:
            return ok(config, 1000.0, 100)  # the baseline alone runs
        return failed(config, "error", "rank 0: warm-up step 1: RuntimeError: no")

    tuner = make_tuner(FakeExecutor(everything_fails), SPACE, trials=4, race_rounds=2)
    tuner.reporter = phases = Said()
    assert tuner.run([], "s.db", "s").recipe is None
    assert (
        "the standard recipe failed (rank 0: warm-up step 1: RuntimeError: no): the race "
        "compares with the baseline alone"
    ) in phases.lines


def test_a_recipe_pruned_as_another_drivers_search_trial_is_still_the_recipe() -> None:
    # Its record says it runs and fits, slower than that driver's best: no failure to give up
    # a knob for (it had been taken for one, and autocast dropped).
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        result = ok(config, 900.0 if config.amp == "bf16" else 1000.0, 100)
        return result.model_copy(update={"status": "pruned"}) if config.amp == "bf16" else result

    tuner = make_tuner(FakeExecutor(outcome), SPACE, trials=4, race_rounds=2)
    tuner.reporter = phases = Said()
    tuner.baseline()
    recipe = tuner.recipe()
    assert recipe is not None and recipe.amp == "bf16"
    assert not any("failed" in line for line in phases.lines)


def test_a_recipe_that_fails_as_the_baseline_did_gives_up_none_of_its_knobs() -> None:
    executor = FakeExecutor(lambda config, before: failed(config, "error", "rank 0: no"))
    tuner = make_tuner(executor, SPACE, trials=4, race_rounds=2)
    tuner.reporter = phases = Said()
    tuner.baseline()
    assert tuner.recipe(baseline_ran=False) is None
    assert len(executor.runs) == 2  # the baseline, the recipe once: the step fails whatever
    assert not any("tried without it" in line for line in phases.lines)


def test_when_the_recipe_wins_it_is_the_recommendation_and_the_output_says_so() -> None:
    tuner = make_tuner(FakeExecutor(_speeds(1500.0, 0.005)), SPACE, trials=4, race_rounds=4)
    recommendation = tuner.run([], "s.db", "s")
    assert recommendation.recipe_won and recommendation.speedup_over_recipe == 1.0
    assert recommendation.numerics_changes == ["amp=bf16"]
    text = format_recommendation(recommendation)
    assert "the standard recipe is the recommendation" in text
    assert "numerics changed: amp=bf16" in text.splitlines()


def test_a_numerics_change_the_race_cannot_show_faster_is_not_recommended() -> None:
    # bf16 is 1% faster at 6% noise: four rounds cannot show it, so fp32 is recommended
    space = {"parallel": ["ddp"], "world_size": [2], "amp": ["off", "bf16"]}
    rng = random.Random(2)

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        speed = 1010.0 if config.amp == "bf16" else 1000.0
        return ok(config, speed * rng.gauss(1, 0.06), 100)

    tuner = make_tuner(FakeExecutor(outcome), space, trials=2, race_rounds=4)
    recommendation = tuner.run([], "s.db", "s")
    assert recommendation.config.amp == "off" and recommendation.numerics_changes == []
    if recommendation.simpler_choice:  # only when bf16 measured the faster in the race
        assert "amp=bf16" in recommendation.simpler_choice
