"""A forward that takes the target (nanoGPT's ``forward(idx, targets=None)``) is given it from
a tuple batch, as the training loop's ``model(x, y)`` gives it, and its own loss is the loss."""

from __future__ import annotations

import pytest
import torch

from autotune.api import run_trial
from autotune.runner.fake_memory import trace_step
from autotune.runner.loss import DefaultLoss
from autotune.runner.training import required_parameter, split_batch, target_into, target_parameter
from autotune.runner.workload import WorkloadSpec
from tests.fixtures.nano_gpt import GPT, Adapted, Scored, Tokens
from tests.helpers import FEW

MODEL = "tests.fixtures.nano_gpt:GPT"


def test_a_tuple_batchs_target_goes_to_the_forwards_optional_target_parameter() -> None:
    assert target_parameter(GPT()) == ("targets", 1)
    # a wrapper passing everything on (PEFT's PeftModel) is read through the model it wraps
    assert target_parameter(Adapted()) == ("targets", 1)
    assert target_parameter(torch.nn.Linear(2, 2)) is None

    class Required(torch.nn.Module):  # a second input that happens to be named y
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

    assert target_parameter(Required()) is None
    assert required_parameter(Required()) == ("y", 1)  # model(x, y) is the only call
    assert required_parameter(GPT()) is None and required_parameter(Adapted()) is None

    class Triplet(torch.nn.Module):  # (anchor, positive, negative) samples, model(*batch)
        def forward(self, a: torch.Tensor, p: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
            return (a - p).square().sum() - (a - n).square().sum()

    into = required_parameter(Triplet())
    assert into == ("n", 2)
    a, p, n = torch.ones(2), torch.zeros(2), torch.full((2,), 3.0)
    args, kwargs, target = split_batch((a, p, n), None, into)
    assert args[0] is a and args[1] is p and kwargs["n"] is n and target is n
    assert Triplet()(*args, **kwargs) == -6

    class Conditioned(torch.nn.Module):  # guided diffusion's class labels: an input
        def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> None:
            pass

    assert target_parameter(Conditioned()) is None
    x, y = Tokens()[0]
    args, kwargs, target = split_batch((x, y), frozenset({"idx", "targets"}), ("targets", 1))
    assert args == (x,) and kwargs == {"targets": y} and target is y
    # two inputs already fill the forward's first two parameters: the target is not passed
    args, kwargs, _ = split_batch((x, x, y), None, ("targets", 1))
    assert len(args) == 2 and kwargs == {}


def test_the_models_own_loss_is_taken_where_its_forward_was_given_the_target() -> None:
    # nanoGPT's (logits, loss): the target went nowhere, so its forward gave the last
    # position's logits alone, and cross-entropy against every position's targets failed.
    x, y = (torch.stack(t) for t in zip(*(Tokens()[i] for i in range(4)), strict=True))
    model = GPT()
    logits, own = model(x, y)
    loss_fn = DefaultLoss()
    assert loss_fn((logits, own), y, fed=True) is own
    assert loss_fn.rule == (
        "the model's own loss, the scalar item 1 of its output (its forward was given the target)"
    )
    loss_fn((logits, own), y)  # not given it: a scalar beside the logits is an auxiliary loss
    assert "item 1 is left out (an auxiliary loss?" in loss_fn.rule


@pytest.mark.slow  # a model shape: the default run keeps the forward that needs its target
def test_a_nanogpt_style_model_trains_and_is_traced_as_written() -> None:
    config = {"global_batch_size": 8, "parallel": "ddp", "world_size": 2, "device": "cpu"}
    result = run_trial(MODEL, config, **FEW)
    assert result.status == "ok", result.message
    assert result.loss_rule.startswith("the model's own loss, the scalar item 1")
    traced = trace_step(WorkloadSpec(model=MODEL), 8)  # the trace fell back before
    assert traced.total_bytes > traced.parameters_bytes


def test_a_forward_that_cannot_run_without_the_target_is_given_it() -> None:
    # a discriminator's forward(x, y) returning its loss was called as model(x): every trial
    # failed its first step ("missing 1 required positional argument: 'y'")
    assert target_into(Scored(), DefaultLoss()) == ("y", 1)
    assert target_into(Scored(), torch.nn.functional.mse_loss) == ("y", 1)  # a user's loss too
    assert target_into(GPT(), torch.nn.functional.mse_loss) is None
    result = run_trial("tests.fixtures.nano_gpt:Scored", {"global_batch_size": 8}, **FEW)
    assert result.status == "ok", result.message
    assert result.loss_rule == "the model's scalar output"
    traced = trace_step(WorkloadSpec(model="tests.fixtures.nano_gpt:Scored"), 8)
    assert traced.total_bytes > traced.parameters_bytes


@pytest.mark.slow  # a model shape: the default run keeps the forward that needs its target
def test_a_wrapped_model_is_given_the_target_through_its_wrapper() -> None:
    # PEFT's LoRA wrapper of a Hugging Face GPT-2 took (*args, **kwargs): its labels were never
    # passed, and a cross-entropy of unshifted tokens stood in for the model's own loss.
    result = run_trial("tests.fixtures.nano_gpt:Adapted", {"global_batch_size": 8}, **FEW)
    assert result.status == "ok", result.message
    assert result.loss_rule.startswith("the model's own loss, the scalar item 1")


def test_a_dict_of_losses_alone_is_summed() -> None:
    # torchvision's detection models return {"loss_classifier": ..., "loss_box_reg": ...}: the
    # first of them, squared, stood in ("the output's mean square (no target: speed only)")
    a, b = torch.tensor(0.5, requires_grad=True), torch.tensor(2.0, requires_grad=True)
    loss_fn = DefaultLoss()
    named = {"loss_classifier": a, "loss_box_reg": b}
    assert float(loss_fn(named, None)) == 2.5
    assert loss_fn.rule == "the sum of the model's own losses, 'loss_classifier', 'loss_box_reg'"
    unnamed = {"classification": a, "bbox_regression": b}  # RetinaNet's: given the targets
    assert float(loss_fn(unnamed, [{"labels": torch.tensor([1])}], fed=True)) == 2.5
    # not given them, keys that name no loss are no losses of the model's own
    assert float(loss_fn(unnamed, None)) == 0.25
    assert loss_fn.rule.startswith("the output's mean square (no target: speed only); the ")
    assert "scalar 'bbox_regression' is left out" in loss_fn.rule
    loss_fn(torch.ones(2, 3), [{"labels": torch.tensor([1])}])
    assert loss_fn.rule == (
        "the output's mean square (speed only: the target, a list, is no tensor a default rule "
        "takes; pass --loss)"
    )


@pytest.mark.slow  # a model shape: the default run sums a dict of losses in process
def test_a_torchvision_style_detector_trains_on_the_sum_of_its_losses() -> None:
    result = run_trial("tests.fixtures.detection:Detector", {"global_batch_size": 8}, **FEW)
    assert result.status == "ok", result.message
    assert result.loss_rule == (
        "the sum of the model's own losses, 'classification', 'bbox_regression'"
    )


@pytest.mark.slow  # a model shape: the default run keeps the forward that needs its target
def test_a_forward_that_takes_the_batch_dict_whole_is_given_it() -> None:
    # forward(self, batch) on dict samples: every trial failed with "got an unexpected keyword
    # argument 'features'", and its note blamed the samples' string ids
    result = run_trial("tests.fixtures.batch_forward:Model", {"global_batch_size": 8}, **FEW)
    assert result.status == "ok", result.message
    assert result.loss_rule == "the model's scalar output"
    failed = run_trial(
        "tests.fixtures.batch_forward:Tensors",
        {"global_batch_size": 8},
        data="tests.fixtures.batch_forward:Rows",
        **FEW,
    )
    assert failed.status == "error"
    assert "(the batch went whole to the forward as its first argument, a dict of 'features', " in (
        failed.message or ""
    )


@pytest.mark.slow  # one model's message from a trial
def test_a_forward_that_failed_on_the_target_given_as_its_state_says_where_it_went() -> None:
    # PyTorch examples' word-language model: forward(input, hidden). The target went to
    # `hidden`, as model(*batch) passes it, and the trial said only what the LSTM said of it
    # ("hx and cx should also be 3-D"), of a state the user never passed.
    result = run_trial(
        "tests.fixtures.word_lm:RNNModel", {"global_batch_size": 8, "device": "cpu"}, **FEW
    )
    assert result.status == "error"
    assert "(the forward was given the batch's target as 'hidden', its last required" in (
        result.message
    )
    assert "a wrapper taking the inputs alone" in result.message


def test_a_target_given_to_a_parameter_named_for_it_adds_no_note() -> None:
    from autotune.runner.hints import target_input_hint

    y = torch.zeros(2)
    assert target_input_hint({"targets": y}, y) is None  # nanoGPT's, meant for it
    assert target_input_hint({}, y) is None  # went to the loss alone
    assert target_input_hint({"n": y}, y) is not None  # a triplet's negative: said, if it fails
