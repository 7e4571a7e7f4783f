"""What this machine is: device model, driver, torch version, backend (the platform fingerprint)."""

from __future__ import annotations

import os
import platform as _platform
import socket
from typing import Literal

from autotune.result import Platform
from autotune.runner.planned_gpu import native_bf16


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine()


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def host_memory_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def nvml_driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVIDIA driver here: a fact, not an error
        return None


def resolve_device(requested: str) -> Literal["cpu", "cuda"]:
    """``auto`` becomes cuda when a CUDA device is usable, else cpu."""
    import torch

    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        return "cuda"
    return "cpu"


def detect_platform(device: Literal["cpu", "cuda"]) -> Platform:
    """Describe this machine for ``device``. Initialises CUDA only when device is cuda."""
    import torch

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        name, count, memory = props.name, torch.cuda.device_count(), int(props.total_memory)
        driver, cuda = nvml_driver_version(), torch.version.cuda
    else:
        name, count, memory = cpu_name(), 1, host_memory_bytes()
        driver, cuda = None, None
    return Platform(
        device_type=device,
        device_name=name,
        device_count=count,
        device_memory_bytes=memory,
        driver_version=driver,
        cuda_version=cuda,
        torch_version=torch.__version__,
        python_version=_platform.python_version(),
        backend="nccl" if device == "cuda" else "gloo",
        cpu_count=usable_cpus(),
        hostname=socket.gethostname(),
    )


AUTOCASTS = ("bf16", "fp16")
"""The autocast precisions, the standard recipe's preference first."""


def native_autocast(device: Literal["cpu", "cuda"]) -> tuple[tuple[str, ...], str]:
    """(the autocast precisions this machine's ``device`` computes natively, how that was told).

    A GPU computes fp16 natively, and bf16 from capability 8.0 (Ampere) on: before it (a V100,
    a T4) torch emulates bf16 and ``torch.cuda.is_bf16_supported()`` answers True all the same,
    so the probe keeps it in the space, and the recipe takes fp16 there. Without a CUDA device
    here both are returned (nothing to ask). A CPU computes 16-bit matmuls and convolutions
    natively only with the instructions for them (AVX512-BF16, AMX, AVX512-FP16); elsewhere
    oneDNN emulates them, 10-100 times slower than fp32 on the AMD EPYC of docs/benchmarks.md.
    Told by oneDNN's own checks, ``torch.ops.mkldnn._is_mkldnn_bf16_supported`` and
    ``_is_mkldnn_fp16_supported`` (private ops: pinned by tests/runner/test_platform.py); where
    they are missing, the fallback takes neither as native and says so."""
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            return AUTOCASTS, "no CUDA device here to ask: both taken as native"
        major, minor = torch.cuda.get_device_capability()
        if native_bf16(major):
            return AUTOCASTS, f"CUDA capability {major}.{minor}: bf16 and fp16 native"
        return ("fp16",), f"CUDA capability {major}.{minor}: bf16 native from 8.0 on"

    checks = {"bf16": "_is_mkldnn_bf16_supported", "fp16": "_is_mkldnn_fp16_supported"}
    try:
        native = tuple(a for a in AUTOCASTS if bool(getattr(torch.ops.mkldnn, checks[a])()))
    except (AttributeError, RuntimeError):
        return (), "fallback: this torch has no oneDNN check, so neither is taken as native"
    return native, "oneDNN's check of this CPU's instructions"
