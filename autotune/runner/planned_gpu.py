"""The GPU a plan for CUDA is made for, as the model's own code asks after it.

GPU code asks which device it runs on: ``torch.cuda.get_device_capability()`` or
``torch.backends.cuda.is_flash_attention_available()`` to pick its attention (flash from
capability 8.0), ``torch.cuda.is_bf16_supported()`` for its precision,
``torch.cuda.get_device_properties(0).total_memory`` or ``mem_get_info()`` to size a cache,
``device_count()`` to split its work, ``torch.cuda.is_available()`` to choose "cuda" over "cpu"
for a buffer or a dataset. On a machine without a CUDA device most of them raise ("Torch not
compiled with CUDA enabled", "Found no NVIDIA driver"), ``device_count()`` answers 0 and
``is_available()`` False: such a model could not be planned for CUDA at all, or was planned on
the path it takes on a CPU.

While ``answered(asked)`` is entered (a CUDA trace's ``fake_device.cuda_stand_ins`` where this
machine has no CUDA device) they answer as the planned GPU (``planned()``): ``PLANNED``, an H100
80GB, the GPU whose measurements this project's CUDA numbers are, unless the plan names another
of ``GPUS`` or gives one by its capability and memory (``described``; ``planning``, ``autotune
plan --gpu``); its capability also decides the kernels the
trace's attention takes (``capability``, ``fake_attention``: flash and cuDNN's from 8.0, the
memory-efficient kernel in bf16 from 8.0); all of its memory free, one device a process (as a
launcher that gives each rank its own device shows it). ``is_available()`` answers True to the
model's code only: its callers in torch and in autotune are told what this machine has, so that
torch's own checks (a checkpoint's random state, a DataLoader's pinning) do not turn to a device
that is not here. Where the model's code, told True, reached for what a GPU alone has and the
trace cannot stand in for (a CUDA graph, a library's own CUDA kernel), the trace is run again
told False (``available=False``): the plan is then for the path the code takes without a GPU,
and says so. What was asked goes in ``asked``, for the plan to say what it assumed.
``tests/runner/test_planned_gpu.py`` pins it.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from autotune.units import parse_bytes

AVAILABLE = "is_available"
"""The name ``asked`` holds where the model's code asked ``torch.cuda.is_available()``."""

TOLD_UNAVAILABLE = "is_available: False"
"""The name ``asked`` holds where the step was traced telling the model's code False."""


