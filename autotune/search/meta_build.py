"""The workload built without memory, once, for the questions asked before any trial: the model
on the meta device, its dataset and first samples, its optimizer; and the one-line errors they
show before anything is launched (samples that cannot be batched, a dataset smaller than one
global batch, an optimizer no trial can train with). Each returns None where the build cannot
be done here: the trials then say what is wrong.
"""

from __future__ import annotations

import functools
from typing import Any

from autotune.errors import WorkloadError, error_line
from autotune.runner.instances import copy_with_tensors, names_an_instance
from autotune.runner.optimizer import accepted_implementations, chosen_optimizer
from autotune.runner.outcome import collate_hint
from autotune.runner.workload import (
    WorkloadSpec,
    first_samples,
    load_collate,
    load_dataset,
    load_model,
    load_optimizer,
    model_optimizer,
)


@functools.cache
def meta_model(model_reference: str) -> tuple[Any, Any] | None:
    """(module, model) built once on the meta device (no memory, no initialisation) for the
    probe's questions about the model; None if it cannot be built there. CUDA named by GPU code
    (``device="cuda"``, ``.cuda()``, ``torch.cuda.current_device()``) is the meta device here
    (``fake_device``): such code builds on a machine without a GPU, and a model moved by
    ``.cuda()`` keeps its meta tensors, as its trace does."""
    import torch

    from autotune.runner.fake_device import CudaOnCpu, cuda_stand_ins  # imports torch

    try:
        with torch.device("meta"), cuda_stand_ins(), CudaOnCpu():
            module, model = load_model(model_reference)
        if names_an_instance(model_reference):  # built before: a copy of it on meta
            model = copy_with_tensors(model, lambda t: t.to("meta"), model_reference)
        return module, model
    except Exception:  # a model that cannot be built on meta: trials will report it
        return None


def forget() -> None:
    """Drop what the probe keeps of the workloads it was asked about (the model built on the
    meta device, the dataset and its first samples: a caller's objects, where given as such)."""
    for cached in (meta_model, _dataset, read_samples):
        cached.cache_clear()
    _ON_GPU.clear()


_ON_GPU: dict[WorkloadSpec, tuple[int, bool]] = {}
"""What each dataset built here keeps on CUDA (``on_gpu``)."""


def on_gpu(workload: WorkloadSpec) -> tuple[int, bool]:
    """(bytes, whether its samples are CUDA's): what the dataset keeps on CUDA, as GPU code
    keeps a small one there (``fake_device.CudaMade``), and whether its first sample is made
    there; (0, False) where neither, or where it cannot be built here."""
    _dataset(workload)
    return _ON_GPU.get(workload, (0, False))


BATCH_CHECKED = 4
"""How many of the dataset's first samples the probe reads (and batches, ``batch_error``)."""


@functools.cache
def _dataset(workload: WorkloadSpec) -> tuple[Any, str] | None:
    """(dataset, where it came from), built once beside the meta-device model; None when that
    cannot be done here (the trials will say)."""
    from autotune.runner.fake_device import CudaMade, CudaOnCpu, cuda_stand_ins  # imports torch

    built = meta_model(workload.model)
    if built is None:
        return None
    made = CudaMade()
    try:
        with cuda_stand_ins(made), CudaOnCpu(made):  # a dataset GPU code keeps there: here
            loaded = load_dataset(workload, *built)
    except Exception:  # the trials will say what is wrong with it
        return None
    kept, samples = made.held_bytes(), _samples_made(loaded[0], made)
    if kept or samples:
        _ON_GPU[workload] = (kept, samples)
    return loaded


def _samples_made(dataset: Any, made: Any) -> bool:
    """Whether the dataset's first sample holds a tensor made on CUDA (``made``): one it keeps
    there, or one made there as the sample is read (``device="cuda"`` in ``__getitem__``, a
    Hugging Face dataset formatted for CUDA)."""
    from autotune.runner.fake_device import CudaOnCpu, cuda_stand_ins  # imports torch

    try:
        with cuda_stand_ins(made), CudaOnCpu(made):
            return bool(made.holds(first_samples(dataset, 1)))
    except Exception:  # the trials will say what is wrong with it
        return False


@functools.cache
def read_samples(workload: WorkloadSpec, count: int) -> tuple[Any, ...] | None:
    """The dataset's first ``count`` samples (fewer if it holds fewer); None when the dataset
    cannot be built or read here (the trials will say)."""
    dataset = _dataset(workload)
    if dataset is None:
        return None
    try:
        return tuple(first_samples(dataset[0], count))
    except Exception:  # the trials will say what is wrong with it
        return None


