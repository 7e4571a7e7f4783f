"""A forward as FSDP's bf16 parameters hold the model, run on the CPU before any trial.

FSDP (``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=bfloat16)``) casts each unit's
floating parameters to bf16 for its forward, and the floating tensors each unit is given, but no
buffer and nothing a forward makes itself. A model that computes with a float32 buffer (a VQ-VAE's
codebook, kept up to date by its forward) or makes a float32 tensor (``x.float() / 255``) then
meets a bf16 weight in one op, and its first step fails. The meta device cannot show it: its
kernels take mixed dtypes (``mm``, ``linear`` and ``conv2d`` do), as fake tensors, built on them,
do. So this runs one forward of a real batch through a model built for it alone, held as FSDP
holds it: its parameters in bf16 (those the trials keep out of ``fully_shard`` aside, whole:
``training.whole_parameters``, the 0-dim ones and the batch norms'), and the floating tensors
given to it and to each repeated block (the units a trial shards) cast to bf16 as they enter.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from autotune.config import TrainConfig
from autotune.runner.blocks import find_repeated_blocks
from autotune.runner.compile_state import eager_compiles
from autotune.runner.lazy_modules import materialize
from autotune.runner.training import (
    forward_keywords,
    map_tensors,
    split_batch,
    target_into,
    whole_parameters,
)

_BF16 = TrainConfig(
    global_batch_size=2, parallel="fsdp", world_size=2, fsdp_mixed_precision="bf16", device="cpu"
)
"""What the forward emulates, for ``whole_parameters``."""


def _to_bf16(value: Any) -> Any:
    return map_tensors(value, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)


def _cast_inputs(_module: nn.Module, args: Any, kwargs: Any) -> tuple[Any, Any]:
    return _to_bf16(args), _to_bf16(kwargs)


def bf16_forward_error(model: nn.Module, batch: Any, loss_fn: Any) -> BaseException | None:
    """The error one training-mode forward of ``batch`` raises through ``model`` held as FSDP's
    bf16 parameters hold it (module docstring), without gradients, given the target as a trial
    with ``loss_fn`` gives it; None where it runs. The model is changed in place (its parameters
    cast, its buffers moved by the forward): give one built for this alone."""
    materialize(model, batch)
    kept = set(whole_parameters(model, _BF16))
    for parameter in model.parameters():
        if parameter.is_floating_point() and parameter not in kept:
            parameter.data = parameter.data.to(torch.bfloat16)
    units = [*find_repeated_blocks(model), model]
    handles = [u.register_forward_pre_hook(_cast_inputs, with_kwargs=True) for u in units]
    args, kwargs, _ = split_batch(batch, forward_keywords(model), target_into(model, loss_fn))
    model.train()
    try:
        with torch.no_grad(), eager_compiles():  # its dtypes, not its speed
            model(*args, **kwargs)
    except Exception as error:  # the caller tells a dtype's failure from the others
        return error
    finally:
        for handle in handles:
            handle.remove()
    return None
