"""Activations offloaded by torch's ``save_on_cpu`` in the memory trace (``fake_offload``): in
host memory for a CUDA device, as torch's own hooks keep them on a CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from autotune.bench.traced_step import real_step_peak
from autotune.runner.fake_memory import trace_step
from autotune.runner.fake_offload import host_offload
from autotune.runner.workload import WorkloadSpec
from tests.fixtures.traced import Offloaded, Stack

OFFLOADED = WorkloadSpec(model="tests.fixtures.traced:Offloaded")
PLAIN = WorkloadSpec(model="tests.fixtures.traced:Stack")


def _saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """What autograd saves for backward in a real forward of ``model``, each tensor once as
    ``save_on_cpu`` packs it."""
    saved = 0

    def pack(tensor: torch.Tensor) -> Any:
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        Stack.forward(model, x)  # the plain forward under these hooks alone
    return saved


def test_a_cuda_trace_keeps_offloaded_activations_off_the_device() -> None:
    # Before, a plan for CUDA counted every offloaded activation on the device, with a pinned
    # copy beside it: more than the same model without offloading.
    offloaded = trace_step(OFFLOADED, 1024, device_type="cuda")
    plain = trace_step(PLAIN, 1024, device_type="cuda")
    torch.manual_seed(0)
    saved = _saved_bytes(Stack(), torch.randn(1024, 256))
    assert offloaded.offloaded_bytes == saved and plain.offloaded_bytes == 0
    assert offloaded.activations_bytes < plain.activations_bytes / 2
    assert offloaded.parameters_bytes == plain.parameters_bytes


def test_the_cuda_trace_holds_a_real_step_that_keeps_the_saved_tensors_elsewhere() -> None:
    # the same hooks on real tensors: a tensor comes back (allocated) only for its backward
    torch.manual_seed(0)
    real = real_step_peak(Offloaded(), torch.randn(1024, 256), above=host_offload)
    traced = trace_step(OFFLOADED, 1024, device_type="cuda")
    assert traced.total_bytes == pytest.approx(real, rel=0.01)


def test_a_cpu_trace_keeps_torchs_own_hooks_and_their_copies() -> None:
    # on a CPU the host is the device: a pinned offload copies each saved tensor beside it
    offloaded = trace_step(OFFLOADED, 1024)
    assert offloaded.offloaded_bytes == 0
    assert offloaded.activations_bytes > trace_step(PLAIN, 1024).activations_bytes
    torch.manual_seed(0)
    real = real_step_peak(Offloaded(), torch.randn(1024, 256))
    assert offloaded.total_bytes == pytest.approx(real, rel=0.01)


def test_save_on_cpu_is_torchs_own_again_after_the_trace() -> None:
    with host_offload() as offload:
        with torch.autograd.graph.save_on_cpu():
            y = torch.randn(4, requires_grad=True).exp()
        y.sum().backward()
    assert offload.bytes == 4 * 4  # exp saves its output
    packed: list[Any] = []
    hooks = torch.autograd.graph.save_on_cpu()
    packed.append(hooks.pack_hook(torch.ones(2)))
    assert isinstance(packed[0][1], torch.Tensor)  # torch's: (device, the host copy)
