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

FlexAttention (``torch.nn.attention.flex_attention``) refuses to train on a CPU: its front end
raises where an input requires a gradient, and the trace's tensors are CPU tensors. On CUDA
without ``torch.compile`` it runs its dense implementation, the higher-order op's composite
kernel (``sdpa_dense``, and ``sdpa_dense_backward`` in backward): the scores, masked and
softmaxed, sequence x sequence per head in float32 while a call runs, and saved for backward
only its inputs, its output and a log-sum-exp per query. ``EagerFlexAttention`` traces that,
as the trace takes every compiled step as eager (an upper bound: compiled, its fused kernel
holds no scores). Where this torch lacks the private names it relies on (``available``), it
does nothing, and the trace stops at the front end's refusal, as before.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


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


def _flex_kernels() -> tuple[Any, Any, dict[Any, Any]] | None:
    """FlexAttention's front end, its forward op, and its two higher-order ops' composite
    (dense) kernels; None where this torch has other names (a fallback: the trace then stops at
    the front end)."""
    try:
        front = importlib.import_module("torch.nn.attention.flex_attention")
        hops = importlib.import_module("torch._higher_order_ops.flex_attention")
        key = torch._C.DispatchKey.CompositeExplicitAutograd
        forward, backward = hops.flex_attention, hops.flex_attention_backward
        dense = {forward: forward.py_kernels[key], backward: backward.py_kernels[key]}
    except (ImportError, AttributeError, KeyError):
        return None
    if not hasattr(front, "_validate_device"):
        return None
    if not hasattr(front, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"):
        return None
    return front, forward, dense


class EagerFlexAttention(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Enter above the memory tracker, in a trace for a CUDA device: FlexAttention runs its
    dense kernels, whose scores the tracker then sees, instead of the fake tensors' kernel
    (which holds none); ``calls`` counts them. The front end's refusal of a CPU input that
    requires a gradient is lifted while entered (a CUDA input's checks stay), and it calls the
    op itself rather than through ``torch.compile``'s eager backend, which a dispatch mode
    stops (CUDA's eager path runs the same op)."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls = 0
        self._kernels = _flex_kernels()
        self._saved: tuple[Any, Any] | None = None

    @property
    def available(self) -> bool:
        """Whether this torch has what it relies on (else it does nothing)."""
        return self._kernels is not None

    def __enter__(self) -> EagerFlexAttention:
        if self._kernels is not None:
            front = self._kernels[0]
            self._saved = (front._validate_device, front._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG)
            validate = self._saved[0]

            def on_cuda(query: Any, key: Any, value: Any) -> None:
                if query.device.type != "cpu":  # the trace's CPU stands for CUDA
                    validate(query, key, value)

            front._validate_device = on_cuda
            front._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
        return super().__enter__()  # type: ignore[no-any-return, no-untyped-call]

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        if self._kernels is not None and self._saved is not None:
            front = self._kernels[0]
            front._validate_device, front._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = self._saved
            self._saved = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        dense = self._kernels[2].get(func) if self._kernels is not None else None
        if dense is None:
            return func(*args, **(kwargs or {}))
        self.calls += func is self._kernels[1]  # type: ignore[index]
        return dense(*args, **(kwargs or {}))
