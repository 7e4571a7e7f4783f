"""Activations a model offloads to host memory, for the memory trace's CPU tensors.

``torch.autograd.graph.save_on_cpu`` (used directly by a model that barely fits, and by torch's
own ``offload_wrapper``) packs each tensor autograd saves for backward into host memory and
unpacks it onto its device when backward needs it. On a GPU the saved activations then leave
the device: what it holds through forward is the step's working set, and each saved tensor
comes back for its own node's backward. The trace's tensors are CPU tensors, and its own
``save_on_cpu`` hooks keep them (with ``pin_memory`` a copy beside each): a plan for CUDA counted
every offloaded activation on the device, more than the model without offloading.

While ``host_offload()`` is entered (a trace for CUDA), a ``save_on_cpu`` made inside it packs a
tensor as its shape and dtype, holding nothing the device counts, and unpacks it as a new
tensor of that shape, as ``packed.to(device)`` allocates one on the device in backward. The
host bytes packed are counted (``HostOffload.bytes``). A trace for a CPU keeps torch's own
hooks: on a CPU the host is the device. Other offloading hooks (a user's own
``saved_tensors_hooks`` with streams) are traced as they run, on the CPU.
``tests/runner/test_fake_offload.py`` pins what is relied on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class HostOffload:
    """What ``save_on_cpu`` packed into host memory in a traced step (see the module)."""

    def __init__(self) -> None:
        self.bytes = 0  # host memory holding the saved tensors, all held until backward

    def hooks(self) -> tuple[Any, Any]:
        """(pack, unpack) for ``saved_tensors_hooks``."""

        def pack(tensor: torch.Tensor) -> Any:
            if tensor.layout is not torch.strided:  # sparse: left to torch's own copy
                return tensor
            self.bytes += tensor.numel() * tensor.element_size()
            return (tuple(tensor.shape), tensor.dtype)

        def unpack(packed: Any) -> torch.Tensor:
            if isinstance(packed, torch.Tensor):
                return packed
            shape, dtype = packed
            return torch.empty(shape, dtype=dtype)  # back on the device, contiguous

        return pack, unpack


@contextlib.contextmanager
def host_offload() -> Iterator[HostOffload]:
    """Within it, ``torch.autograd.graph.save_on_cpu`` offloads as it does on a GPU (see the
    module); yields what it packed."""
    from unittest import mock

    from torch.autograd.graph import save_on_cpu, saved_tensors_hooks

    offload = HostOffload()

    def offloads(self: Any, pin_memory: bool = False, device_type: str = "cuda") -> None:
        saved_tensors_hooks.__init__(self, *offload.hooks())

    with mock.patch.object(save_on_cpu, "__init__", offloads):
        yield offload
