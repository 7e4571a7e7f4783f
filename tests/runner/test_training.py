"""The training step in one process: AMP, scaler and accumulation, without launching ranks."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch

from autotune.config import TrainConfig, make_config
from autotune.errors import rank_hint
from autotune.runner.hints import double_hint, input_hint, target_hint, tuple_hint
from autotune.runner.loss import default_loss
from autotune.runner.session import prepare
from autotune.runner.training import TrainStep, check_loss, prepare_model, split_batch
from tests.helpers import FEW
from workloads.mlp import autotune_dataset, mlp_tiny


def _step(**values: object) -> tuple[TrainStep, object]:
    config = make_config({"global_batch_size": 8, "device": "cpu", **values})
    model = mlp_tiny()
    dataset = autotune_dataset(model)
    wrapped, hooks, _, _ = prepare_model(model, config, torch.device("cpu"))
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    step = TrainStep(wrapped, optimizer, default_loss, config, torch.device("cpu"), hooks)
    loader = torch.utils.data.DataLoader(dataset, batch_size=config.micro_batch_size)
    return step, iter(loader)


def test_accumulation_steps_the_optimizer_once_per_k_micro_batches() -> None:
    step, batches = _step(grad_accum_steps=4)
    for _ in range(3):
        step.run(batches)
    assert step.micro_steps == 12
    assert step.optimizer_steps == 3


def test_bf16_autocast_changes_the_matmul_dtype() -> None:
    plain, batches = _step()
    plain.run(batches)
    assert plain.output_dtype == torch.float32
    amp, batches = _step(amp="bf16")
    amp.run(batches)
    assert amp.output_dtype == torch.bfloat16


def test_fp16_uses_a_working_gradient_scaler_on_cpu() -> None:
    step, batches = _step(amp="fp16")
    before = [p.detach().clone() for p in step.model.parameters()]
    step.run(batches)
    assert step.output_dtype == torch.float16
    assert step.scaler is not None and step.scaler.is_enabled()
    assert step.scaler.get_scale() > 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, step.model.parameters(), strict=True))


def test_batches_split_by_structure() -> None:
    x, y = torch.zeros(2), torch.ones(2)
    assert split_batch(x) == ((x,), {}, None)
    assert split_batch((x, y)) == ((x,), {}, y)
    assert split_batch([x]) == ((x,), {}, None)
    batch = {"input_ids": x}
    assert split_batch(batch) == ((), batch, batch)


def test_a_dict_of_inputs_beside_its_target_goes_by_keyword() -> None:
    # (inputs, target) for model(**inputs), as a diffusion loop writes it: the dict went whole
    # as the forward's first argument, and the target into its last required parameter.
    x, t, noise = torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3)
    inputs = {"x": x, "t": t}
    assert split_batch((inputs, noise), frozenset({"x", "t"}), ("t", 1)) == ((), inputs, noise)
    assert split_batch((inputs, noise)) == ((), inputs, noise)  # nothing known of the forward
    # the target into the parameter the dict leaves free, as model(x, y) takes it
    into = split_batch(({"x": x}, noise), frozenset({"x", "y"}), ("y", 1))
    assert into == ((), {"x": x, "y": noise}, noise)
    # a forward taking none of its keys: the dict whole, as before
    other = {"a": x}
    assert split_batch((other, noise), frozenset({"batch"})) == ((other,), {}, noise)


def test_a_denoiser_fed_a_dict_of_inputs_and_its_noise_trains_and_traces() -> None:
    from autotune.api import run_trial
    from autotune.runner.fake_memory import trace_step
    from autotune.runner.workload import WorkloadSpec

    model = "tests.fixtures.denoiser:Denoiser"
    fast = {"warmup_steps": 1, "measured_steps": 2, "target_interval": 0}
    result = run_trial(model, {"global_batch_size": 8, "device": "cpu"}, **fast)
    assert result.status == "ok", result.message
    assert trace_step(WorkloadSpec(model=model), 8).activations_bytes > 0


def test_kept_gradients_train_exactly_as_gradients_set_to_none() -> None:
    # The path CUDA graphs with accumulation take (gradients of their own, zeroed in place, each
    # micro-step marked as a new replay), forced on a CPU: the same training, bit for bit.
    runs = []
    for keep in (False, True):
        torch.manual_seed(0)
        step, batches = _step(grad_accum_steps=2)
        assert not step.keep_grads  # on its own, only CUDA graphs on CUDA take it
        step.keep_grads = keep
        losses = [step.run(batches).loss for _ in range(3)]
        grads = [p.grad for p in step.model.parameters()]
        runs.append((losses, [p.detach().clone() for p in step.model.parameters()], grads))
    (plain_losses, plain_params, plain_grads), (kept_losses, kept_params, kept_grads) = runs
    assert plain_losses == kept_losses
    assert all(torch.equal(a, b) for a, b in zip(plain_params, kept_params, strict=True))
    assert all(g is None for g in plain_grads)
    assert all(g is not None and not g.any() for g in kept_grads)  # zeroed, still there


class _SlowToStart(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each process's first sample takes 0.3 s, as a DataLoader worker's start-up can."""

    def __init__(self) -> None:
        self.pid = 0

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pid != os.getpid():
            self.pid = os.getpid()
            time.sleep(0.3)
        return torch.randn(8), torch.randn(4)


