"""CUDA's autocast policy, applied to the memory trace's CPU tensors.

The memory trace runs on a CPU (``autotune.runner.fake_memory``), under CPU autocast, whose op
lists differ from CUDA's: under CUDA autocast, softmax, log-softmax, layer and RMS norm, sums,
``exp``, ``pow`` and the losses run in float32 (ATen's ``AT_FORALL_FP32`` and
``AT_FORALL_FP32_SET_OPT_DTYPE``), where CPU autocast leaves them in the input's bfloat16 or
float16. A model that softmaxes its own attention scores then saves a float32 copy of them for
backward beside the low-precision copy its next matmul casts: on an H200, GPT-2 small's
explicit attention at micro-batch 32 in bf16 held 22.7 GB more than a CPU-policy trace counted
(65.4 GB allocated against 42.7 GB traced; ``results/gpu/``).

While ``cuda_policy()`` is entered, the ops that CUDA's autocast casts and CPU's leaves alone
get a CPU autocast kernel that does what CUDA's does: cast floating inputs to float32 (the
fp32 list), or ask for a float32 result (the set-opt-dtype list: softmax, sum, cumsum, ...), or
cast them to the autocast dtype (the matmuls CPU's list lacks), then run the op with autocast
off. Leaving the context removes the kernels. ``torch.library`` is public; removing a
library's kernels (``Library._destroy``), reading an op's schema (``OpOverload._schema``) and
asking whether CUDA's autocast has a kernel for an op (``torch._C.
_dispatch_has_kernel_for_dispatch_key``, answered by every build, the CPU build too) are not.
The op lists are copied from ``ATen/autocast_mode.h`` of torch 2.13; an op of them that the
installed torch's CUDA autocast has no kernel for (``rms_norm`` before 2.13: it decomposes, and
its ``pow`` runs in float32) gets none here either (``cuda_autocasts``).
``tests/runner/test_fake_autocast.py`` pins all of it: the lists, as this torch's CUDA autocast
takes them, against the installed header (where the wheel ships it), and CPU autocast as it was
once the context is left.

A model may name CUDA's autocast itself: a region kept in float32 whatever the trainer's
autocast (``torch.autocast("cuda", enabled=False)``, ``torch.cuda.amp.autocast(enabled=False)``
as a decorator), or its own low precision (``torch.autocast("cuda", dtype=torch.bfloat16)``).
On a CPU without CUDA torch disables such a region, and the trace, whose stand-in for CUDA's
autocast is the CPU's, ran it in the trainer's precision: an fp32 region of a bf16 trial traced
in bf16 (its activations half what a GPU holds), a model's own bf16 traced in fp32. While
``cuda_regions()`` is entered (a trace for CUDA) such a region acts on the CPU autocast instead,
with CUDA's default dtype (float16) where it names none. A decorator made at import with
``enabled=True`` was already disabled by torch on this machine and stays so (its region runs in
the trainer's precision). So does a function the model decorates with
``torch.amp.custom_fwd(device_type="cuda", cast_inputs=...)`` (or ``torch.cuda.amp``'s): it
asks ``torch.is_autocast_enabled("cuda")``, which answers the trace's CPU autocast while
``cuda_regions()`` is entered (``get_autocast_dtype("cuda")`` too), and its inputs are cast
where they stand, the trace's CPU (``_cast_as_cuda``): a function kept in float32 so saves
float32 tensors in a 16-bit trial, as on a GPU, not the 16-bit ones it came with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

# fmt: off
FP32 = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
    "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
]
"""CUDA's ``AT_FORALL_FP32``: floating inputs cast to float32."""

FP32_RESULT = [
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
    # named tensors' overloads: in torch 2.11's list, not in 2.13's
    "prod.dim_Dimname", "softmax.Dimname", "log_softmax.Dimname", "cumprod.dimname",
    "cumsum.dimname", "sum.dim_DimnameList",
]
"""CUDA's ``AT_FORALL_FP32_SET_OPT_DTYPE``: a floating first input's result asked for in
float32 (``dtype=torch.float32`` where the call gives none)."""

LOWER_PRECISION = [
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot",
    "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
]
"""CUDA's ``AT_FORALL_LOWER_PRECISION_FP``: floating inputs cast to the autocast dtype."""

CPU_COVERED = [
    "nll_loss", "nll_loss2d", "mse_loss", "cosine_embedding_loss", "hinge_embedding_loss",
    "poisson_nll_loss", "smooth_l1_loss", "l1_loss", "huber_loss", "margin_ranking_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "multilabel_margin_loss",
    "kl_div", "binary_cross_entropy_with_logits", "cdist", "prod", "prod.dim_int",
    "prod.dim_Dimname",
    "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "prelu", "addmm", "matmul", "mm",
    "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "scaled_dot_product_attention",
]
"""Ops CPU autocast already has a kernel for (under the same policy, or its own): left to it."""
# fmt: on


def _eligible(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype is not torch.float64
    )


def _cast_all(values: Any, dtype: torch.dtype) -> Any:
    if _eligible(values):
        return values.to(dtype)
    if isinstance(values, (list, tuple)):
        return type(values)(_cast_all(v, dtype) for v in values)
    return values


