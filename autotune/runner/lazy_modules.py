"""Lazy modules (``nn.LazyLinear``, ``nn.LazyConv2d``) take their shapes at their first forward.

Until then their parameters are ``UninitializedParameter``s, which DistributedDataParallel and
FSDP refuse ("Run a dummy forward pass") and the memory trace cannot size. PyTorch's advice is
one forward of a real batch before wrapping; this module gives it, once, where the model is
built: on a rank and in ``apply.prepare``, from the dataset's first samples, and in the trace,
from its fake batch's shapes.
"""

from __future__ import annotations

from typing import Any

from autotune.runner.workload import first_samples

MATERIALIZING_SAMPLES = 2
"""Samples in the batch whose forward gives lazy modules their shapes (two: a forward may
squeeze away a batch dimension of one)."""


def has_lazy_parameters(model: Any) -> bool:
    """Whether some parameter or buffer of ``model`` is still uninitialized."""
    from torch.nn.parameter import is_lazy

    return any(is_lazy(t) for t in (*model.parameters(), *model.buffers()))


def materialize_from_data(model: Any, dataset: Any, collate: Any = None) -> bool:
    """``materialize`` from a batch of the dataset's first ``MATERIALIZING_SAMPLES`` samples,
    made by ``collate`` (torch's ``default_collate`` when None); True when it ran."""
    if not has_lazy_parameters(model):
        return False
    return materialize(model, first_batch(dataset, collate))


def first_batch(dataset: Any, collate: Any = None) -> Any:
    """A batch of the dataset's first ``MATERIALIZING_SAMPLES`` samples, made by ``collate``
    (torch's ``default_collate`` when None)."""
    from torch.utils.data import default_collate

    return (collate or default_collate)(first_samples(dataset, MATERIALIZING_SAMPLES))


def materialize(model: Any, batch: Any) -> bool:
    """Run one forward of ``batch`` without gradients when ``model`` has lazy parameters, so
    that every one of them takes its shape; True when it ran. The forward runs in eval mode (no
    dropout draws, no running statistics moved) and the model's mode is restored after it."""
    import torch

    from autotune.runner.training import forward_keywords, split_batch  # imports torch

    if not has_lazy_parameters(model):
        return False
    args, kwargs, _ = split_batch(batch, forward_keywords(model))
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        model.train(training)
    return True