@dataclass(frozen=True)
class Properties:
    """``torch.cuda.get_device_properties``'s answer: the fields GPU code reads of it."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int


PLANNED = Properties(
    name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=85_017_493_504,
    multi_processor_count=132,
)  # fmt: skip
"""The GPU a plan for CUDA is made for unless it names another (``GPUS``): the lent H100's name
and memory as torch reported them (``results/gpu/h100_gpt2_124m_search.json``, its platform),
its capability and multiprocessors as NVIDIA gives them."""

_GIB = 2**30

GPUS: dict[str, Properties] = {
    "h100": PLANNED,
    "h200": Properties("NVIDIA H200", 9, 0, int(139.8 * _GIB), 132),
    "a100-80gb": Properties("NVIDIA A100-SXM4-80GB", 8, 0, 80 * _GIB, 108),
    "a100-40gb": Properties("NVIDIA A100-SXM4-40GB", 8, 0, 40 * _GIB, 108),
    "l4": Properties("NVIDIA L4", 8, 9, 24 * _GIB, 58),
    "a10g": Properties("NVIDIA A10G", 8, 6, 24 * _GIB, 80),
    "t4": Properties("Tesla T4", 7, 5, 16 * _GIB, 40),
    "v100": Properties("Tesla V100-SXM2-16GB", 7, 0, 16 * _GIB, 80),
}
"""The GPUs a plan can be made for (``autotune plan --gpu``), by the name given there. The
H100's memory is what torch reported on the lent one, the H200's what the lent one's budget
line implies (125.82 GiB, 90% of it); the others' as NVIDIA lists them, of which a process
gets a little less (the H100: 79.2 GiB of its 80). Capabilities and multiprocessors as NVIDIA
gives them."""

CUSTOM_NAME = "CUDA GPU"
"""What ``get_device_name()`` answers for a GPU given by its capability (``described``)."""


def described(spec: str, memory: int | None) -> Properties:
    """A GPU not in ``GPUS``, given by its capability and memory (``8.9:48GiB``; without the
    memory, ``memory``: the plan's device memory). Its multiprocessors are answered as the
    H100's. Raises ``ValueError`` saying what is accepted."""
    match = re.fullmatch(r"(\d+)\.(\d)(?::(.+))?", spec.strip())
    if match is None:
        raise ValueError(
            f"use one of {', '.join(GPUS)}, or a capability and memory such as 8.9:48GiB"
        )
    major, minor, given = int(match.group(1)), int(match.group(2)), match.group(3)
    total = parse_bytes(given) if given else memory
    if total is None:
        raise ValueError(f"give its memory ({spec}:48GiB) or --device-memory")
    return Properties(CUSTOM_NAME, major, minor, total, PLANNED.multi_processor_count)


MEASURED = frozenset({"h100", "h200"})
"""Those of ``GPUS`` whose memory was seen on a lent one, not taken from a list."""

_planned = [PLANNED]
"""The GPUs ``planning`` entered, the one planned for now last."""


def planned() -> Properties:
    """The GPU a plan for CUDA is made for: ``PLANNED`` unless ``planning`` names another."""
    return _planned[-1]


@contextlib.contextmanager
def planning(gpu: Properties) -> Iterator[None]:
    """While entered, traces for CUDA on a machine without a CUDA device are made for ``gpu``:
    the model's code asking after its GPU is told ``gpu``'s answers, and attention takes the
    kernels ``gpu`` has (``capability``). A forked trace (``side_by_side``) inherits it."""
    _planned.append(gpu)
    try:
        yield
    finally:
        _planned.pop()


def capability() -> tuple[int, int]:
    """The compute capability a trace for CUDA assumes: this machine's GPU's where it has one,
    else the planned GPU's. Asked here, it is not recorded as asked by the model's code."""
    import torch

    if torch.cuda.is_available():  # the stand-in answers torch's and autotune's callers truly
        major, minor = torch.cuda.get_device_capability()
        return major, minor
    gpu = planned()
    return gpu.major, gpu.minor


def native_bf16(major: int) -> bool:
    """Whether a GPU of capability ``major``.x computes bf16 natively (8.0 on); before that
    torch emulates it, and ``torch.cuda.is_bf16_supported()`` answers True all the same."""
    return major >= 8


def planned_words(gpu: Properties | None = None) -> str:
    """``gpu`` (the planned one unless given) in words, for a plan's lines."""
    gpu = gpu or planned()
    gib = gpu.total_memory / _GIB
    return f"{gpu.name} (capability {gpu.major}.{gpu.minor}, {gib:.1f} GiB)"


def _callers_own(depth: int = 2) -> bool:
    """Whether the function ``depth`` frames up was called by torch's or autotune's own code."""
    module = sys._getframe(depth).f_globals.get("__name__", "")
    return any(module == top or module.startswith(top + ".") for top in ("torch", "autotune"))


@contextlib.contextmanager
def answered(asked: set[str], available: bool = True) -> Iterator[None]:
    """While entered, ``torch.cuda``'s questions about the device answer as ``planned()`` (and
    ``is_available()`` as ``available``, to the model's code), each one asked recorded by its
    name in ``asked``. Leaving restores torch's own."""
    from unittest import mock

    import torch

    own_available = torch.cuda.is_available

    def is_available() -> bool:
        if _callers_own():
            return own_available()
        asked.add(AVAILABLE if available else TOLD_UNAVAILABLE)
        return available

    def told(name: str, answer: Any) -> Any:
        def question(*args: Any, **kwargs: Any) -> Any:
            asked.add(name)
            return answer

        question.__name__ = name
        return question

    gpu = planned()

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        asked.add("is_bf16_supported")
        return including_emulation or native_bf16(gpu.major)  # torch emulates it before 8.0

    flash = "torch.backends.cuda.is_flash_attention_available"
    with (
        mock.patch.object(torch.backends.cuda, "is_flash_attention_available", told(flash, True)),
        mock.patch.multiple(
            torch.cuda,
            is_available=is_available,
            get_device_capability=told("get_device_capability", (gpu.major, gpu.minor)),
            get_device_properties=told("get_device_properties", gpu),
            get_device_name=told("get_device_name", gpu.name),
            is_bf16_supported=is_bf16_supported,
            device_count=told("device_count", 1),
            mem_get_info=told("mem_get_info", (gpu.total_memory, gpu.total_memory)),
        ),
    ):
        yield


_ASKED_AS_IMPORTED: dict[Hashable, set[str]] = {}
"""What each workload's modules asked as a plan for CUDA first imported them (``importing``)."""


@contextlib.contextmanager
def importing(workload: Hashable) -> Iterator[None]:
    """While entered (a plan for CUDA, from its first look at ``workload``, where its modules
    are imported, to its builds on the meta device), the questions answer as in a trace, on a
    machine without a CUDA device: a module choosing ``DEVICE = "cuda" if
    torch.cuda.is_available() else "cpu"`` as it is imported keeps that answer for the rest of
    the process, its traces included. What it asked is kept as long (``asked_as_imported``)."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    with answered(_ASKED_AS_IMPORTED.setdefault(workload, set())):
        yield


def asked_as_imported(workload: Hashable) -> frozenset[str]:
    """What ``workload``'s modules asked as a plan for CUDA imported them (``importing``)."""
    return frozenset(_ASKED_AS_IMPORTED.get(workload, ()))


def assumed(asked: tuple[str, ...] | set[str] | frozenset[str]) -> str | None:
    """What a plan assumed of the GPU where the model's code asked after it (``asked``, as
    ``answered`` records it), or None where it asked nothing."""
    questions = sorted(
        f"{name if name.startswith('torch.') else 'torch.cuda.' + name}()"
        for name in asked
        if name != TOLD_UNAVAILABLE
    )
    counted = " (one device a process)" if "device_count" in asked else ""
    said = []
    if questions:
        said.append(
            f"the model's code asked which GPU it runs on ({', '.join(questions)}): answered as "
            f"{planned_words()}{counted}, the step traced for that GPU (on another the code may "
            "choose otherwise)"
        )
    if TOLD_UNAVAILABLE in asked:
        said.append(
            "told torch.cuda.is_available() True, the model's code reached for what only a GPU "
            "has here: its step traced told False, on the path it takes without a GPU"
        )
    return "; ".join(said) or None


def gpu_words(gpu: Properties, named: str | None, memory_from_it: bool) -> str:
    """A plan for CUDA's line on the GPU it is for: ``gpu``, named ``named`` (None: the
    default), whose memory is the plan's device memory where ``memory_from_it``."""
    import torch

    if torch.cuda.is_available():  # ``gpu`` is this machine's (``this_machines``)
        return (
            f"this machine's {gpu.name} (capability {gpu.major}.{gpu.minor}): its answers to "
            "the model's code, its attention kernels"
        )
    said = [planned_words(gpu)]
    if named is None:
        said.append(f"the default; --gpu names another ({', '.join(GPUS)})")
    if gpu.name == CUSTOM_NAME:
        said.append(
            f"given by its capability and memory: its name answered as {CUSTOM_NAME!r}, its "
            f"multiprocessors as an H100's {PLANNED.multi_processor_count}"
        )
    elif memory_from_it:
        source = (
            "as seen on a lent one"
            if named is None or named in MEASURED
            else "as NVIDIA lists it, not measured: a process there gets a little less; "
            "--device-memory gives what it gets"
        )
        said.append(f"the device memory is its {gpu.total_memory / _GIB:.1f} GiB, {source}")
    if not native_bf16(gpu.major):
        said.append(
            "no native bf16 before capability 8.0: bf16 rows hold for memory (torch emulates "
            "its arithmetic), and bf16 attention takes the math path there, no fused kernel"
        )
    return "; ".join(said)


def this_machines() -> Properties:
    """This machine's GPU (the first), as ``Properties``."""
    import torch

    own = torch.cuda.get_device_properties(0)
    return Properties(own.name, own.major, own.minor, own.total_memory, own.multi_processor_count)
