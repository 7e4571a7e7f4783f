"""What the model's own structure decides, read from its build on the meta device
(``meta_build``): its repeated blocks and what checkpointing them saves, whether it checkpoints
or compiles itself, its batch norms, its parameters' dtype. None (or nothing) where the model
cannot be built there.
"""

from __future__ import annotations

from typing import Any

from autotune.config import TrainConfig
from autotune.runner.compile_state import eager_compiles, was_compiled
from autotune.runner.workload import (
    WorkloadSpec,
    load_collate,
    parameter_dtype,
)
from autotune.search.meta_build import meta_inputs, meta_model, read_samples
from autotune.search.recipe import BatchNorm


def own_checkpointing(model_reference: str) -> str | None:
    """The search's line where the model, as built, checkpoints itself (Hugging Face's
    ``gradient_checkpointing_enable()`` in its factory): trials turn that off
    (``checkpointing.apply_checkpointing``); None where it does not, or cannot be built."""
    from autotune.runner import checkpointing  # imports torch

    built = meta_model(model_reference)
    if built is None or not checkpointing.checkpoints_itself(built[1]):
        return None
    return (
        "the model turns on its own (gradient_checkpointing): every trial turns it off, so "
        "that checkpoint_segments decides (0: off); the recommended value is the one to keep"
    )


def refuses_own_checkpointing(model_reference: str) -> str | None:
    """``checkpointing.refuses_own_checkpointing`` of the model built on the meta device (the
    class whose Trainer flag would raise); None where it does not refuse, or cannot be built."""
    from autotune.runner import checkpointing  # imports torch

    built = meta_model(model_reference)
    return None if built is None else checkpointing.refuses_own_checkpointing(built[1])


def own_compile(model_reference: str) -> str | None:
    """The search's line where the model's factory returns it compiled (``torch.compile``):
    trials take the module it wraps (``workload.load_model``); None where it is not compiled,
    or cannot be built."""
    built = meta_model(model_reference)
    if built is None or not was_compiled(built[1]):
        return None
    return (
        "the model's factory compiles it (torch.compile): every trial takes the module it wraps, "
        "so that compile decides (off: eager); the recommended value is the one to keep"
    )


def idle_blocks(workload: WorkloadSpec) -> int:
    """How many of the model's repeated blocks keep nothing for backward: their output needs no
    gradient (frozen, below every parameter that trains: a linear probe's backbone, a fine-tune's
    frozen lower layers), so checkpointing them saves nothing. From a forward of the dataset's
    first two samples through the model built on the meta device; 0 where that cannot run."""
    import torch
    from torch.utils.data import default_collate

    from autotune.runner.training import map_tensors  # imports torch

    built = meta_model(workload.model)
    first = read_samples(workload, 2)
    if built is None or not first:
        return 0
    model = built[1]
    units = checkpoint_units(workload)
    if units is None or units.loops:  # a looped layer with a parameter that trains keeps
        return 0
    blocks = list(units.blocks)
    keeps: dict[int, bool] = {}

    def seen(block: Any, _inputs: Any, output: Any) -> None:
        kept: list[bool] = []
        map_tensors(output, lambda t: kept.append(t.requires_grad))
        keeps[id(block)] = keeps.get(id(block), False) or any(kept)

    handles = [block.register_forward_hook(seen) for block in blocks]
    try:
        collate = load_collate(workload, built[0])[0] or default_collate
        args, kwargs = meta_inputs(model, collate(list(first)))
        with torch.enable_grad(), eager_compiles():
            model(*args, **kwargs)
    except Exception:  # a model the meta device cannot run: nothing is left out
        return 0
    finally:
        for handle in handles:
            handle.remove()
    return sum(1 for block in blocks if id(block) in keeps and not keeps[id(block)])


def repeated_blocks(workload: WorkloadSpec) -> tuple[int, str] | None:
    """(number, class names) of the user's model's checkpointing units (``checkpoint_units``:
    the names comma-separated, an encoder's and a decoder's layers are two classes; a looped
    layer's calls are its class's after ``checkpointing.LOOPED``); None if the model cannot be
    built on the meta device."""
    units = checkpoint_units(workload)
    return None if units is None else (units.count, units.names)


