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
wrapper that keeps a tensor where it stands where they name CUDA, in backward too; what GPU code
asks a GPU to do (``torch.cuda.current_device()``, which Megatron-style layers pass as a device,
selecting and waiting for it, its streams, events and random state) is done by nothing where
this machine has no CUDA device (``idle_gpu``), a device given as an index (``device=0``) is the
trace's device too, in backward as in forward (torch's factories wrapped while a trace's
backward runs: ``indexed_devices``), ``torch.set_default_device("cuda")`` keeps the trace's
default, and pinned host memory (``.pin_memory()``, ``pin_memory=True``), which needs a GPU, is
plain. NVTX's profiling ranges (``torch.cuda.nvtx.range``, ``range_push``), which a build
without CUDA refuses ("NVTX functions not installed"), mark nothing (torch's private
``torch.cuda.nvtx._nvtx`` replaced; a CUDA build's left as it is). Where this machine has no
CUDA device, what the code asks of the device (``torch.cuda.get_device_capability()``,
``is_available()``) answers as the GPU a plan is for in a trace's step and throughout a plan for
CUDA, not in a meta build that may serve a CPU search (``planned_gpu``); ``x.is_cuda`` answers
as this machine does. A dataset GPU code keeps on the GPU is built under the same stand-ins, and
``CudaMade`` records what it made there (by name, and computed from that; not what it copied
back to the host): what a GPU holds beside every step. ``tests/runner/test_fake_device.py`` and
``test_fake_device_data.py`` pin it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.runner.compile_state import torchs_own_rules
from autotune.runner.idle_gpu import for_cpu_tensors, idle
from autotune.runner.planned_gpu import answered


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


def _moved(values: tuple[Any, ...], device: Any) -> tuple[tuple[Any, ...], bool]:
    """``values`` with every CUDA they name ``device`` (``_instead``), and whether one did."""
    moved = tuple(_instead(v, device) for v in values)
    return moved, any(a is not b for a, b in zip(moved, values, strict=True))


def _moved_keyword(kwargs: dict[str, Any], device: Any) -> bool:
    """``kwargs``' ``device``, where it names CUDA, made ``device`` in place; whether it was."""
    if "device" not in kwargs:
        return False
    named = kwargs["device"]
    kwargs["device"] = _instead(named, device)
    return kwargs["device"] is not named


class CudaMade:
    """The tensors a build made on CUDA by name while recording, and those computed from them:
    what a GPU would hold of them once the build is over (``held_bytes``). A dataset kept on
    the GPU, as small research runs keep one, is such a build."""

    def __init__(self) -> None:
        self._made: dict[int, weakref.ref[torch.Tensor]] = {}

    def add(self, value: Any) -> None:
        for tensor in _tensors(value):
            self._made[id(tensor)] = weakref.ref(tensor)

    def holds(self, value: Any) -> bool:
        """Whether a tensor of ``value`` is one of them."""
        return any(self._is_made(t) for t in _tensors(value))

    def _is_made(self, tensor: torch.Tensor) -> bool:
        ref = self._made.get(id(tensor))
        return ref is not None and ref() is tensor

    def held_bytes(self) -> int:
        """The bytes of their storages still alive, each storage once."""
        gc.collect()
        storages: dict[int, int] = {}
        for ref in self._made.values():
            tensor = ref()
            if tensor is not None:
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())


