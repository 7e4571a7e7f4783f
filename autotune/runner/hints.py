"""Why a training step failed, said beside torch's own error: the notes a rank's reason ends
with, in brackets (``errors.RANK_HINTS``), each with the fix. Read only once a step has failed:
``TrainStep.run`` imports this module then."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from autotune.config import TrainConfig
from autotune.errors import (
    COMPILED_WRITE,
    DICT_TARGET,
    DIVERGED,
    DOUBLE_INPUTS,
    FSDP_CASTS,
    NO_CUDA_ERRORS,
    NO_CUDA_HERE,
    NO_GROUP_HERE,
    NO_TARGET,
    NOT_TENSORS,
    TARGET_AS_INPUT,
    TUPLE_SPLIT,
    WHOLE_DICT,
)
from autotune.runner.fake_group import NO_GROUP, holds_sync_batch_norm
from autotune.runner.loss import TARGET_KEYS, TARGET_PARAMETERS
from autotune.runner.training import WHOLE_BATCH, dataclass_instance, map_tensors, maps_own_tensors


def _not_a_tensor(value: Any) -> str | None:
    """What ``value`` is, where it holds something other than tensors (None: tensors only)."""
    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, Mapping):
        inner = (_not_a_tensor(v) for v in value.values())
        return next((f"{kind} in a dict" for kind in inner if kind), None)
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in value if _not_a_tensor(v)})
        return f"a {type(value).__name__} of {len(value)} {', '.join(kinds)}" if kinds else None
    if _holds_tensors(value):
        return None
    return f"a {type(value).__name__}"


def _holds_tensors(value: Any) -> bool:
    """Whether ``map_tensors`` goes into ``value`` beyond dicts, lists and tuples: a dataclass
    instance or a batch that maps its own tensors (``maps_own_tensors``)."""
    return dataclass_instance(value) or maps_own_tensors(value)


def input_hint(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why a forward may have failed on its batch: an input that is not a tensor, with the
    fix (a collate function that makes tensors of the samples); None when all are tensors."""
    inputs = [(f"input {i}", v) for i, v in enumerate(args)]
    inputs += [(repr(k), v) for k, v in kwargs.items()]
    for name, value in inputs:
        kind = _not_a_tensor(value)
        if kind:
            return (
                f"{NOT_TENSORS} {kind} as {name}, not a tensor: a collate function (--collate "
                "module:attr, or autotune_collate in the model's module) makes tensors of the "
                "samples"
            )
    return None


def diverged_hint(model: nn.Module) -> str | None:
    """Why a forward may have failed after an update: a parameter (this rank's shard of one,
    under FSDP) not finite, which a model checking its own values raises on (DETR's boxes:
    "boxes1 must be in [x0, y0, x1, y1] (corner) format, but got tensor([[nan, ..."); None where
    every one is finite. Read only once the forward has failed."""
    for name, parameter in model.named_parameters():
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        if local.is_floating_point() and not bool(torch.isfinite(local.detach()).all()):
            return (
                f"{DIVERGED} ({name}): an update before this step diverged, as this "
                "configuration's numerics may (compressed gradients, 16-bit arithmetic)"
            )
    return None


def dict_hint(batch: Any, args: tuple[Any, ...], accepts: frozenset[str] | None) -> str | None:
    """Why a forward given a dict batch whole (``split_batch``: it takes none of its keys by
    name) may have failed, with the fix; None where the batch went otherwise."""
    if not (isinstance(batch, Mapping) and args and args[0] is batch) or accepts is WHOLE_BATCH:
        return None
    keys = ", ".join(map(repr, batch))
    return (
        f"{WHOLE_DICT} as its first argument, a dict of {keys}, none of them a parameter's name: "
        "name its parameters after the keys, or give a collate function that makes the inputs "
        "it takes"
    )


def cuda_hint(error: BaseException, device: torch.device) -> str | None:
    """Why a forward on a device other than CUDA failed for want of CUDA, with the fix; None
    for any other error."""
    if device.type == "cuda" or not any(s in str(error) for s in NO_CUDA_ERRORS):
        return None
    return (
        f"{NO_CUDA_HERE}, which this machine lacks: make tensors inside the model on its "
        "input's device (device=x.device) or register them as buffers, which move with it"
    )


def tuple_hint(error: BaseException, batch: Any) -> str | None:
    """Why a forward given a tuple batch of three or more items failed on its positional
    inputs (samples of (input, target, weight)), with the fix; None otherwise."""
    if not (isinstance(batch, (list, tuple)) and len(batch) > 2 and isinstance(error, TypeError)):
        return None
    if "positional argument" not in str(error):
        return None
    return (
        f"{TUPLE_SPLIT}: its {len(batch)} items went to the forward as {len(batch) - 1} inputs "
        "and the last as the target; samples with more than an input and a target (a weight, "
        "an id) can be dicts, passed as keyword arguments, with the loss given by --loss or "
        "autotune_loss"
    )


def double_hint(error: BaseException, model: nn.Module, inputs: Any) -> str | None:
    """Why a forward failed on mixed dtypes where its inputs held float64 tensors (numpy's and
    pandas' default) and the model's parameters are not float64, with the fix; None
    otherwise (a model that casts its inputs itself never gets here)."""
    if not isinstance(error, RuntimeError) or "double" not in str(error).lower():
        return None
    doubles: list[bool] = []
    map_tensors(inputs, lambda t: doubles.append(t.dtype == torch.float64))
    if not any(doubles) or any(p.dtype == torch.float64 for p in model.parameters()):
        return None
    return (
        f"{DOUBLE_INPUTS}, as numpy arrays and pandas give them, and the model's parameters "
        "are not float64: make the samples float32 in the dataset (x.astype(np.float32), "
        "torch.as_tensor(x, dtype=torch.float32)) or in a collate function (--collate)"
    )


