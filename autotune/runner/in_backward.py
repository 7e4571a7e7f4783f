"""The optimizer stepped in backward (``optimizer_in_backward``): each parameter updated as soon
as its gradient is complete, and that gradient freed at once, so that a step never holds every
gradient together.

A step that updates after backward holds the gradient of every parameter at its end, beside
the optimizer's state: for AdamW in fp32, a quarter of what the parameters, gradients and state
take. Here each parameter that trains gets an optimizer of its own, the user's class rebuilt over
that one parameter with its group's options, and its post-accumulate-grad hook
(``Tensor.register_post_accumulate_grad_hook``) steps it and sets its gradient to None: torch's
recipe "How to save memory by fusing the optimizer step into the backward pass", torchtune's
``optimizer_in_bwd``. The updates are those of the optimizer stepped after backward for one that
updates each parameter alone (SGD, AdamW and Adagrad tested to the bit); what needs
every gradient at once cannot run so (a gradient scaler's check for infinities, clipping by the
total norm, accumulation over micro-batches, a data-parallel reduction after backward), and
``TrainConfig`` refuses those combinations. The per-parameter steps give up the foreach and
fused forms' batching over parameters: a cost in speed the trials measure.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from autotune.errors import ConfigError
from autotune.runner.optimizer import OPTIMIZER_STEP, rebuilt


def group_of(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict[str, Any]:
    """The parameter group of ``optimizer`` that holds ``param``."""
    return next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))


def rebuilt_over(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> Any:
    """An optimizer of ``optimizer``'s class over ``param`` alone, with the options of the group
    that holds it (``optimizer`` just built, no state yet)."""
    group = group_of(optimizer, param)
    try:
        return rebuilt(optimizer, [{**group, "params": [param]}])
    except Exception as error:  # a class built otherwise than (groups, **options)
        raise ConfigError(
            f"optimizer_in_backward=true: {type(optimizer).__name__} cannot be rebuilt over one "
            "parameter "
            f"({type(error).__name__}: {error}); use optimizer_in_backward=false"
        ) from None


class InBackward:
    """One optimizer a trainable parameter of ``optimizer``'s, each stepped by its parameter's
    post-accumulate-grad hook in backward. ``optimizer`` itself is never stepped, but it leads:
    each step first takes its group's options as they are then (a learning-rate scheduler's on
    ``optimizer`` moves every parameter's rate) and keeps the parameter's state in
    ``optimizer.state``, so that ``optimizer.state_dict()`` saves it in the usual form and
    ``optimizer.load_state_dict`` restores it (a checkpoint loads under either way of stepping).
    ``steps`` counts the parameters stepped."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        around: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        """``around`` makes a context each parameter's step runs in (a trace's concrete
        scalars: ``fake_memory``)."""
        self.optimizer, self.around = optimizer, around
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        self.each: dict[torch.Tensor, Any] = {p: rebuilt_over(optimizer, p) for p in params}
        self._group = {p: i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
        """Each parameter's group by its place: ``load_state_dict`` makes the groups anew."""
        self.steps = 0
        self.stepped: set[torch.Tensor] = set()
        """The parameters stepped so far (a gradient they had: the others had none)."""
        self._handles = [
            p.register_post_accumulate_grad_hook(self._step)  # type: ignore[no-untyped-call]
            for p in self.each
        ]

    def _step(self, param: torch.Tensor) -> None:
        stepper = self.each[param]
        led = stepper.param_groups[0]
        group = self.optimizer.param_groups[self._group[param]]
        led.update({k: v for k, v in group.items() if k != "params"})
        stepper.state = self.optimizer.state  # replaced, not updated, by load_state_dict
        try:
            with self.around():
                stepper.step()
        except Exception as error:  # said with the error: the user's optimizer, not the model
            error.add_note(f"{OPTIMIZER_STEP} ({type(stepper).__name__}, in backward)")
            raise
        stepper.zero_grad(set_to_none=True)
        self.steps += 1
        self.stepped.add(param)

    def optimizers(self) -> list[Any]:
        """The per-parameter optimizers (their state is the optimizer's state)."""
        return list(self.each.values())

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's ``state_dict``: every parameter's state, in the usual form."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """An optimizer ``state_dict`` (saved stepping in backward or after it) into the
        optimizer, whose state each parameter's step then takes."""
        self.optimizer.load_state_dict(state)

    def remove(self) -> None:
        """Take the hooks off: the parameters' gradients are then kept as usual."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
