"""CUDA named by the model's own code, for the memory trace's CPU tensors.

GPU-only code makes tensors on CUDA by name: ``torch.arange(n, device="cuda")`` for positions,
``mask.cuda()``, ``x.to("cuda")``, a buffer made with ``device="cuda"``. The trace's tensors are
CPU tensors standing for a CUDA device's, so such a tensor met them on two devices ("Expected
all tensors to be on the same device") or, made by ``.cuda()`` on a build without CUDA, raised
("not linked with support for cuda devices"): ``autotune plan`` for CUDA devices, the one way to
learn what such a model needs without a GPU, could not trace it.

While a ``CudaOnCpu`` mode is entered (a trace for CUDA: the model's build, its step), a device
the code names as CUDA is the trace's: a factory's ``device=`` the default device (the CPU),
``Tensor.to``'s and ``Tensor.cuda()``'s the tensor's own (it already stands on the device; a
model's ``.to("cuda")`` in its factory keeps its parameters where they are, on the meta device
where the build falls back to it). A function mode is not active in backward, where a
checkpointed block runs its forward again: there ``CudaOpsOnCpu``, a dispatch mode, makes the
CPU of an op's ``device`` (a factory's, a copy's); a ``.cuda()`` in a checkpointed block still
raises on a build without CUDA, as does ``.to("cuda")``: their Python bindings ask for the
device before any mode sees the call. So while ``cuda_stand_ins()`` is entered (the build and
the step of a trace for CUDA), ``Tensor.to`` and ``Tensor.cuda`` are torch's own behind a
wrapper that keeps a tensor where it stands where they name CUDA, in backward too;
``torch.cuda.current_device()``, which GPU code passes as a device (Megatron-style layers:
``torch.empty(..., device=torch.cuda.current_device())``), answers 0 where this build has no
CUDA device, and a device given as an index (``device=0``) is the trace's device too, in
forward. NVTX's profiling ranges (``torch.cuda.nvtx.range``, ``range_push``), which a build
without CUDA refuses ("NVTX functions not installed"), mark nothing (torch's private
``torch.cuda.nvtx._nvtx`` replaced; a CUDA build's left as it is). Whatever else asks for CUDA
(``torch.cuda.get_device_capability()``, ``x.is_cuda``) answers as this machine does: the
trace cannot know which GPU the plan is for. ``tests/runner/test_fake_device.py`` pins it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


def _instead(value: Any, device: Any) -> Any:
    """``device`` where ``value`` names CUDA (a ``torch.device``, "cuda", "cuda:1", a device
    index), else ``value``."""
    if isinstance(value, torch.device) and value.type == "cuda":
        return device
    if isinstance(value, str) and (value == "cuda" or value.startswith("cuda:")):
        return device
    if isinstance(value, int) and not isinstance(value, bool):  # an accelerator's index
        return device
    return value


class CudaOnCpu(TorchFunctionMode):
    """Every CUDA device the code names is the trace's while entered (see the module): a
    tensor's own for ``Tensor.to`` and ``Tensor.cuda``, the default device for a factory."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to:
            own = args[0].device
            args = (args[0], *(_instead(a, own) for a in args[1:]))
            if "device" in kwargs:
                kwargs["device"] = _instead(kwargs["device"], own)
        elif "device" in kwargs:
            kwargs["device"] = _instead(kwargs["device"], None)
        return func(*args, **kwargs)


class CudaOpsOnCpu(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """An op's CUDA ``device`` is the CPU while entered, in backward too (see the module)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _instead(kwargs["device"], torch.device("cpu"))}
        return func(*args, **kwargs)


class _Unmarked:
    """NVTX's calls, marking nothing (a range's depth is 0)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: 0


_TO = torch.Tensor.to  # torch's own, as this module found it


def _to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``Tensor.to``, a CUDA device it names the tensor's own."""
    own = self.device
    args = tuple(_instead(a, own) for a in args)
    if "device" in kwargs:
        kwargs["device"] = _instead(kwargs["device"], own)
    return _TO(self, *args, **kwargs)


def _cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``Tensor.cuda``: the tensor, which already stands for a CUDA device's."""
    return self


def _current_device() -> int:
    return 0


@contextlib.contextmanager
def cuda_stand_ins() -> Iterator[None]:
    """While entered, ``Tensor.to``/``Tensor.cuda`` keep a tensor where it stands where they
    name CUDA, ``torch.cuda.current_device()`` answers 0 on a build without a CUDA device, and
    NVTX's ranges mark nothing (see the module). Leaving restores torch's own."""
    from unittest import mock

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.multiple(torch.Tensor, to=_to, cuda=_cuda))
        if not torch.cuda.is_available():
            stack.enter_context(mock.patch.object(torch.cuda, "current_device", _current_device))
        stack.enter_context(unmarked_ranges())
        yield


@contextlib.contextmanager
def unmarked_ranges() -> Iterator[None]:
    """NVTX's ranges mark nothing while entered, where this build has no NVTX (see the
    module); where torch no longer has the stub it names, nothing is done."""
    from unittest import mock

    import torch.cuda.nvtx as nvtx

    stub = getattr(nvtx, "_NVTXStub", None)
    if stub is None or not isinstance(getattr(nvtx, "_nvtx", None), stub):  # a CUDA build's own
        yield
        return
    with mock.patch.object(nvtx, "_nvtx", _Unmarked()):
        yield
