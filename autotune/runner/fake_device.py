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
raises on a build without CUDA. NVTX's profiling ranges (``torch.cuda.nvtx.range``,
``range_push``), which a build without CUDA refuses ("NVTX functions not installed"), mark
nothing while ``unmarked_ranges()`` is entered (torch's private ``torch.cuda.nvtx._nvtx``
replaced; a CUDA build's left as it is). Whatever else asks for CUDA
(``torch.cuda.current_device()``, ``x.is_cuda``) answers as this machine does.
``tests/runner/test_fake_device.py`` pins it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


def _instead(value: Any, device: Any) -> Any:
    """``device`` where ``value`` names CUDA (a ``torch.device``, "cuda", "cuda:1"), else
    ``value``."""
    if isinstance(value, torch.device) and value.type == "cuda":
        return device
    if isinstance(value, str) and (value == "cuda" or value.startswith("cuda:")):
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
