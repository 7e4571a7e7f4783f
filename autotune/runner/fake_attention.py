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
makes of it. Where CUDA takes no fused kernel it runs the math path (the composite kernel's,
never the CPU's flash kernel, which holds what a fused one does): grouped-query attention in
float32 or beside a mask, float64, inputs not of four dimensions. The code's own pick counts as
on CUDA: ``sdpa_kernel(SDPBackend.MATH)`` holds the scores, a fused backend alone (flash,
memory-efficient, cuDNN) holds a fused kernel's tensors, and a step none of the enabled kernels
takes (flash alone in float32) fails as CUDA's does. The kernels are those of the GPU traced for
(``planned_gpu.capability``): before capability 8.0 (a V100, a T4) there is no flash or cuDNN
kernel, and the memory-efficient one takes no bf16, so bf16 attention takes the math path there.
Nested tensors keep the op's own kernel.
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

from autotune.runner.planned_gpu import capability


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
    if not _fusable(query, key, attn_mask, enable_gqa):
        return None
    if enable_gqa and key.shape[1] != query.shape[1]:
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


def _enabled(backend: str) -> bool:
    """Whether SDPA's ``backend`` (flash, mem_efficient, cudnn, math) is enabled: the flags
    ``sdpa_kernel`` sets, which a build without CUDA keeps too."""
    return bool(getattr(torch.backends.cuda, f"{backend}_sdp_enabled")())


def _fusable(query: Any, key: Any, attn_mask: Any, enable_gqa: bool) -> bool:
    """Whether a fused kernel the code leaves enabled (``sdpa_kernel``, ``torch.backends.cuda``'s
    flags) takes these inputs on the GPU traced for (``planned_gpu.capability``): flash in 16
    bits without a mask and cuDNN's in 16 bits, each from capability 8.0, the memory-efficient
    kernel in float16 and float32, and in bf16 from 8.0 (torch's ``sdp_utils``). Each saves the
    output and a log-sum-exp per query."""
    half = query.dtype in (torch.float16, torch.bfloat16)
    ampere = capability() >= (8, 0)
    flash = ampere and _enabled("flash") and half and attn_mask is None
    if enable_gqa and key.shape[1] != query.shape[1]:
        return flash  # CUDA's flash kernel alone takes grouped keys: else the math path
    efficient = _enabled("mem_efficient") and (ampere or query.dtype is not torch.bfloat16)
    return flash or efficient or (ampere and _enabled("cudnn") and half)


_SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _math(*args: Any, **kwargs: Any) -> Any:
    """What CUDA runs where no fused kernel takes the call: the math path (scores and softmax
    held for backward), never the CPU's flash kernel, which holds what a fused one does. Where
    the code disabled the math path too, CUDA has no kernel: raised as CUDA raises it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not _enabled("math"):
        raise RuntimeError(
            "scaled_dot_product_attention: no kernel CUDA has enabled takes these inputs "
            "(the math path is disabled; flash takes 16-bit inputs without a mask, from capability "
            "8.0)"
        )
    with sdpa_kernel(SDPBackend.MATH):
        return _SDPA.decompose(*args, **kwargs)


def _kernel(*args: Any, **kwargs: Any) -> Any:
    if any(getattr(t, "is_nested", False) for t in args[:3]):  # the op's own, as without this
        return _SDPA.decompose(*args, **kwargs)
    output = _fused(*args, **kwargs)
    return _math(*args, **kwargs) if output is None else output


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
