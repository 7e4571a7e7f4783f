"""CUDA's fused attention, for the memory trace's CPU tensors.

``F.scaled_dot_product_attention`` picks its kernel by device. In training a CPU picks the math
path whenever attention dropout is on (its flash kernel has no dropout): it materialises the
scores, their softmax and the dropout mask, sequence x sequence per head, and saves them for
backward. A CUDA device picks a fused kernel (flash, or memory-efficient where there is a mask
or float32) that saves only its output and a log-sum-exp per query. Traced on CPU kernels,
Hugging Face GPT-2 small at 1,024 tokens held about twice the activations on CUDA that it does.

While ``cuda_attention()`` is entered, ``F.scaled_dot_product_attention`` runs the
memory-efficient kernel's op instead (``aten._scaled_dot_product_efficient_attention``,
private: its fake-tensor kernel and its backward give the shapes a CUDA run holds), with its
inputs cast as CUDA's autocast casts them and a boolean mask turned into the additive bias CUDA
makes of it. Left to the CPU path (the op's composite kernel), as on CUDA: grouped-query
attention in float32 or beside a mask (the math path there too), nested tensors, and float64.
It is a kernel for the op's ``AutogradCPU`` key, so that a checkpointed block's recomputation in
backward, where a function mode is not active, holds the same; registered through the public
``torch.library`` and removed with the private ``Library._destroy``, as ``fake_autocast``'s
kernels are. ``tests/runner/test_fake_attention.py`` pins what is relied on.

FlexAttention, which the trace must also run as CUDA does, is ``fake_flex``'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def _fused(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """The output of the memory-efficient kernel, or None where CUDA would not use a fused one
    (or this trace cannot say which it would)."""
    tensors = (query, key, value)
    if any(t.is_nested or t.dtype is torch.float64 or t.dim() != 4 for t in tensors):
        return None
    if is_causal and attn_mask is not None:
        return None  # an error on any device: the original says which
    if torch.is_autocast_enabled("cpu"):  # CUDA's autocast casts attention to its dtype
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = (t.to(dtype) if t.is_floating_point() else t for t in tensors)
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(dtype)
    if enable_gqa and key.shape[1] != query.shape[1]:
        if query.dtype is torch.float32 or attn_mask is not None:
            return None  # CUDA's flash kernel alone takes grouped keys: the math path
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype is torch.bool:  # CUDA adds -inf where the mask is False
            zeros = torch.zeros(attn_mask.shape, dtype=query.dtype, device=attn_mask.device)
            attn_mask = zeros.masked_fill(attn_mask.logical_not(), float("-inf"))
        shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        bias = attn_mask.expand(shape)
    with torch.autocast("cpu", enabled=False):
        try:
            output, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, bias, True, dropout_p, is_causal, scale=scale
            )
        except RuntimeError:  # shapes its kernel refuses: CUDA would take another path too
            return None
    return output


_SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _kernel(*args: Any, **kwargs: Any) -> Any:
    output = _fused(*args, **kwargs)
    if output is None:  # the CPU's own choice: the op's composite kernel, as without this one
        return _SDPA.decompose(*args, **kwargs)
    return output


@contextlib.contextmanager
def cuda_attention() -> Iterator[None]:
    """``F.scaled_dot_product_attention`` holds what CUDA's fused kernels hold while entered:
    a kernel for the op's CPU autograd key, so that it holds in backward too (a checkpointed
    block's recomputation), where a function mode is not active. Leaving removes it."""
    library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    try:
        library.impl("scaled_dot_product_attention", _kernel, "AutogradCPU")  # type: ignore[no-untyped-call]
        yield
    finally:
        library._destroy()  # type: ignore[no-untyped-call]
