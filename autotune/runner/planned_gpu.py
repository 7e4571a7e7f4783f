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
machine has no CUDA device) they answer as ``PLANNED``, an H100 80GB: the GPU whose measurements
this project's CUDA numbers are, with the kernels the trace's attention assumes (flash and
memory-efficient, capability 8.0 and later), all of its memory free, one device a process (as a
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
import sys
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any

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
"""The lent H100's name and memory as torch reported them (``results/gpu/
h100_gpt2_124m_search.json``, its platform), its capability and multiprocessors as NVIDIA
gives them."""


def planned_words() -> str:
    """``PLANNED`` in words, for a plan's assumptions."""
    gib = PLANNED.total_memory / 2**30
    return f"an {PLANNED.name} (capability {PLANNED.major}.{PLANNED.minor}, {gib:.1f} GiB)"


def _callers_own(depth: int = 2) -> bool:
    """Whether the function ``depth`` frames up was called by torch's or autotune's own code."""
    module = sys._getframe(depth).f_globals.get("__name__", "")
    return any(module == top or module.startswith(top + ".") for top in ("torch", "autotune"))


@contextlib.contextmanager
def answered(asked: set[str], available: bool = True) -> Iterator[None]:
    """While entered, ``torch.cuda``'s questions about the device answer as ``PLANNED`` (and
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

    capability = (PLANNED.major, PLANNED.minor)
    flash = "torch.backends.cuda.is_flash_attention_available"
    with (
        mock.patch.object(torch.backends.cuda, "is_flash_attention_available", told(flash, True)),
        mock.patch.multiple(
            torch.cuda,
            is_available=is_available,
            get_device_capability=told("get_device_capability", capability),
            get_device_properties=told("get_device_properties", PLANNED),
            get_device_name=told("get_device_name", PLANNED.name),
            is_bf16_supported=told("is_bf16_supported", True),
            device_count=told("device_count", 1),
            mem_get_info=told("mem_get_info", (PLANNED.total_memory, PLANNED.total_memory)),
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