def meta_inputs(model: Any, batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(positional, keyword) inputs of ``model``'s forward from ``batch``, its tensors on the
    meta device, split as a trial splits it."""
    from autotune.runner.training import forward_keywords, map_tensors, split_batch  # imports torch

    args, kwargs, _ = split_batch(
        map_tensors(batch, lambda t: t.to("meta")), forward_keywords(model)
    )
    return args, kwargs


def data_source(workload: WorkloadSpec) -> str | None:
    """Where the trials' samples come from, in words (synthetic ones with their shape and
    range); None when that cannot be told here."""
    dataset = _dataset(workload)
    return dataset[1] if dataset else None


def feeds_images(workload: WorkloadSpec) -> bool | None:
    """Whether the model's samples hold an image (a 3-D floating tensor: a 4-D batch), from a
    build on the meta device and one sample; None when that cannot be told here."""
    import torch

    first = read_samples(workload, BATCH_CHECKED)
    if not first:
        return None
    sample = first[0]
    found = [sample] if isinstance(sample, torch.Tensor) else []
    if isinstance(sample, dict):
        found = [v for v in sample.values() if isinstance(v, torch.Tensor)]
    elif isinstance(sample, (list, tuple)):
        found = [v for v in sample if isinstance(v, torch.Tensor)]
    return any(t.dim() == 3 and t.is_floating_point() for t in found)


def batch_error(workload: WorkloadSpec) -> str | None:
    """Why the DataLoader cannot make a batch of the dataset's first ``BATCH_CHECKED`` samples
    with the workload's collate function (torch's ``default_collate`` stacks samples of one
    shape only), in one line; None when it can, or when that cannot be told here."""
    from torch.utils.data import default_collate

    first = read_samples(workload, BATCH_CHECKED)
    built = meta_model(workload.model)
    if not first or built is None:
        return None
    try:
        collate, _ = load_collate(workload, built[0])
        (collate or default_collate)(list(first))
    except Exception as error:
        return error_line(error)
    return None


def check_batches(workload: WorkloadSpec) -> None:
    """One line, before anything runs, when the DataLoader cannot batch the dataset's first
    samples (samples of different lengths without a collate function that pads them): every
    trial would fail in its first step, and a plan would predict batches that cannot be made."""
    unbatched = batch_error(workload)
    if unbatched is not None:
        hint = f"; {found}" if (found := collate_hint(unbatched)) else ""
        raise WorkloadError(
            f"the DataLoader cannot make a batch of the dataset's first samples: {unbatched}{hint}"
        )


def check_dataset_size(workload: WorkloadSpec, global_batch_size: int | None, source: str) -> None:
    """One line, before anything runs, where the dataset holds fewer samples than one global
    batch (``source``: where the batch came from): the loaders drop a last partial batch, so
    every trial without accumulation failed in its first step ("the DataLoader produced no
    batch"); a dataset without a length, or one that cannot be built here, is left to the
    trials."""
    dataset = _dataset(workload)
    try:
        size = len(dataset[0]) if dataset is not None else None
    except TypeError:  # an iterable dataset: no length to check
        return
    if size is None or global_batch_size is None or size >= global_batch_size:
        return
    given = batch_source_note(source)
    raise WorkloadError(
        f"the dataset holds {size} samples, fewer than one global batch of {global_batch_size}"
        f"{given}: no step could be made of an epoch; use --global-batch-size {size} or less, "
        "or a larger dataset"
    )


def batch_source_note(source: str) -> str:
    """Where a global batch not given by flag came from, for an error about it (" (default
    32)", " (mymodel autotune_global_batch_size)"); "" for one given."""
    return "" if source == "given" else f" ({source.split(':')[0]})"


def configures_optimizer(model_reference: str) -> bool:
    """Whether the model configures its own optimizer (a LightningModule, named as its class or
    built by a factory); False where it cannot be built on the meta device."""
    built = meta_model(model_reference)
    return built is not None and model_optimizer(built[1]) is not None


def _meta_optimizer(workload: WorkloadSpec) -> Any:
    """The workload's optimizer built over the meta-device model; None when that cannot be
    done here (the trials will say). Raises the ``WorkloadError`` of one no trial can train
    with (a factory that returns no optimizer, or one whose step needs a closure)."""
    model = meta_model(workload.model)
    if model is None:
        return None
    try:
        factory = load_optimizer(workload, model[0])[0]
        return chosen_optimizer(factory, model[1])(model[1].parameters())
    except WorkloadError:
        raise
    except Exception:  # the trials will say what is wrong with it
        return None


def check_optimizer(workload: WorkloadSpec) -> None:
    """One line, before any trial, where the workload's optimizer is one no trial can train
    with: every trial would fail applying the configuration."""
    _meta_optimizer(workload)


def optimizer_flags(workload: WorkloadSpec) -> tuple[str, tuple[str, ...]] | None:
    """(class name, implementation flags it takes) of the workload's optimizer, built over a
    meta-device model; None when that cannot be told here."""
    built = _meta_optimizer(workload)
    if built is None:
        return None
    return type(built).__name__, accepted_implementations(type(built))
