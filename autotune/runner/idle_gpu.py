"""What GPU code asks a GPU to do, done by nothing in a trace for CUDA on a machine without one.

Besides naming CUDA (``fake_device``), GPU code selects and waits for its device
(``torch.cuda.set_device``, ``with torch.cuda.device(i)``, ``torch.cuda.synchronize()``), asks
which one is current (``torch.cuda.current_device()``, a device index Megatron-style layers pass
as ``device=``), overlaps its copies on a side stream (``torch.cuda.Stream()``,
``with torch.cuda.stream(s)``, ``s.wait_stream(...)``, ``x.record_stream(s)``), times its parts
with events, saves and restores the GPU's random state around a recomputation of its own
(``torch.cuda.get_rng_state()``, as checkpointing code written before torch's does), draws from
a generator of its own (``torch.Generator(device="cuda")``) and resets the allocator's peak
between its parts. On a build without CUDA, or without a device, each raises ("Torch not
compiled with CUDA enabled", "Tried to instantiate dummy base class Stream", "Cannot get CUDA
generator without ATen_cuda library"), and a plan for CUDA could not be made of such a model.

While ``idle()`` is entered (``fake_device.cuda_stand_ins``, where this machine has no CUDA
device) they do nothing that moves memory: the current device is 0, selecting and waiting do
nothing, a stream is one the trace's one device runs in order (waiting on it, recording on it:
nothing), an event has elapsed no time, the random state is a generator's state of CUDA's size
(saved, restored: nothing changes), and the allocator's statistics reset nothing.
``for_cpu_tensors()``, entered on any machine (on a GPU's too the trace's tensors are the
CPU's), makes ``Tensor.record_stream`` nothing (no stream holds a CPU tensor) and a generator
made for CUDA the CPU's (a CUDA generator cannot draw a CPU tensor).
``tests/runner/test_fake_device.py`` pins them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_STATE_BYTES = 16
"""A CUDA generator's state as ``get_rng_state`` gives it: its seed and its offset."""


class _Stream:
    """A stream of the trace's one device: its work runs in order, so there is nothing to wait
    for, and an event recorded on it has happened."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _Event:
        return event if event is not None else _Event()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _Event:
    """An event of the trace's one device: recorded, it has happened."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Any) -> float:
        return 0.0


_CURRENT = _Stream()


class _SameDevice(contextlib.nullcontext):  # type: ignore[type-arg]
    """``torch.cuda.device(i)``: the trace's one device stays selected."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()


class _SameStream(_SameDevice):
    """``torch.cuda.stream(s)``: the trace's one stream stays selected (a class of its own, as
    ``_nothing``'s functions are)."""


_GENERATOR = torch.Generator


class _GeneratorType(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, _GENERATOR)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, _GENERATOR)


class _Generator(metaclass=_GeneratorType):
    """``torch.Generator``: one made for CUDA is the CPU's, where the trace's tensors stand."""

    def __new__(cls, device: Any = "cpu") -> Any:
        named = torch.device(device) if isinstance(device, (str, torch.device)) else device
        cuda = isinstance(named, int) or getattr(named, "type", None) == "cuda"
        return _GENERATOR("cpu" if cuda else device)


def _rng_state(device: Any = "cuda") -> torch.Tensor:
    return torch.zeros(_STATE_BYTES, dtype=torch.uint8)


def _rng_states() -> list[torch.Tensor]:
    return [_rng_state()]  # the trace's one device's


def _nothing() -> Any:
    """Selecting a device, waiting for it, restoring its random state, resetting its
    allocator's statistics: nothing to do on the trace's one device. A function of its own for
    each name, as dynamo's map of torch's functions needs (``compile_state.torchs_own_rules``)."""

    def nothing(*args: Any, **kwargs: Any) -> None:
        pass

    return nothing


def _first(*args: Any, **kwargs: Any) -> int:
    """``torch.cuda.current_device()``: the trace's one device."""
    return 0


def _current() -> Any:
    """``current_stream``, ``default_stream``: the trace's one stream (each its own function,
    as ``_nothing``'s)."""

    def current(*args: Any, **kwargs: Any) -> _Stream:
        return _CURRENT

    return current


@contextlib.contextmanager
def idle() -> Iterator[None]:
    """While entered, what GPU code asks a GPU to do is done by nothing (see the module).
    Leaving restores torch's own."""
    from unittest import mock

    import torch.cuda.random as random

    states: dict[str, Any] = {"get_rng_state": _rng_state, "set_rng_state": _nothing(),
              "get_rng_state_all": _rng_states, "set_rng_state_all": _nothing()}  # fmt: skip
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            mock.patch.multiple(
                torch.cuda,
                current_device=_first,
                set_device=_nothing(),
                synchronize=_nothing(),
                device=_SameDevice,
                Stream=_Stream,
                Event=_Event,
                current_stream=_current(),
                default_stream=_current(),
                stream=_SameStream,
                reset_peak_memory_stats=_nothing(),
                reset_max_memory_allocated=_nothing(),
                reset_accumulated_memory_stats=_nothing(),
                **states,
            )
        )
        stack.enter_context(mock.patch.multiple(random, **states))
        yield


@contextlib.contextmanager
def for_cpu_tensors() -> Iterator[None]:
    """While entered, ``Tensor.record_stream`` does nothing and a generator made for CUDA is the
    CPU's (see the module)."""
    from unittest import mock

    with (
        mock.patch.object(torch.Tensor, "record_stream", _nothing()),
        mock.patch.object(torch, "Generator", _Generator),
    ):
        yield
