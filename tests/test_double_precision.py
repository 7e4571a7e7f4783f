"""A model trained in float64: AMP, which autocast does not apply to float64, is neither searched
nor run as if it were, and synthetic samples follow the model's dtype."""

from __future__ import annotations

import pytest
import torch

from autotune.api import plan, run_trial
from autotune.errors import ConfigError
from autotune.runner.workload import WorkloadSpec, build_workload
from autotune.search.probe import restrict_space
from autotune.search.refusals import autocast_ignored, model_refusals
from autotune.search.space import parse_space
from tests.search.fakes import PLATFORM

PINN = "tests.fixtures.double:PINN"


def test_autocast_is_known_to_change_nothing_only_where_every_parameter_is_float64() -> None:
    assert autocast_ignored(PINN) == (
        "the model's parameters are all float64, which autocast leaves alone"
    )
    assert autocast_ignored("tests.fixtures.double:Mixed") is None
    assert autocast_ignored("tests.fixtures.models:Small") is None


def test_the_search_drops_amp_for_such_a_model_and_says_why() -> None:
    space = parse_space({"parallel": ["single"], "amp": ["off", "fp16", "bf16"]}, "test")
    kept, dropped = restrict_space(
        space, PLATFORM, 1, None, run_checks=False, refusals=model_refusals(PINN)
    )
    assert kept.choices()["amp"] == ["off"]
    assert [(d.knob, d.value) for d in dropped] == [("amp", "fp16"), ("amp", "bf16")]
    assert dropped[0].reason.startswith("the model's parameters are all float64")


def test_a_trial_or_a_plan_asking_for_it_is_refused_in_one_line() -> None:
    config = {"global_batch_size": 8, "device": "cpu", "amp": "bf16"}
    with pytest.raises(ConfigError, match=r"^amp=bf16: the model's parameters are all float64"):
        run_trial(PINN, config, input_shape=(3,))
    with pytest.raises(ConfigError, match=r"use amp=off$"):
        plan(PINN, devices=1, device="cpu", device_memory="4GiB", config=config, input_shape=(3,))
    table = plan(
        PINN, devices=1, device="cpu", device_memory="4GiB", space="quick", input_shape=(3,)
    )
    assert {row.config.amp for row in table.rows} == {"off"}
    assert any(line.startswith("amp bf16: the model's parameters") for line in table.left_out)


def test_synthetic_samples_take_the_float64_of_such_a_model() -> None:
    built = build_workload(WorkloadSpec(model=PINN, input_shape=(3,)))
    assert built.dataset[0].dtype == torch.float64
    assert built.data_source == "synthetic float64[3] (the model's parameters are float64)"
    given = build_workload(WorkloadSpec(model=PINN, input_shape=(3,), input_dtype="float16"))
    assert given.dataset[0].dtype == torch.float16  # a dtype given is kept


def test_a_constructor_that_converts_its_parameters_is_traced_from_the_meta_device() -> None:
    # `.double()` in __init__ under fake tensors: "_apply(): Couldn't swap Linear.weight", and
    # the plan fell back to "a search predicts it by a fit over measured trials".
    from autotune.runner.fake_memory import trace_step

    traced = trace_step(WorkloadSpec(model=PINN, input_shape=(3,)), 8)
    parameters = (3 * 32 + 32 + 32 + 1) * 8  # float64
    assert traced.parameters_bytes == parameters
    # AdamW's two float64 moments, and a step count (4 bytes) for each of the 4 parameters
    assert traced.optimizer_bytes == 2 * parameters + 4 * 4


def test_a_model_built_in_bf16_gets_bf16_samples_and_its_arithmetic_named() -> None:
    # A pure-bf16 model (a fine-tune loaded in bf16) was fed float32 samples from --input-shape,
    # and a recommendation without autocast said "numerics: unchanged (fp32 arithmetic, ...)".
    from autotune.report import numerics_line
    from autotune.runner.workload import WorkloadSpec, build_workload, parameter_dtype
    from autotune.search.model_facts import parameters_dtype
    from tests.test_export import _recommendation

    spec = WorkloadSpec(model="tests.fixtures.double:Brain", input_shape=(3,))
    workload = build_workload(spec)
    assert workload.dataset[0].dtype == torch.bfloat16
    assert workload.data_source == "synthetic bfloat16[3] (the model's parameters are bfloat16)"
    assert parameters_dtype("tests.fixtures.double:Brain") == "bfloat16"
    assert parameter_dtype(workload.model) == "bfloat16"
    assert parameters_dtype("tests.fixtures.double:Mixed") is None  # float64 beside float32
    assert parameters_dtype("tests.fixtures.double:PINN") == "float64"
    plain = _recommendation({})
    assert plain.parameter_dtype is None and plain.numerics_changes == []
    assert "(fp32 arithmetic" in numerics_line(plain)
    said = numerics_line(plain.model_copy(update={"parameter_dtype": "bfloat16"}))
    assert said == "numerics: unchanged (bf16 arithmetic, uncompressed gradients)"


@pytest.mark.parametrize(
    ("model", "dtype"), [("ExampledBrain", "bfloat16"), ("ExampledPINN", "float64")]
)
def test_a_float32_example_input_takes_the_dtype_of_a_model_of_another(
    model: str, dtype: str
) -> None:
    # The example is float32 (made before the model was cast): its samples met the bf16 or
    # float64 parameters in the first matmul, and every trial failed ("mat1 and mat2 must have
    # the same dtype"), while the trace, whose fake matmul does not check, predicted it.
    from torch.utils.data import default_collate

    workload = build_workload(WorkloadSpec(model=f"tests.fixtures.double:{model}"))
    sample = workload.dataset[0]
    floating = sample["x"] if isinstance(sample, dict) else sample
    assert floating.dtype == getattr(torch, dtype)
    if isinstance(sample, dict):
        assert sample["steps"].dtype == torch.int64  # integers are left as they are
    assert workload.data_source == (
        f"synthetic, shaped like model.example_input, {dtype} as the model's parameters "
        "(the example is float32)"
    )
    batch = default_collate([workload.dataset[0], workload.dataset[1]])
    out = workload.model(**batch) if isinstance(batch, dict) else workload.model(batch)
    assert out.dtype == getattr(torch, dtype)
    float32 = build_workload(WorkloadSpec(model="tests.fixtures.traced:Stack"))
    assert float32.data_source == "synthetic, shaped like model.example_input"