def test_the_wait_for_an_epochs_first_batch_is_counted_apart_from_the_step() -> None:
    # What the pruning rule does not hold against one step (autotune.runner.window): paid once
    # an epoch, where a worker that is not persistent starts again.
    config = TrainConfig(global_batch_size=8, device="cpu", num_workers=1)
    training = prepare(config, torch.nn.Linear(8, 4), _SlowToStart())
    batches = training.batches()
    first = training.step(batches)
    waited = training.epoch_start_s
    assert 0.3 <= waited <= first.wall_s
    for _ in range(3):  # 8 batches an epoch
        training.step(batches)
    assert training.epoch_start_s == waited
    training.start_next_epoch()
    training.step(batches)
    assert training.epoch_start_s >= waited + 0.3
    training.close()


def _first_step_notes(model: torch.nn.Module, dataset: Any, raised: type[Exception]) -> Any:
    """The notes on the ``raised`` error of the first step of ``model`` on ``dataset``, on one
    device (a micro-batch of 8)."""
    training = prepare(TrainConfig(global_batch_size=8, device="cpu"), model, dataset)
    try:
        with pytest.raises(raised) as error:
            training.step(training.batches())
    finally:
        training.close()
    return error.value.__notes__


def test_a_forward_failing_on_strings_says_a_collate_function_makes_tensors() -> None:
    from tests.fixtures.texts import Net, Texts

    assert _first_step_notes(Net(), Texts(), AttributeError) == [
        "the model was given a tuple of 8 str as input 0, not a tensor: a collate function "
        "(--collate module:attr, or autotune_collate in the model's module) makes tensors of "
        "the samples"
    ]
    # tensors, however nested, give no hint; what is not one is named where it sits
    assert input_hint((torch.zeros(2), [torch.zeros(1)]), {"mask": torch.ones(2)}) is None
    assert input_hint((), {"ids": torch.zeros(2), "meta": {"lang": "en"}}) == (
        input_hint((), {"meta": {"lang": "en"}})
    )
    assert "a str in a dict as 'meta'" in str(input_hint((), {"meta": {"lang": "en"}}))


