"""torch's causal attention biases, built inside the memory trace.

``torch.nn.attention.bias.causal_lower_right(q, kv)`` (and ``causal_upper_left``) returns a
``CausalBias``: a tensor subclass that ``F.scaled_dot_product_attention`` recognises and turns
into ``is_causal=True`` or a kernel's own causal mask type. Its constructor makes the tensor
with ``torch.Tensor.__new__(CausalBias, variant, q, kv)``, which torch reads as a size: every
bias is an uninitialised float32 tensor of ``variant x q x kv`` on the default device. Under the
trace's fake tensor mode that tensor is a ``FakeTensor`` before it can be a ``CausalBias``, and
torch refuses ("Creating a new Tensor subclass CausalBias but the raw Tensor object is already
associated to a python object of type FakeTensor"): a model that masks so was never traced.
Any dispatch mode does the same (a tensor it returns is already a Python object): the memory
tracker over a real step, ``FlopCounterMode`` over a meta-device forward.

While ``causal_biases()`` is entered, a ``CausalBias`` is built beneath the trace's modes, as
the real one is: real, uninitialised, on the CPU. It holds nothing a step counts: its values are
never read or written (no page of it becomes resident on a CPU), and on a GPU run it lies in
host memory unless the default device is CUDA. SDPA's handling of it then runs on the trace's
fake query, key and value as on a real step's. Relies on
``torch.utils._python_dispatch._disable_current_modes`` (private: pinned by
``tests/runner/test_fake_shadows.py``); ``tests/runner/test_fake_bias.py`` pins the rest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def _built_beneath_modes(cls: type, *args: Any) -> Any:
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return torch.Tensor.__new__(cls, *args)


@contextlib.contextmanager
def causal_biases() -> Iterator[None]:
    """Within it, ``torch.nn.attention.bias.CausalBias`` can be built under a dispatch mode
    (see the module). Where this torch has no such class, nothing is done."""
    from unittest import mock

    try:
        from torch.nn.attention.bias import CausalBias
    except ImportError:  # an older torch: no model uses one
        yield
        return
    # put back as it was: today's torch has none of its own (it inherits Tensor's)
    with mock.patch.object(CausalBias, "__new__", staticmethod(_built_beneath_modes)):
        yield
