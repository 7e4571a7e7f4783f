"""What this machine is: device model, driver, torch version, backend (the platform fingerprint)."""

from __future__ import annotations

import os
import platform as _platform
import socket
from typing import Literal

from autotune.result import Platform


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
