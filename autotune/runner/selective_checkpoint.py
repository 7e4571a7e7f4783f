"""Selective activation checkpointing (``checkpoint_policy = "selective"``): inside each
checkpointed block, the outputs of the costly ops are kept for backward and only the cheap ones
are recomputed.

Full checkpointing keeps a block's input and recomputes its whole forward in backward: every
matrix multiplication again, about a third more compute for a transformer. Selective
checkpointing (torch's ``create_selective_checkpoint_contexts``, as torchtitan's "selective op"
mode uses it) keeps the outputs of matrix multiplications, convolutions and fused attention
kernels (``SAVED``) and recomputes the rest: norms, activations, dropout, residual sums. It holds
more than full checkpointing and less than none (the activations of the cheap ops are often the
large ones: a GELU's output, a norm's), at a cost in recomputation near none's. Batched matrix
multiplications (``bmm``) are recomputed: in attention written by hand they make the scores, a
sequence-by-sequence matrix per head, and keeping it held nearly as much as no checkpointing
(``gpt_small``: 313 MiB against 374 off and 210 with ``bmm`` recomputed).

The numerics are unchanged: what is recomputed is computed again from the same inputs, as full
checkpointing does, with the random state of the forward restored.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten

SAVED = frozenset(
    op
    for op in (
        _aten.mm.default,
        _aten.addmm.default,
        _aten.convolution.default,
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
    )
)
"""The ops whose outputs a selectively checkpointed block keeps for backward: the costly ones."""


def _policy(_ctx: Any, op: Any, *_args: Any, **_kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED else CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts() -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
    """(forward, recomputation) contexts of one selectively checkpointed call: a ``context_fn``
    for ``torch.utils.checkpoint.checkpoint``."""
    made = create_selective_checkpoint_contexts(_policy)  # type: ignore[no-untyped-call]
    forward, recomputation = made
    return forward, recomputation


Contexts = Callable[[], tuple[AbstractContextManager[None], AbstractContextManager[None]]]
