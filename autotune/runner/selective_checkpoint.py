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
checkpointing does, with the random state of the forward restored. A kept output must not be
written in place afterwards: activation and dropout modules of a selectively checkpointed block
run out of place (``out_of_place``), and any other write into a kept output stops the step
with one line (``MutatedKeptOutput``) naming the op and the policy that works. Under
``torch.compile`` (``compiled_contexts``) the compiler makes such writes functional.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from autotune.errors import MutatedKeptOutput

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


class _Kept:
    """One selectively checkpointed call's policy: keep ``SAVED``'s outputs, recompute the
    rest; and, in forward, stop the step with one line where an op writes in place into an
    output kept (``x = conv(x); x.add_(y)``). Torch would raise only in backward, without naming
    the op ("Tensor cached during selective activation checkpoint has been mutated"), and where
    backward recomputes nothing of the block, not at all. A write is seen after its op returns
    (the tensor's version moves above the dispatch mode that calls the policy): at the next
    op's call, or as the forward ends (``forward``). A torch whose context carries no
    ``op_output`` (an older release; 2.13's has it, pinned by a test) leaves it to torch's own
    check."""

    def __init__(self) -> None:
        self.kept: list[tuple[Any, int, Any]] = []  # tensor, its version when kept, its op
        self.writer: Any = None  # the last op of the forward that writes in place

    def policy(self, ctx: Any, op: Any, *_args: Any, **_kwargs: Any) -> Any:
        if not ctx.is_recompute:
            self.check()
            if op._schema.is_mutable:
                self.writer = op
        if op not in SAVED:
            return CheckpointPolicy.PREFER_RECOMPUTE
        output = getattr(ctx, "op_output", None)
        if not ctx.is_recompute and isinstance(output, torch.Tensor):
            self.kept.append((output, output._version, op))
        return CheckpointPolicy.MUST_SAVE

    def check(self) -> None:
        if self.writer is None:
            return
        for tensor, version, made_by in self.kept:
            if tensor._version != version:
                raise MutatedKeptOutput(
                    f"checkpoint_policy=selective: {self.writer} writes in place into the "
                    f"output of {made_by}, which a selectively checkpointed block keeps for "
                    "backward; use checkpoint_policy=full for this model"
                )
        self.writer = None

    @contextmanager
    def forward(self, context: AbstractContextManager[None]) -> Iterator[None]:
        with context:
            yield
        self.check()


def _keep_costly(_ctx: Any, op: Any, *_args: Any, **_kwargs: Any) -> Any:
    """``SAVED``'s outputs kept, the rest recomputed: the policy alone, without ``_Kept``'s
    watch for writes."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED else CheckpointPolicy.PREFER_RECOMPUTE


def compiled_contexts() -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
    """``selective_contexts`` for a block ``torch.compile`` traces. The compiler takes the two
    dispatch modes torch makes as they are (torch 2.13 asserts it: "must generate a tuple of two
    ``TorchDispatchMode``s"; a wrapped one failed every compiled trial) and saves what the policy
    tags in its own graph, where writes in place are made functional and no version counter
    moves: ``_Kept``'s watch has nothing to see there."""
    return create_selective_checkpoint_contexts(_keep_costly)  # type: ignore[no-untyped-call,no-any-return]


def selective_contexts() -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
    """(forward, recomputation) contexts of one selectively checkpointed call: a ``context_fn``
    for ``torch.utils.checkpoint.checkpoint`` (``compiled_contexts`` under ``torch.compile``)."""
    kept = _Kept()
    made = create_selective_checkpoint_contexts(kept.policy)  # type: ignore[no-untyped-call]
    forward, recomputation = made
    return kept.forward(forward), recomputation


def out_of_place(block: nn.Module) -> None:
    """Turn off the ``inplace`` flag of ``block``'s activation and dropout modules
    (``nn.ReLU(inplace=True)`` after a convolution or a linear layer, as VGG and AlexNet have
    them): written in place, the output they take from a kept op is no longer the one kept.
    The values are the same either way; the activation then holds its own output until the
    next op has read it."""
    for module in block.modules():
        if getattr(module, "inplace", None) is True:
            setattr(module, "inplace", False)  # noqa: B010 (a flag of several classes)


Contexts = Callable[[], tuple[AbstractContextManager[None], AbstractContextManager[None]]]
