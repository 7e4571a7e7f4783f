"""A LightningModule trained as Lightning's Trainer trains it, without a Trainer.

Given a ``lightning.LightningModule`` (or a ``pytorch_lightning`` one), the loss is what its
``training_step(batch, batch_idx)`` returns (a tensor, or a dict with ``"loss"``) and the
optimizer is the one its ``configure_optimizers()`` returns; its ``forward`` alone would train
another loss with the tool's default AdamW. ``LightningStep`` holds the module and makes that
step its forward, so that DDP, FSDP, checkpointing, compile and the memory trace wrap it as they
wrap any model; its forward takes the whole batch (``takes_whole_batch``: nothing is split into
inputs and target). What the Trainer adds beside the step (logging, gradient clipping,
accumulation, learning-rate schedulers) is the Trainer's, not the module's: ``self.log`` warns
that no Trainer is attached and logs nothing.

Lightning is not imported: a module is told by the names of its classes.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn as nn

from autotune.errors import WorkloadError

CONFIGURED = "the LightningModule's configure_optimizers"
"""Where the optimizer comes from, in the output's words."""


def is_lightning_module(model: Any) -> bool:
    """Whether ``model`` (an instance or a class) is a Lightning ``LightningModule``."""
    cls = model if isinstance(model, type) else type(model)
    return any(
        c.__name__ == "LightningModule"
        and c.__module__.split(".")[0] in ("lightning", "pytorch_lightning")
        for c in cls.__mro__
    )


class LightningStep(nn.Module):
    """A LightningModule whose forward is its training step (module docstring)."""

    takes_whole_batch = True
    """The forward takes the batch as the DataLoader makes it (``training.forward_keywords``)."""
    step_source = "the LightningModule's training_step"
    """What the forward runs, for the trial's loss line."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        if getattr(module, "automatic_optimization", True) is False:
            raise WorkloadError(
                f"{type(module).__name__} sets automatic_optimization = False: its "
                "training_step runs the backward and the optimizer itself, which a trial runs "
                "(and times, scales, accumulates); train it with automatic optimization"
            )
        self.module: Any = module  # registered as a submodule all the same
        self.batch_idx = 0
        # said once here (the module docstring), not at every step of every trial and trace
        warnings.filterwarnings("ignore", message=r"You are trying to `self\.log\(\)`")

    def forward(self, batch: Any) -> Any:
        return self.module.training_step(batch, self._next_index())

    @torch.compiler.disable  # type: ignore[untyped-decorator]
    def _next_index(self) -> int:
        # outside a compiled forward: a module's int attribute read in it is a constant that
        # compile guards on, and a new one every step compiled the step again (164 ms a step
        # of a small classifier under compile, 1.4 ms with the index fixed); returned from
        # here it is an input of what follows, which compile makes dynamic after one
        self.batch_idx += 1
        return self.batch_idx - 1

    def to(self, *args: Any, **kwargs: Any) -> LightningStep:
        # a LightningModule keeps its device (``self.device``) in its own ``to``, which moving
        # its parent alone would pass over
        self.module.to(*args, **kwargs)
        return super().to(*args, **kwargs)

    def configured_optimizer(self, parameters: Any) -> torch.optim.Optimizer:
        """The optimizer of the module's ``configure_optimizers`` (over the module's own
        parameters, which ``parameters``, those of the model as wrapped, are)."""
        return only_optimizer(self.module.configure_optimizers())


def only_optimizer(configured: Any) -> torch.optim.Optimizer:
    """The one optimizer in what ``configure_optimizers`` returned: an optimizer, a dict with
    ``"optimizer"``, a list of either, or (optimizers, schedulers); schedulers are left out."""
    if isinstance(configured, dict):
        configured = configured.get("optimizer")
    if (
        isinstance(configured, (list, tuple))
        and len(configured) == 2
        and all(isinstance(part, (list, tuple)) for part in configured)
    ):
        configured = configured[0]  # (optimizers, schedulers)
    found = configured if isinstance(configured, (list, tuple)) else [configured]
    found = [f.get("optimizer") if isinstance(f, dict) else f for f in found]
    if len(found) != 1:
        raise WorkloadError(
            f"{CONFIGURED} returned {len(found)} optimizers (a GAN's, one for each network?); "
            "a trial trains with one: give it by --optimizer module:attr"
        )
    if not isinstance(found[0], torch.optim.Optimizer):
        raise WorkloadError(
            f"{CONFIGURED} returned a {type(found[0]).__name__}, expected a "
            "torch.optim.Optimizer (or a dict, list or tuple holding one)"
        )
    return found[0]