def test_a_forward_given_more_inputs_than_it_takes_from_a_long_tuple_says_how_it_was_split() -> (
    None
):
    from torch.utils.data import Dataset

    class Weighted(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
        def __len__(self) -> int:
            return 16

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return torch.randn(4), torch.tensor(i % 2), torch.tensor(0.5)  # input, label, weight

    assert _first_step_notes(torch.nn.Linear(4, 2), Weighted(), TypeError) == [
        "a tuple batch is (inputs..., target): its 3 items went to the forward as 2 inputs and "
        "the last as the target; samples with more than an input and a target (a weight, an id) "
        "can be dicts, passed as keyword arguments, with the loss given by --loss or "
        "autotune_loss"
    ]
    assert tuple_hint(TypeError("takes 2 positional arguments"), (1, 2)) is None  # (x, y): fine
    assert tuple_hint(ValueError("positional argument"), (1, 2, 3)) is None


def test_float64_samples_for_a_float32_model_are_said_with_the_fix() -> None:
    # Samples from a numpy table (float64) failed every trial with torch's "mat1 and mat2 must
    # have the same dtype, but got Double and Float" and nothing else.
    model, rows = torch.nn.Linear(3, 2), torch.zeros(4, 3, dtype=torch.float64)
    with pytest.raises(RuntimeError) as raised:
        model(rows)
    hint = double_hint(raised.value, model, ((rows,), {}))
    assert hint is not None and hint.startswith(
        "the batch holds float64 tensors, as numpy arrays and pandas give them"
    )
    assert rank_hint(f"rank 0: warm-up step 1: RuntimeError: {raised.value} ({hint})") == hint
    assert double_hint(raised.value, model, ((rows.float(),), {})) is None  # not the cause
    assert double_hint(raised.value, model.double(), ((rows,), {})) is None


def _loss_step(
    model: torch.nn.Module, loss: Any, accepts: frozenset[str] | None = None
) -> TrainStep:
    """A step of ``model`` (SGD, global batch 8, on the CPU) whose loss is ``loss``."""
    config = make_config({"global_batch_size": 8, "device": "cpu"})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hooks = prepare_model(model, config, torch.device("cpu"))[1]
    return TrainStep(model, optimizer, loss, config, torch.device("cpu"), hooks, accepts=accepts)


def test_a_loss_given_no_target_says_where_targets_come_from() -> None:
    # A user's loss over synthetic samples (--input-shape: lone tensors) failed with torch's
    # "argument 'target' ... must be Tensor, not NoneType" and nothing else.
    step = _loss_step(torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy)
    with pytest.raises(TypeError) as raised:
        step.run(iter([torch.zeros(8, 3)]))
    (hint,) = raised.value.__notes__
    assert hint.startswith("the batch holds no target, a lone tensor or synthetic samples")
    assert rank_hint(f"rank 0: warm-up step 1: TypeError: {raised.value} ({hint})") == hint
    assert target_hint(TypeError("not NoneType"), torch.zeros(8)) is None  # a target: not it
    assert target_hint(RuntimeError("None"), None) is None
    # a forward that asks for its targets in training (torchvision's detection models)
    asks = AssertionError("targets should not be none when in training mode")
    said = target_hint(asks, None, forward=True) or ""
    assert "so the forward was given none: give samples of (input, target)" in said
    assert target_hint(asks, [{"boxes": torch.zeros(1, 4)}], forward=True) is None
    assert target_hint(RuntimeError("mat1 and mat2 shapes"), None, forward=True) is None


def test_a_loss_that_reads_a_dict_batch_as_a_tensor_is_told_it_was_given_the_batch() -> None:
    # A DLRM's loss over {"dense", "sparse", "labels"} samples failed with "'dict' object has no
    # attribute 'size'" and nothing else: a dict batch is its loss's target whole.
    class Dense(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def forward(self, dense: torch.Tensor) -> torch.Tensor:
            return self.layer(dense).squeeze(1)

    loss = torch.nn.functional.binary_cross_entropy_with_logits
    step = _loss_step(Dense(), loss, accepts=frozenset({"dense"}))
    batch = {"dense": torch.zeros(8, 3), "labels": torch.ones(8)}
    with pytest.raises((TypeError, AttributeError)) as raised:
        step.run(iter([batch]))
    (hint,) = raised.value.__notes__
    assert hint == (
        "the loss was given the whole batch as its target, a dict of dense, labels, as --loss "
        "and autotune_loss are called on a dict batch: read target['labels'] in the loss"
    )
    assert rank_hint(f"rank 0: warm-up step 1: TypeError: {raised.value} ({hint})") == hint
    assert target_hint(RuntimeError("shapes"), batch) is None  # not how a dict fails
    assert "read the target's key in it" in (target_hint(TypeError("x"), {"a": 1}) or "")


def test_a_loss_that_is_not_a_scalar_is_refused_naming_its_shape() -> None:
    check_loss(torch.tensor(1.0))
    check_loss(torch.ones(1))  # one element: backward starts from it
    with pytest.raises(ValueError, match=r"returned a tensor of shape \(8, 4\), not a scalar"):
        check_loss(torch.ones(8, 4))
    with pytest.raises(ValueError, match="returned a float, not a scalar tensor"):
        check_loss(0.5)


@pytest.mark.usefixtures("rank_in_this_process")
def test_a_ranks_reason_ends_with_the_hint_the_forward_left() -> None:
    from autotune.runner.rank import run_rank
    from autotune.runner.request import TrialOptions, TrialRequest
    from autotune.runner.workload import WorkloadSpec

    request = TrialRequest(
        config=TrainConfig(global_batch_size=8, device="cpu"),
        workload=WorkloadSpec(model="tests.fixtures.texts:Net"),
        options=TrialOptions(**FEW),
    )
    report = run_rank(request, 0)
    assert report.status == "error"
    assert report.message.startswith("warm-up step 1: AttributeError: ")
    assert report.message.endswith(
        " (the model was given a tuple of 8 str as input 0, not a "
        "tensor: a collate function (--collate module:attr, or autotune_collate in the model's "
        "module) makes tensors of the samples)"
    )


def test_a_ranks_reason_says_where_in_code_outside_torch_and_autotune_it_was_raised() -> None:
    # a loss written for another model of the module ("iteration over a 0-d tensor", raised
    # inside torch's Tensor.__iter__): the reason alone did not say which line
    from autotune.runner.rank import raised_at

    def autotune_loss(output: torch.Tensor, target: object) -> torch.Tensor:
        recon, commit = output
        return recon + commit

    with pytest.raises(TypeError) as raised:
        autotune_loss(torch.tensor(1.0), None)
    line = autotune_loss.__code__.co_firstlineno + 1
    assert raised_at(raised.value) == f"tests/runner/test_training.py:{line}, in autotune_loss"
    assert raised_at(ValueError("never raised")) is None  # no frame
