"""optimizer_in_backward: each parameter stepped by its own optimizer as its gradient completes,
to the same parameters as a step after backward, holding fewer gradients at once."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn as nn

from autotune.bench.traced_step import real_step_peak
from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.runner.in_backward import InBackward
from autotune.runner.training import HookCounter, TrainStep
from workloads.gpt import autotune_dataset, gpt_tiny


def _trained(in_backward: bool, make: type[torch.optim.Optimizer], **options: object) -> nn.Module:
    torch.manual_seed(0)
    model = gpt_tiny()
    model.head.weight = model.tokens.weight  # tied: one gradient from two uses
    dataset = autotune_dataset(model)
    groups = [  # two groups, as a factory without weight decay on biases builds them
        {"params": [p for n, p in model.named_parameters() if not n.endswith("bias")]},
        {"params": [p for n, p in model.named_parameters() if n.endswith("bias")], "lr": 0.02},
    ]
    optimizer = make(groups, lr=0.01, **options)
    config = TrainConfig(global_batch_size=4, device="cpu", optimizer_in_backward=in_backward)
    step = TrainStep(
        model, optimizer, lambda out, _: out.loss, config, torch.device("cpu"), HookCounter()
    )
    batches = iter(
        torch.utils.data.default_collate([dataset[i + 4 * s] for i in range(4)]) for s in range(3)
    )
    for _ in range(3):
        step.run(batches)
    assert step.optimizer_steps == 3
    if in_backward:
        assert step.in_backward is not None and step.in_backward.steps == 3 * len(
            step.in_backward.each
        )
        assert all(p.grad is None for p in model.parameters())  # freed as each was stepped
    return model


@pytest.mark.parametrize(
    ("make", "options"),
    [
        (torch.optim.AdamW, {"weight_decay": 0.1}),
        (torch.optim.SGD, {"momentum": 0.9}),
        (torch.optim.Adagrad, {}),
    ],
)
def test_stepping_in_backward_trains_to_the_same_parameters(
    make: type[torch.optim.Optimizer], options: dict[str, object]
) -> None:
    after, in_backward = _trained(False, make, **options), _trained(True, make, **options)
    for theirs, ours in zip(after.parameters(), in_backward.parameters(), strict=True):
        assert torch.equal(theirs, ours)


def test_each_parameter_gets_its_groups_options_and_a_frozen_one_none() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].bias.requires_grad_(False)
    built = torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 0.5}],
        lr=0.1,
        momentum=0.9,
    )
    each = InBackward(built).each
    assert model[0].bias not in each and len(each) == 3
    assert each[model[1].weight].param_groups[0]["lr"] == 0.5
    assert each[model[0].weight].param_groups[0]["lr"] == 0.1
    assert each[model[0].weight].param_groups[0]["momentum"] == 0.9


def test_a_step_in_backward_holds_fewer_gradients_at_its_peak() -> None:
    def peak(in_backward: bool) -> int:
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Linear(256, 256) for _ in range(8)))
        return real_step_peak(model, torch.randn(4, 256), optimizer="SGD", in_backward=in_backward)

    grads = 8 * (256 * 256 + 256) * 4
    # every gradient at once against one layer's at most
    assert peak(False) - peak(True) == pytest.approx(grads * 7 / 8, rel=0.05)


def test_an_optimizer_that_cannot_be_rebuilt_over_one_parameter_is_refused_in_one_line() -> None:
    class Whole(torch.optim.SGD):  # built from a model, not from groups
        def __init__(self, model: nn.Module) -> None:
            super().__init__(model.parameters(), lr=0.1)

    with pytest.raises(ConfigError, match="Whole cannot be rebuilt over one parameter"):
        InBackward(Whole(nn.Linear(2, 2)))


def test_a_combination_that_needs_every_gradient_at_once_is_refused() -> None:
    for fields, named in (
        ({"parallel": "ddp", "world_size": 2}, "parallel=single (got ddp)"),
        ({"grad_accum_steps": 2}, "grad_accum_steps=1 (got 2)"),
        ({"amp": "fp16"}, "amp other than fp16, whose scaler checks every gradient (got fp16)"),
        ({"max_grad_norm": 1.0}, "no max_grad_norm"),
    ):
        with pytest.raises(
            ValueError, match=rf"optimizer_in_backward=true .* needs {re.escape(named)}"
        ):
            TrainConfig(global_batch_size=8, optimizer_in_backward=True, **fields)  # type: ignore[arg-type]


def test_a_step_in_backward_is_traced_as_it_runs() -> None:
    from autotune.bench.traced_step import built_batch
    from autotune.runner.fake_memory import trace_step
    from autotune.runner.workload import WorkloadSpec

    spec = WorkloadSpec(model="tests.fixtures.traced:WideBlocks")  # four 16 MiB blocks
    traced = {flag: trace_step(spec, 4, optimizer_in_backward=flag) for flag in (False, True)}
    model, batch = built_batch(spec, 4)
    real = real_step_peak(model, batch[0], in_backward=True)  # its inputs
    assert traced[True].total_bytes == pytest.approx(real, rel=0.001)
    # the peak was the optimizer's step beside every gradient; now one block's at most
    saved = traced[False].total_bytes - traced[True].total_bytes
    assert saved == pytest.approx(3 * 16 * 2**20, rel=0.01)
    assert traced[True].gradients_bytes == 16 * 2**20 and traced[True].unused_parameters == 0


# torch's scheduler warns of a step before optimizer.step(), never called here: the same rates
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step()`")
def test_a_scheduler_on_the_optimizer_leads_every_parameters_rate_and_state_round_trips() -> None:
    def trained(in_backward: bool) -> tuple[nn.Module, InBackward | None]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        stepper = InBackward(optimizer) if in_backward else None
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
        for step in range(3):
            model(torch.full((2, 4), float(step + 1))).sum().backward()
            if stepper is None:
                optimizer.step()
                optimizer.zero_grad()
            schedule.step()
        return model, stepper

    (after, _), (during, stepper) = trained(False), trained(True)
    for theirs, ours in zip(after.parameters(), during.parameters(), strict=True):
        assert torch.equal(theirs, ours)
    assert stepper is not None
    saved = stepper.state_dict()  # the optimizer's own form: it loads either way
    assert saved["state"][0]["step"] == 3 and saved["param_groups"][0]["lr"] == pytest.approx(1e-4)
    plain = torch.optim.AdamW(after.parameters(), lr=0.1)
    plain.load_state_dict(copy.deepcopy(saved))  # loading keeps the tensors it is given
    stepper.remove()  # the next takes its place
    again = InBackward(torch.optim.AdamW(during.parameters(), lr=0.1))
    again.load_state_dict(copy.deepcopy(saved))  # its rate too, 1e-4: the groups made anew
    for model, step in ((after, plain), (during, None)):
        model(torch.ones(2, 4)).sum().backward()
        if step is not None:
            step.step()
    for theirs, ours in zip(after.parameters(), during.parameters(), strict=True):
        assert torch.equal(theirs, ours)  # resumed alike: the same state and rate
    assert again.steps == 4  # each of the 4 tensors stepped once, by the one that took over


def test_a_trainer_that_still_steps_the_optimizer_changes_nothing_more() -> None:
    # the Hugging Face Trainer and Lightning call optimizer.step() and zero_grad() themselves
    def trained(trainer_steps: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
        InBackward(optimizer)
        for _ in range(2):
            model(torch.ones(2, 4)).sum().backward()
            if trainer_steps:
                optimizer.step()
                optimizer.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    for ours, theirs in zip(trained(False), trained(True), strict=True):
        assert torch.equal(ours, theirs)