def _op(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _casting(op: Any, dtype: torch.dtype | None = None) -> Callable[..., Any]:
    """A kernel running ``op`` on its floating inputs cast to ``dtype`` (else autocast's)."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        to = dtype or torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            return op(*_cast_all(args, to), **{k: _cast_all(v, to) for k, v in kwargs.items()})

    return kernel


def _float_result(op: Any) -> Callable[..., Any]:
    names = [a.name for a in op._schema.arguments]
    where = names.index("dtype")

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", enabled=False):
            if args and _eligible(args[0]):
                if len(args) > where:
                    if args[where] is None:
                        args = (*args[:where], torch.float32, *args[where + 1 :])
                elif kwargs.get("dtype") is None:
                    kwargs["dtype"] = torch.float32
            return op(*args, **kwargs)

    return kernel


def cuda_autocasts(name: str) -> bool:
    """Whether the installed torch's CUDA autocast has a kernel for the op ``name`` (an op of
    these lists; without one, the op runs in its inputs' dtype, or decomposes into ops that
    have one). Where torch no longer answers, the lists (torch 2.13's) are taken whole."""
    try:
        op = _op(name)
    except AttributeError:  # an op this torch does not have (2.11's named overloads, in 2.13)
        return False
    has_kernel = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    if has_kernel is None:
        return True  # the fallback: 2.13's lists, as copied
    return bool(has_kernel(op.name(), "AutocastCUDA"))


def _kernels() -> Iterator[tuple[str, Callable[..., Any]]]:
    policies: tuple[tuple[list[str], Callable[[Any], Callable[..., Any]]], ...] = (
        (FP32, partial(_casting, dtype=torch.float32)),
        (FP32_RESULT, _float_result),
        (LOWER_PRECISION, _casting),
    )
    for names, make in policies:
        for name in names:
            if name not in CPU_COVERED and cuda_autocasts(name):
                yield name, make(_op(name))


@contextlib.contextmanager
def cuda_policy() -> Iterator[None]:
    """CPU autocast follows CUDA's op lists while entered (nothing changes where it is off)."""
    library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    try:
        for name, kernel in _kernels():
            library.impl(name, kernel, "AutocastCPU")  # type: ignore[no-untyped-call]
        yield
    finally:
        library._destroy()  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def cuda_regions() -> Iterator[None]:
    """An autocast region the model names for CUDA acts on the trace's CPU autocast while
    entered (see the module): made inside it, as a CPU region of CUDA's dtype; made before it
    (a decorator, at import), entered as one."""
    from unittest import mock

    from torch.amp.autocast_mode import autocast

    made, entered, left = autocast.__init__, autocast.__enter__, autocast.__exit__
    own_enabled, own_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype

    def enabled(device_type: str = "cuda") -> bool:  # no device: CUDA's, as torch's own
        return bool(own_enabled(_on_cpu(device_type)))

    def autocast_dtype(device_type: str) -> torch.dtype:
        return own_dtype(_on_cpu(device_type))

    def init(
        self: Any,
        device_type: str,
        dtype: torch.dtype | None = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        if device_type == "cuda":  # CUDA's default dtype, float16, where none is named
            device_type, dtype = "cpu", dtype or own_dtype("cuda")
        made(self, device_type, dtype, enabled, cache_enabled)

    def enter(self: Any) -> Any:
        if self.device == "cuda" or getattr(self, _STOOD_IN, 0):
            setattr(self, _STOOD_IN, getattr(self, _STOOD_IN, 0) + 1)
            self.device = "cpu"
        return entered(self)  # type: ignore[no-untyped-call]

    def leave(self: Any, *exc: Any) -> Any:
        try:
            return left(self, *exc)
        finally:
            depth = getattr(self, _STOOD_IN, 0)
            if depth:
                setattr(self, _STOOD_IN, depth - 1)
                if depth == 1:
                    self.device = "cuda"  # as it was made, for any use after the trace

    with contextlib.ExitStack() as stack:
        stack.enter_context(
            mock.patch.multiple(autocast, __init__=init, __enter__=enter, __exit__=leave)
        )
        stack.enter_context(
            mock.patch.multiple(
                torch, is_autocast_enabled=enabled, get_autocast_dtype=autocast_dtype
            )
        )
        stack.enter_context(_cast_as_cuda())
        yield


def _on_cpu(device_type: str) -> str:
    """The trace's CPU where ``device_type`` is CUDA: the autocast that stands for CUDA's."""
    return "cpu" if device_type == "cuda" else device_type


@contextlib.contextmanager
def _cast_as_cuda() -> Iterator[None]:
    """``custom_fwd(device_type="cuda", cast_inputs=...)`` casts the tensors its ``_cast``
    finds on CUDA (private: ``torch.amp.autocast_mode._cast``, pinned by
    tests/runner/test_fake_autocast.py): the trace's CPU tensors too, while entered. Where a
    release moves it, nothing is done: such a function's inputs stay as they come (said in
    the module)."""
    from unittest import mock

    import torch.amp.autocast_mode as mode

    own = getattr(mode, "_cast", None)
    if own is None:
        yield
        return

    def cast(value: Any, device_type: str, dtype: torch.dtype) -> Any:
        return own(value, _on_cpu(device_type), dtype)

    with mock.patch.object(mode, "_cast", cast):
        yield


_STOOD_IN = "_autotune_cuda_on_cpu"
"""How deep a CUDA region made before the trace is entered as a CPU one (``cuda_regions``)."""
