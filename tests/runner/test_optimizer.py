"""The user's optimizer: found like the dataset, used by every trial, named in what it reports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import autotune
from autotune.api import run_trial
from autotune.apply import prepare
from autotune.config import TrainConfig
from autotune.errors import WorkloadError
from autotune.runner.workload import (
    WorkloadSpec,
    build_workload,
    check_workload,
    describe_optimizer,
)
from autotune.search.meta_build import check_optimizer
from tests.fixtures.optimizers import PARAMETER_BYTES, Features, Wide
from tests.fixtures.optimizers import decayed as decayed_factory
from tests.helpers import FEW

MODULE = "tests.fixtures.optimizers"
MODEL = f"{MODULE}:Wide"
CONFIG = {"global_batch_size": 8, "device": "cpu"}


def _trial(optimizer: str | None) -> object:
    return run_trial(MODEL, CONFIG, optimizer=optimizer, **FEW)


def test_the_modules_sgd_reaches_the_trial_and_its_peak_lies_below_adamws_by_its_state() -> None:
    sgd = _trial(None)  # the module's autotune_optimizer: SGD without momentum, no state
    adamw = _trial("tests.fixtures.optimizers:adamw")
    assert sgd.status == adamw.status == "ok", (sgd.message, adamw.message)
    assert sgd.optimizer == "SGD" and adamw.optimizer == "AdamW"
    assert {r.optimizer for r in sgd.ranks} == {"SGD"}
    assert adamw.workload["optimizer"] == "tests.fixtures.optimizers:adamw"
    # AdamW's exp_avg and exp_avg_sq, and at its step's peak the foreach temporaries (its
    # denominators and the update: up to two more copies of the parameters; a clean-clone run
    # measured 1.76 times the state); plain SGD holds none of these.
    state = 2 * PARAMETER_BYTES
    difference = adamw.peak_memory_bytes - sgd.peak_memory_bytes
    assert 0.8 * state < difference < 2.0 * state, (difference / 2**20, state / 2**20)


def test_the_default_is_adamw_and_says_how_to_give_yours() -> None:
    spec = WorkloadSpec(model="tests.fixtures.models:Small")
    assert build_workload(spec).optimizer is None
    source = describe_optimizer(spec)
    assert source.startswith("default AdamW") and "--optimizer module:attr" in source
    assert describe_optimizer(WorkloadSpec(model=MODEL)) == f"{MODULE}:autotune_optimizer"


def test_a_model_file_s_optimizer_and_dataset_are_named_by_the_file(tmp_path: Path) -> None:
    # Named as the user named the model, so the name can be given back (--optimizer, --data),
    # not as the module the file is imported under.
    (tmp_path / "mine.py").write_text(
        "from tests.fixtures.optimizers import Wide, autotune_dataset, autotune_optimizer\n"
    )
    spec = WorkloadSpec(model=f"{tmp_path}/mine.py:Wide")
    assert describe_optimizer(spec) == f"{tmp_path}/mine.py:autotune_optimizer"
    assert build_workload(spec).data_source == f"{tmp_path}/mine.py:autotune_dataset"


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("tests.fixtures.optimizers:NOT_CALLABLE", "is a int, expected a factory"),
        ("tests.fixtures.optimizers:missing", "has no attribute 'missing'"),
        ("nowhere:sgd", "--optimizer: no module named 'nowhere'"),
        ("torch.optim:Adamw", "has no attribute 'Adamw'; did you mean 'AdamW' or"),  # __all__'s
    ],
)
def test_a_bad_optimizer_reference_is_one_line(reference: str, expected: str) -> None:
    with pytest.raises(WorkloadError, match=expected):
        check_workload(WorkloadSpec(model=MODEL, optimizer=reference))


def test_a_factory_that_returns_no_optimizer_fails_the_trial_with_its_reason() -> None:
    result = _trial("tests.fixtures.optimizers:not_an_optimizer")
    assert result.status == "error"
    assert "returned a str, expected a torch.optim.Optimizer" in result.message


def test_an_optimizer_whose_step_needs_a_closure_is_refused_saying_why() -> None:
    # LBFGS failed in its first step with "step() missing 1 required positional argument".
    result = _trial("tests.fixtures.optimizers:lbfgs")
    assert result.status == "error"
    assert "returned a LBFGS, whose step needs a closure that evaluates the loss again" in (
        result.message
    )
    # a search and a plan say it before any trial
    with pytest.raises(WorkloadError, match="returned a LBFGS, whose step needs a closure"):
        autotune.plan(MODEL, optimizer="tests.fixtures.optimizers:lbfgs", devices=2,
                      device_memory="8GiB", global_batch_size=8)  # fmt: skip
    assert check_optimizer(WorkloadSpec(model=MODEL)) is None  # the module's SGD is fine


@pytest.mark.slow  # one factory signature from a trial
@pytest.mark.usefixtures("one_rank_group")
def test_a_factory_that_names_its_parameter_model_is_given_the_model() -> None:
    # A user's factory grouping parameters by name (no weight decay for biases) failed every
    # trial with "'generator' object has no attribute 'named_parameters'".
    decayed = f"{MODULE}:decayed"
    assert check_optimizer(WorkloadSpec(model=MODEL, optimizer=decayed)) is None
    config = TrainConfig(global_batch_size=8, device="cpu", parallel="ddp", world_size=1)
    training = prepare(config, Wide(), Features(), optimizer=decayed_factory)
    try:
        groups = training.optimizer.param_groups
        assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
        trained = {id(p) for p in training.model.parameters()}
        assert {id(p) for g in groups for p in g["params"]} == trained  # the wrapper's own
        assert [p.ndim for p in groups[0]["params"]] == [2] * 4
    finally:
        training.close()
    result = _trial(decayed)
    assert result.status == "ok", result.message
    assert result.optimizer == "AdamW"


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (
            "named_from_parameters",
            "'generator' object has no attribute 'named_parameters' (it is given the model's "
            "parameters; a factory that wants the model names its first parameter one of: model,",
        ),
        (
            "with_schedule",
            "returned a tuple, expected a torch.optim.Optimizer alone (a learning-rate schedule "
            "changes neither",
        ),
    ],
)
def test_a_factory_written_for_another_contract_is_told_which_before_any_trial(
    factory: str, expected: str
) -> None:
    with pytest.raises(WorkloadError, match=re.escape(expected)):
        check_optimizer(WorkloadSpec(model=MODEL, optimizer=f"{MODULE}:{factory}"))


def test_an_error_in_the_optimizer_s_step_is_said_to_be_there() -> None:
    # A user's Adafactor under FSDP2: "warm-up step 1: RuntimeError: aten.add_.Tensor got mixed
    # torch.Tensor and DTensor" did not say the optimizer, not the model, raised it.
    result = _trial("tests.fixtures.optimizers:refusing")
    assert result.status == "error"
    assert result.message == (
        "rank 0: warm-up step 1: in the optimizer's step (_Refusing): RuntimeError: aten.add_."
        "Tensor got mixed torch.Tensor and DTensor (at tests/fixtures/optimizers.py:78, in step)"
    )


def test_an_error_in_clipping_is_said_to_be_there_not_in_the_optimizer_s_step() -> None:
    # --max-grad-norm over a sparse gradient failed in clip_grad_norm_ and was said as "in the
    # optimizer's step (SGD)"; a lookup's are refused before the trial, a hook's are not.
    result = run_trial(
        "tests.fixtures.sparse:SparsenedGradient",
        {**CONFIG, "max_grad_norm": 1.0},
        data="tests.fixtures.sparse:autotune_dataset",
        **FEW,
    )  # fmt: skip
    assert result.status == "error"
    assert result.message.startswith(
        "rank 0: warm-up step 1: in clipping the gradients (clip_grad_norm_): "
        "NotImplementedError: Could not run 'aten::linalg_vector_norm'"
    ), result.message


def test_the_trial_summary_names_the_optimizer() -> None:
    from autotune.config import make_config
    from autotune.report import format_trial
    from autotune.result import TrialResult

    stats = {"samples_per_s": 100.0, "step_time_median_s": 0.08, "step_time_p10_s": 0.07,
             "step_time_p90_s": 0.09, "step_time_spread": 0.25, "data_wait_share": 0.0,
             "measured_steps": 4}  # fmt: skip
    config = make_config({"global_batch_size": 8, "device": "cpu"})
    given = {"optimizer": "mypkg.opt:sgd"}
    text = format_trial(TrialResult(config=config, status="ok", optimizer="SGD", **stats))
    assert "  optimizer     SGD\n" in text + "\n"
    text = format_trial(
        TrialResult(config=config, status="ok", optimizer="SGD", workload=given, **stats)
    )
    assert "  optimizer     SGD (--optimizer mypkg.opt:sgd)" in text