def fsdp_block_classes(model_reference: str) -> str | None:
    """The class names of the blocks FSDP shards as units of their own (the model's repeated
    blocks, not a looped layer's calls: what Accelerate's ``fsdp_transformer_layer_cls_to_wrap``
    takes), comma-separated; None where there are none or the model cannot be built on the meta
    device."""
    from autotune.runner import blocks  # imports torch

    built = meta_model(model_reference)
    if built is None:
        return None
    return blocks.block_classes(blocks.find_repeated_blocks(built[1])) or None


def check_segments(workload: WorkloadSpec, segments: int) -> None:
    """``checkpointing.check_segments`` on the model built on the meta device, its units
    counted as a rank counts them (``checkpoint_units``): the one-line error a rank would raise,
    before any is launched; nothing where the model cannot be built there."""
    from autotune.runner import checkpointing  # imports torch

    built, units = meta_model(workload.model), checkpoint_units(workload)
    if built is not None and units is not None:
        checkpointing.check_segments(built[1], segments, units)


def checkpoint_units(workload: WorkloadSpec) -> Any:
    """The checkpointing units (``checkpointing.Units``) of the model built on the meta device,
    its calls counted by a forward of the dataset's first two samples there where the units
    depend on them (a model with no stack of layers: ``blocks.may_loop``), as a rank
    counts them; None if the model cannot be built on the meta device."""
    from torch.utils.data import default_collate

    from autotune.runner import blocks, checkpointing  # imports torch

    built = meta_model(workload.model)
    if built is None:
        return None
    model = built[1]
    first = read_samples(workload, 2) if blocks.may_loop(model) else None
    calls = None
    try:
        if first:
            collate = load_collate(workload, built[0])[0] or default_collate
            args, kwargs = meta_inputs(model, collate(list(first)))
            with eager_compiles():
                calls = checkpointing.count_calls(model, lambda: model(*args, **kwargs))
    except Exception:  # samples the meta device cannot take: the structure alone decides
        calls = None
    return checkpointing.checkpoint_units(model, calls)


def batch_norm(model_reference: str) -> BatchNorm | None:
    """How the model's batch norms compute their statistics in training: "synced" where every
    one is an ``nn.SyncBatchNorm``, else "local" (over each device's micro-batch); None for a
    model without them, or one that cannot be built on the meta device."""
    import torch.nn as nn

    from autotune.runner.training import BATCH_NORMS  # imports torch

    built = meta_model(model_reference)
    norms = [m for m in built[1].modules() if isinstance(m, BATCH_NORMS)] if built else []
    if not norms:
        return None
    return "synced" if all(isinstance(m, nn.SyncBatchNorm) for m in norms) else "local"


def scalar_parameters(model_reference: str) -> list[str]:
    """The names of the model's 0-dim trainable parameters (CLIP's ``logit_scale``), from a
    build on the meta device; [] if it cannot be built there."""
    from autotune.runner import training  # imports torch

    built = meta_model(model_reference)
    return list(training.scalar_parameters(built[1])) if built is not None else []


def parameters_dtype(model_reference: str) -> str | None:
    """The one floating dtype of the model's parameters (``workload.parameter_dtype``), from a
    build on the meta device; None where they differ, or it cannot be built there."""
    built = meta_model(model_reference)
    return parameter_dtype(built[1]) if built is not None else None


EVERY_BLOCK_AT_ONE = "its blocks checkpointed, micro-batch 1"
"""What ``every_block_at_one`` moved, in the words ``plan`` and the search's no-fit line use."""


def every_block_at_one(config: TrainConfig, workload: WorkloadSpec) -> TrainConfig | None:
    """``config`` with the model's own levers on memory pulled as far as they go: every
    repeated block that keeps something for backward checkpointed in full, at micro-batch 1 (the
    accumulation making up the global batch); None where no such configuration can be made,
    or it is ``config`` itself. What a narrow space that fits nowhere is measured against
    (``plan``'s "beyond the space", the search's no-fit line)."""
    found = repeated_blocks(workload)
    blocks = found[0] - idle_blocks(workload) if found else 0
    try:
        further = TrainConfig(
            **config.model_dump()
            | {
                "checkpoint_segments": max(config.checkpoint_segments, blocks),
                "checkpoint_policy": "full" if blocks else config.checkpoint_policy,
                "grad_accum_steps": config.global_batch_size // config.world_size,
            }
        )
    except ValueError:  # not a configuration: nothing to say of it
        return None
    return None if further.key() == config.key() else further