MIXED_DTYPES = ("same dtype", "should be the same", "expected scalar type", "Expected mat_a")
"""What torch says where one op meets two floating dtypes (a linear's, a convolution's, a fused
kernel's words)."""


def fsdp_dtype_hint(error: BaseException, config: TrainConfig) -> str | None:
    """Why a forward under FSDP's bf16 parameters failed on mixed dtypes, or on an op without a
    bf16 kernel on this device (YOLOS's matcher: '"cdist" not implemented for 'BFloat16'' on a
    CPU), with the fix; None otherwise."""
    if config.fsdp_mixed_precision == "off":
        return None
    if "not implemented for 'BFloat16'" in str(error):
        return (
            f"{FSDP_CASTS}, so the model computes in bf16 throughout, and one of its ops has no "
            "bf16 kernel on this device; amp=bf16 keeps such ops in float32"
        )
    if not any(m in str(error) for m in MIXED_DTYPES):
        return None
    return (
        f"{FSDP_CASTS} and the forward's floating inputs, nothing the model makes itself: a "
        "float32 tensor it makes (x.float() / 255, a float32 buffer, a frozen norm) met a bf16 "
        "weight; amp=bf16 casts per op instead"
    )


def target_hint(error: BaseException, target: Any, forward: bool = False) -> str | None:
    """Why a loss failed on ``None`` where the batch gave it no target, or (``forward``) why a
    forward that asks for targets in training failed on a batch without them (torchvision's
    detection models: "targets should not be none when in training mode"), with the fix; None
    otherwise; or why a loss failed on a dict batch, given it whole (``dict_target_hint``)."""
    if not forward and isinstance(target, Mapping):
        return dict_target_hint(error, target)
    if target is not None:
        return None
    text = str(error)
    if forward:
        if not any(word in text.lower() for word in ("target", "label")):
            return None
        given = "the forward was given none"
    elif isinstance(error, (TypeError, AttributeError)) and "None" in text:
        given = "the loss was given None as its target"
    else:
        return None
    return (
        f"{NO_TARGET}, a lone tensor or synthetic samples of --input-shape, so {given}: give "
        "samples of (input, target) by --data module:attr or autotune_dataset beside the model "
        "(an autoencoder's: (x, x))"
    )


def dict_target_hint(error: BaseException, target: Mapping[str, Any]) -> str | None:
    """Why a user's loss failed as on a tensor where a dict batch was its target (a DLRM's
    ``{"dense", "sparse", "labels"}``: "'dict' object has no attribute 'size'"), with the fix;
    None for other errors."""
    if not isinstance(error, (TypeError, AttributeError)):
        return None
    keys = [str(k) for k in target]
    named = next((k for k in TARGET_KEYS if k in keys), None)
    read = f"target[{named!r}]" if named else "the target's key in it"
    return (
        f"{DICT_TARGET}, a dict of {', '.join(keys)}, as --loss and autotune_loss are called on "
        f"a dict batch: read {read} in the loss"
    )


def group_hint(error: BaseException, model: nn.Module) -> str | None:
    """Why a one-process step failed where the model called ``torch.distributed`` without a
    group (``fake_group.NO_GROUP``), with the fix; None otherwise."""
    if NO_GROUP not in str(error):
        return None
    why = (
        "and holds SyncBatchNorm, which on a CPU refuses any group: a one-process trial here "
        "joins none"
        if holds_sync_batch_norm(model)
        else "and this process has none"
    )
    return f"{NO_GROUP_HERE}, {why}; guard the call with dist.is_initialized()"


def target_input_hint(kwargs: dict[str, Any], target: Any) -> str | None:
    """Why a forward may have failed where the batch's target went to its last required
    parameter (``training.required_parameter``), one not named for a target: that parameter may
    be no target (an RNN's ``forward(input, hidden)`` given the next tokens as its state), with
    the fix; None where the target went elsewhere, or to a parameter named for it."""
    given = [k for k, v in kwargs.items() if v is target and target is not None]
    if not given or given[0] in TARGET_PARAMETERS:
        return None
    name = given[0]
    return (
        f"{TARGET_AS_INPUT} as '{name}', its last required parameter, as model(*batch) passes "
        f"it: where '{name}' is no target (a recurrent state), give a model whose forward "
        "makes it (a wrapper taking the inputs alone), or samples of every input and the "
        "target"
    )


INPLACE_WRITE = "modified by an inplace operation"
"""What autograd says where a tensor a backward needs was written in place after it was saved."""


def compiled_write_hint(error: BaseException, config: TrainConfig) -> str | None:
    """Why a compiled step's backward failed on a tensor written in place where eager trains it
    (MoCo's queue under torch.compile: ``int(self.queue_ptr)`` broke the graph before the queue
    was written, and the graph before the break kept the queue itself for backward, not the
    ``clone()`` the forward multiplied), with the fix; None otherwise."""
    if config.compile == "off" or INPLACE_WRITE not in str(error):
        return None
    return (
        f"{COMPILED_WRITE}: a graph break (int(tensor), .item(), print) between a tensor's use "
        "and an in-place write to it (a buffer: a queue, a counter) can leave the compiled "
        "graph holding the tensor itself for backward, which the write then changes; eager "
        "(compile=off) trains it, or a graph without the break"
    )
