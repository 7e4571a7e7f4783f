"""A process group that communicates nothing, for the memory trace's fake tensors.

A model may call ``torch.distributed`` in its step: research code gathers a contrastive loss's
negatives from every rank (SimCLR's ``GatherLayer``, MoCo's ``concat_all_gather``, open_clip's
``gather_features``), often without asking ``dist.is_initialized()`` first. Every trial runs in
a group (a one-process trial in a group of one: ``session.join_group_of_one``); the trace, which
runs in the driver's process, had none, so an unguarded call stopped it ("Default process group
has not been initialized", and the search fell back to a fit over measured trials) and a
guarded one traced the step without its gather. ``fake_group(world_size)`` makes the tracing
process rank 0 of a group of ``world_size`` whose collectives move no data: a gathered list
holds the tensor's shape once a rank, so what a DDP rank gathers from the others is counted at
its shapes. As in a trial, none beside ``nn.SyncBatchNorm`` (``in_group``), which refuses any
group on a CPU, where the trace runs.

The driver's checks that run such a model on real tensors, whose values count (the coupling
check, FSDP's bf16 forward), get a real gloo group of one from ``group_of_one()`` where the
model asked for a group and found none.

The backend is PyTorch's test tool ``torch.testing._internal.distributed.fake_pg`` (private:
importing it registers the ``fake`` backend, whose collectives fake tensors pass through);
``tests/runner/test_fake_group.py`` pins what is relied on. Where a release lacks it, the
fallback is the trace without a group, as before it (``in_group`` says no).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

NO_GROUP = "Default process group has not been initialized"
"""What ``torch.distributed`` says when a collective or ``get_world_size()`` finds no group."""

WORLD_PROBE = 64
"""The ranks a step is traced among to learn whether it holds more among more (a gather from
every rank): many, so that what it gathers shows above the step's peak (a SimCLR step at
micro-batch 512 held the same as one rank of two as alone; as one of eight, 67% more)."""


def in_group(model: Any) -> bool:
    """Whether a step of ``model`` is traced in a group, as a trial runs it: not where this
    process has one of its own (left alone), nor beside ``nn.SyncBatchNorm``."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized() or not _fake_backend():
        return False
    return not holds_sync_batch_norm(model)


def holds_sync_batch_norm(model: Any) -> bool:
    """Whether ``model`` holds an ``nn.SyncBatchNorm``, which in training refuses any group on a
    CPU (even of one): a trial there joins none, and the trace, on CPU kernels, takes none."""
    import torch.nn as nn

    return any(isinstance(m, nn.SyncBatchNorm) for m in model.modules())


def _fake_backend() -> bool:
    """Whether this torch has the ``fake`` backend (registered as its module is imported)."""
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def fake_group(world_size: int = 1) -> Iterator[None]:
    """Within it, this process is rank 0 of a default group of ``world_size`` that moves no
    data."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg as fake_pg  # registers "fake"

    with _excepthook_kept():
        dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=world_size)
        try:
            yield
        finally:
            dist.destroy_process_group()


@contextlib.contextmanager
def _excepthook_kept() -> Iterator[None]:
    """``sys.excepthook`` as it was once left: ``init_process_group`` wraps it in one that
    writes "[rank0]: " before every line of a traceback, and destroying the group leaves the
    wrapper, so each trace of a plan wrapped the caller's hook once more."""
    import sys

    hook = sys.excepthook
    try:
        yield
    finally:
        sys.excepthook = hook


@contextlib.contextmanager
def group_of_one() -> Iterator[None]:
    """Within it, this process is the only rank of a real gloo group (a gather gives back the
    tensor itself), for a check that runs the model on real tensors."""
    import torch.distributed as dist

    store = dist.HashStore()  # type: ignore[attr-defined]
    with _excepthook_kept():
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def needs_group(told: object) -> bool:
    """Whether a check's ``told`` (its reason, where it could not tell) is a call into
    ``torch.distributed`` that found no group, in a process that has none."""
    import torch.distributed as dist

    return isinstance(told, str) and NO_GROUP in told and not dist.is_initialized()