def _tensors(value: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


class CudaOnCpu(TorchFunctionMode):
    """Every CUDA device the code names is the trace's while entered (see the module): a
    tensor's own for ``Tensor.to`` and ``Tensor.cuda``, the default device for a factory.
    ``made``, where given, records what was made on CUDA so (``CudaMade``)."""

    def __init__(self, made: CudaMade | None = None) -> None:
        super().__init__()
        self.made = made

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        host = _to_host(func, args, kwargs)  # as the code names it, before it is moved
        own = args[0].device if func is torch.Tensor.to else None
        if func is torch.Tensor.cuda:
            result, named = args[0], True
        else:
            moved, named = _moved(args[1:], own) if own is not None else ((), False)
            args = (args[0], *moved) if own is not None else args
            named = _moved_keyword(kwargs, own) or named
            if kwargs.get("pin_memory"):  # host memory either way; pinning needs a GPU
                kwargs["pin_memory"] = False
            result = func(*args, **kwargs)
        made = self.made
        if made is not None and host and made.holds(result):  # the CPU's own tensor, returned
            return result.clone()  # a copy in host memory, as a GPU's copy to the host is
        if made is not None and (named or made.holds((args, kwargs))) and not host:
            made.add(result)
        return result


def _to_host(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether ``func`` copies a tensor to the host (``.cpu()``, ``.to("cpu")``): its result is
    not CUDA's, whatever it was computed from."""
    if func is torch.Tensor.cpu:
        return True
    if func is not torch.Tensor.to:
        return False
    named = [*args[1:], kwargs.get("device")]
    return any(torch.device(v).type == "cpu" for v in named if isinstance(v, (str, torch.device)))


class CudaOpsOnCpu(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """An op's CUDA ``device`` is the CPU while entered, in backward too (see the module)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _instead(kwargs["device"], torch.device("cpu"))}
        if kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}
        return func(*args, **kwargs)


class _Unmarked:
    """NVTX's calls, marking nothing (a range's depth is 0)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: 0


_TO = torch.Tensor.to  # torch's own, as this module found it

_FACTORIES = (
    "empty", "zeros", "ones", "full", "arange", "range", "linspace", "logspace", "eye", "rand",
    "randn", "randint", "randperm", "tensor", "as_tensor", "empty_strided", "scalar_tensor",
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
    "randint_like",
)  # fmt: skip
"""torch's factories taking ``device=``, wrapped by ``indexed_devices``."""

_NEW = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor")
"""The same, ``Tensor``'s."""


def _keeping_cuda_out(own: Any) -> Any:
    @functools.wraps(own)
    def factory(*args: Any, **kwargs: Any) -> Any:
        _moved_keyword(kwargs, None)  # the default device (a factory's), or new_*'s own
        return own(*args, **kwargs)

    return factory


def _device_contexts_built() -> None:
    """``with torch.device(...)`` knows the factories it gives its device by a set built once
    a process (``torch.utils._device._device_constructors``, private, cached; pinned by
    tests/runner/test_fake_device.py): built while they are wrapped (``indexed_devices``), it
    held the wrappers, and every later ``with torch.device("meta")`` made its tensors on the
    CPU. Built here first; where a release moves it, nothing is done (the wrappers stand only
    while a trace's backward runs, where no such context is entered)."""
    built = getattr(getattr(torch.utils, "_device", None), "_device_constructors", None)
    if callable(built):
        built()


@contextlib.contextmanager
def indexed_devices() -> Iterator[None]:
    """While entered (a trace for CUDA's backward), torch's factories make the default device
    of a CUDA device they are given, a device index too. A checkpointed block that makes a
    tensor on ``torch.cuda.current_device()`` runs again in backward, where no function mode is
    active and the dispatch mode (``CudaOpsOnCpu``) comes too late for an index: the Python
    binding turns it into a device first, and raised ("Cannot access accelerator device when
    none is available")."""
    from unittest import mock

    import torch.utils._device  # what _device_contexts_built reads

    _device_contexts_built()
    with contextlib.ExitStack() as stack:
        for module, names in ((torch, _FACTORIES), (torch.Tensor, _NEW)):
            owned = {name: getattr(module, name) for name in names if hasattr(module, name)}
            wrapped = {name: _keeping_cuda_out(own) for name, own in owned.items()}
            stack.enter_context(mock.patch.multiple(module, **wrapped))
        yield


@contextlib.contextmanager
def cuda_stand_ins(
    made: CudaMade | None = None, asked: set[str] | None = None, available: bool = True
) -> Iterator[None]:
    """While entered, ``Tensor.to``/``Tensor.cuda`` keep a tensor where it stands where they
    name CUDA (recording it in ``made``, where given), ``torch.cuda.current_device()`` answers
    0 on a build without a CUDA device, where the device's questions answer as the planned
    GPU's where ``asked`` is given (``planned_gpu.answered``: recorded there,
    ``is_available()`` answering ``available`` to the model's code; a meta build's questions
    are answered so only within a plan for CUDA, ``planned_gpu.importing``: the same build
    serves a CPU search's questions), and NVTX's ranges mark nothing (see the module).
    Leaving restores torch's own."""
    from unittest import mock

    torchs_own_rules()  # torch.compile's map of torch's functions: built with torch's own

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """``Tensor.to``, a CUDA device it names the tensor's own."""
        own = self.device
        args, named = _moved(args, own)
        named = _moved_keyword(kwargs, own) or named
        result = _TO(self, *args, **kwargs)
        if made is not None and named:
            made.add(result)
        return result

    def cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``Tensor.cuda``: the tensor, which already stands for a CUDA device's."""
        if made is not None:
            made.add(self)
        return self

    def pin_memory(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``Tensor.pin_memory``: the tensor, in host memory as a pinned copy would be (pinning
        needs a GPU)."""
        return self

    own_default = torch.set_default_device

    def set_default_device(device: Any) -> None:
        """``torch.set_default_device``: naming CUDA, the trace's own default is kept."""
        if _instead(device, None) is device:
            own_default(device)

    with contextlib.ExitStack() as stack:
        stack.enter_context(
            mock.patch.multiple(torch.Tensor, to=to, cuda=cuda, pin_memory=pin_memory)
        )
        stack.enter_context(mock.patch.object(torch, "set_default_device", set_default_device))
        stack.enter_context(for_cpu_tensors())  # streams, generators: the trace's are the CPU's
        if not torch.cuda.is_available():  # what a GPU does: nothing; what it is: the planned
            stack.enter_context(idle())
            if asked is not None:  # a trace's: a meta build answers in a CUDA plan's only
                stack.enter_context(answered(asked, available))
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
