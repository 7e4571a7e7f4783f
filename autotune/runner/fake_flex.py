"""FlexAttention (``torch.nn.attention.flex_attention``) in the memory trace for a CUDA device.

FlexAttention refuses to train on a CPU: its front end raises where an input requires a
gradient, and the trace's tensors are CPU tensors, so a model calling it could not be traced
at all. On CUDA it runs one of two ways:

- without ``torch.compile``, its dense implementation, the higher-order op's composite kernel
  (``sdpa_dense``, and ``sdpa_dense_backward`` in backward): the scores, masked and softmaxed,
  sequence x sequence per head in float32, exist while a call runs; saved for backward are only
  its inputs, its output and a log-sum-exp per query;
- compiled (``torch.compile`` around it, or around a function or module that calls it, as
  Hugging Face's and torchtitan's models do), its fused kernel, which holds no scores: its
  output and a log-sum-exp (and a maximum) per query, and the gradients of its inputs in
  backward: the op's fake-tensor kernels give those shapes.

``CudaFlexAttention`` runs each call the way CUDA would: the fused way where a frame above the
call is ``torch.compile``'s wrapper of a function (the trace's own dispatch modes stop dynamo
from compiling anything, so the model's code runs eagerly inside it), else the dense way; the
trace takes the trial's own compile knob as eager, an upper bound, as it does for every op.
Entered above the memory tracker, so that the tracker sees what the kernels allocate. The
front end's refusal of a CPU input is lifted while entered, and it calls the op itself rather
than through ``torch.compile``'s eager backend, which a dispatch mode stops. Called so, the op
leaves out of autograd what a ``score_mod`` captures (torch warns of it), where CUDA's compiled
front end lifts it and trains it: a parameter a ``score_mod`` reads (``parameters_read``) and
left without a gradient is given one after backward (``give_gradients``).

Private names it relies on, pinned by ``tests/runner/test_fake_flex.py``: the front end's
``_validate_device`` and ``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG``; the two higher-order ops,
their composite kernels and their fake kernels; ``compile_wrapper``, dynamo's wrapper. Where
this torch lacks the first ones (``available``), it does nothing and the trace stops at the
refusal, as before; without the fake kernels every call is traced dense (an upper bound).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

_WRAPPER = ("compile_wrapper", "eval_frame.py")  # torch.compile's wrapper of a function


@dataclass(frozen=True)
class _Kernels:
    front: Any  # the module of the front end
    forward: Any  # the forward's higher-order op
    dense: dict[Any, Any]  # op -> its composite kernel
    fused: dict[Any, Any]  # op -> its fake-tensor kernel (empty where this torch has none)


def flex_kernels() -> _Kernels | None:
    """What ``CudaFlexAttention`` relies on, or None where this torch has other names."""
    try:
        front = importlib.import_module("torch.nn.attention.flex_attention")
        hops = importlib.import_module("torch._higher_order_ops.flex_attention")
        key = torch._C.DispatchKey.CompositeExplicitAutograd
        forward, backward = hops.flex_attention, hops.flex_attention_backward
        dense = {forward: forward.py_kernels[key], backward: backward.py_kernels[key]}
    except (ImportError, AttributeError, KeyError):
        return None
    if not all(
        hasattr(front, name)
        for name in ("_validate_device", "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG")
    ):
        return None
    fake = (
        getattr(hops, "flex_attention_fake_impl", None),
        getattr(hops, "flex_attention_backward_fake_tensor_mode", None),
    )
    fused = {forward: fake[0], backward: fake[1]} if all(callable(f) for f in fake) else {}
    return _Kernels(front, forward, dense, fused)


def compiled_above(frame: FrameType | None) -> bool:
    """Whether ``frame`` or one above it is ``torch.compile``'s wrapper of a function."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == _WRAPPER[0] and code.co_filename.endswith(_WRAPPER[1]):
            return True
        frame = frame.f_back
    return False


def parameters_read(score_mod: Any, query: Any) -> list[Any]:
    """The parameters ``score_mod`` reads (a learned bias it indexes), from one call of it on
    scalars as the op calls it; none where that call fails."""
    import torch.nn as nn
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves

    found: list[Any] = []

    class Reads(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            found.extend(a for a in tree_leaves((args, kwargs)) if isinstance(a, nn.Parameter))
            return func(*args, **(kwargs or {}))

    scalars = (query.new_zeros(()), *(query.new_zeros((), dtype=torch.int) for _ in range(4)))
    try:
        with Reads(), torch.no_grad():
            score_mod(*scalars)
    except Exception:  # a modification that needs more than scalars: nothing is found
        return []
    return found


class CudaFlexAttention(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Enter above the memory tracker, in a trace for a CUDA device (see the module);
    ``dense_calls`` and ``fused_calls`` count the forwards run each way. ``fused``: every call
    fused, as in a model the trial compiles whole."""

    supports_higher_order_operators = True

    def __init__(self, fused: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.every_call_fused = fused  # the step as a compiled model runs it
        self.dense_calls = 0
        self.fused_calls = 0
        self._kernels = flex_kernels()
        self._saved: tuple[Any, Any] | None = None
        self._compiled = False  # the coming call's, told by the front end's check
        self._fused: Any = WeakIdKeyDictionary()  # a forward's query -> whether it ran fused
        self._read: dict[int, Any] = {}  # parameters a score_mod read, by id

    def give_gradients(self) -> None:
        """After backward: each parameter a ``score_mod`` read, left without a gradient, gets
        one, as CUDA's compiled front end (which lifts what the modification captures) trains
        it, where the op called without compiling, as here, leaves it out."""
        for parameter in self._read.values():
            if parameter.requires_grad and parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
        self._read.clear()

    @property
    def available(self) -> bool:
        """Whether this torch has what it relies on (else it does nothing)."""
        return self._kernels is not None

    def __enter__(self) -> CudaFlexAttention:
        if self._kernels is not None:
            front = self._kernels.front
            self._saved = (front._validate_device, front._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG)
            validate = self._saved[0]

            def on_cuda(query: Any, key: Any, value: Any) -> None:
                self._compiled = compiled_above(sys._getframe(1))  # from the front end's caller
                if query.device.type != "cpu":  # the trace's CPU stands for CUDA
                    validate(query, key, value)

            front._validate_device = on_cuda
            front._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
        return super().__enter__()  # type: ignore[no-any-return, no-untyped-call]

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        if self._kernels is not None and self._saved is not None:
            front = self._kernels.front
            front._validate_device, front._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = self._saved
            self._saved = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kernels = self._kernels
        if kernels is None or func not in kernels.dense:
            return func(*args, **(kwargs or {}))
        fused = (self.every_call_fused or self._compiled) and bool(kernels.fused)
        if func is kernels.forward:
            self._fused[args[0]] = fused
            self._read.update((id(p), p) for p in parameters_read(args[3], args[0]))
            self.fused_calls += fused
            self.dense_calls += not fused
        else:  # backward: as its forward ran (a checkpointed block's recomputation included)
            fused = self._fused.get(args[0], fused)
        kernel = kernels.fused[func] if fused else kernels.dense[func]
        return kernel(*args, **(kwargs or {}))
