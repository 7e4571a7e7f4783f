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

import functools
import warnings
from typing import Any

import torch
import torch.nn as nn

from autotune.errors import WorkloadError

CONFIGURED = "the LightningModule's configure_optimizers"
"""Where the optimizer comes from, in the output's words."""


_PACKAGES = ("lightning", "pytorch_lightning")


def _lightnings(cls: type) -> bool:
    """Whether ``cls`` is one of Lightning's own classes."""
    return cls.__module__.split(".")[0] in _PACKAGES


def _derives(value: Any, name: str) -> bool:
    """Whether ``value`` (an instance or a class) derives from Lightning's class ``name``."""
    cls = value if isinstance(value, type) else type(value)
    return any(c.__name__ == name and _lightnings(c) for c in cls.__mro__)


def is_lightning_module(model: Any) -> bool:
    """Whether ``model`` (an instance or a class) is a Lightning ``LightningModule``."""
    return _derives(model, "LightningModule")


def trained_as(model: nn.Module) -> nn.Module:
    """``model`` as a trial trains it: a LightningModule in its ``LightningStep``, any other
    model as it is."""
    return LightningStep(model) if is_lightning_module(model) else model


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
        _keep_the_index_out_of_compile()
        # said once here (the module docstring), not at every step of every trial and trace
        warnings.filterwarnings("ignore", message=r"You are trying to `self\.log\(\)`")

    def forward(self, batch: Any) -> Any:
        index = self._next_index()
        loss = self.module.training_step(batch, index)
        if loss is None:  # the default loss's "no tensor in it; pass --loss" would mislead here
            raise WorkloadError(
                f"{type(self.module).__name__}.training_step returned None for batch {index} "
                "(Lightning skips such a batch): a trial runs and times the step of every "
                "batch; return the loss for each"
            )
        return loss

    def _next_index(self) -> int:
        # outside a compiled forward (``_keep_the_index_out_of_compile``): a module's int
        # attribute read in it is a constant that compile guards on, and a new one every step
        # compiled the step again (164 ms a step of a small classifier under compile, 1.4 ms
        # with the index fixed); returned from here it is an input of what follows, which
        # compile makes dynamic after one
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


@functools.cache
def _keep_the_index_out_of_compile() -> None:
    """``torch.compiler.disable`` on ``LightningStep._next_index``, once (cached), when the
    first step is made: as a decorator it imported ``torch._dynamo`` (1.6 s on a 2-core CPU)
    into every process that imported this module, a driver checking a plain model included."""
    disabled = torch.compiler.disable(LightningStep._next_index)  # type: ignore[no-untyped-call]
    LightningStep._next_index = disabled  # type: ignore[method-assign]


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


def is_data_module(value: Any) -> bool:
    """Whether ``value`` is a Lightning ``LightningDataModule``."""
    return _derives(value, "LightningDataModule")


def defines_train_dataloader(value: Any) -> bool:
    """Whether ``value``'s class (a LightningModule's, a DataModule's) defines
    ``train_dataloader`` itself: Lightning's own raises that it is not implemented."""
    owner = next((c for c in type(value).__mro__ if "train_dataloader" in c.__dict__), None)
    return owner is not None and not _lightnings(owner)


def train_dataset(owner: Any, named: str, collate_given: bool) -> tuple[Any, str]:
    """The dataset of ``owner.train_dataloader()`` (a LightningModule or a DataModule that
    defines it), prepared and set up for fitting first, as the Trainer does, and a note for
    where the data comes from: '' or, where the loader samples with a sampler of its own, that
    trials do not use it. ``named``: the owner in the output's words. A loader that batches
    with a collate function of its own is a one-line error unless one was given
    (``collate_given``): the trials' DataLoaders would stack the samples with torch's
    ``default_collate``."""
    from torch.utils.data import DataLoader, default_collate

    owner.prepare_data()
    owner.setup("fit")
    loader = owner.train_dataloader()
    if not isinstance(loader, DataLoader):
        raise WorkloadError(
            f"{named}'s train_dataloader() returned a {type(loader).__name__}, expected a "
            "torch DataLoader; give its dataset by autotune_dataset beside the model or --data"
        )
    batches_with = getattr(loader, "collate_fn", default_collate)
    if batches_with is not default_collate and not collate_given:
        name = getattr(batches_with, "__qualname__", type(batches_with).__name__)
        raise WorkloadError(
            f"{named}'s train_dataloader() batches with its collate_fn {name}: give it by "
            "--collate module:attr or autotune_collate beside the model, so that the trials' "
            "DataLoaders batch as it does"
        )
    sampler = own_sampler(loader)
    note = (
        f" (its train_dataloader() samples with {sampler}, which trials do not use: they "
        "shuffle with a DistributedSampler, so their batches, and with them padding and speed, "
        "may differ from your training's)"
        if sampler
        else ""
    )
    return loader.dataset, note


def own_sampler(loader: Any) -> str | None:
    """The class name of ``loader``'s own sampler or batch sampler (one that groups samples by
    length, or draws them by weight); None where it samples as a DataLoader does by itself
    (shuffled or in order), or reads a stream."""
    from torch.utils.data import (
        BatchSampler,
        DistributedSampler,
        IterableDataset,
        RandomSampler,
        SequentialSampler,
    )

    if isinstance(loader.dataset, IterableDataset):
        return None
    batches = loader.batch_sampler
    if batches is not None and type(batches) is not BatchSampler:
        return type(batches).__name__
    plain = (RandomSampler, SequentialSampler, DistributedSampler)
    return None if isinstance(loader.sampler, plain) else type(loader.sampler).__name__
