"""Checks a real kernel makes that a fake one skips, for the memory trace.

Fake tensors run an op's meta kernel, which computes its output's shape and dtype but not
everything the real kernel checks: torch's fake ``mm``, ``addmm``, ``bmm`` and convolution take
inputs of different floating dtypes (a float32 batch beside float16 weights), where every real
kernel, CPU or CUDA, refuses them ("expected m1 and m2 to have the same dtype"). A trace then
predicted a step no trial could run, and a plan called it fitting.

While ``SameDtypes`` is entered (inside the fake mode, so that it sees each op before the fake
mode does), such an op with floating inputs of different dtypes raises as the real one does,
and the trace stops on the model's own error. Autocast casts before any mode sees the op.
``tests/runner/test_fake_checks.py`` pins it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_CHECKED = {
    _aten.mm.default: 2, _aten.addmm.default: 3, _aten.bmm.default: 2,
    _aten.baddbmm.default: 3, _aten.addbmm.default: 3, _aten.convolution.default: 3,
}  # fmt: skip
"""The ops checked, and how many of their first arguments are the tensors that must agree."""


class SameDtypes(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """A matmul or convolution of floating inputs of different dtypes raises (see the module)."""

    supports_higher_order_operators = True  # FlexAttention's, passed on as they came

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        count = _CHECKED.get(func)
        if count is not None:
            dtypes = {
                a.dtype
                for a in args[:count]
                if isinstance(a, torch.Tensor) and a.is_floating_point()
            }
            if len(dtypes) > 1:
                named = " and ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
                raise RuntimeError(
                    f"{func.__name__.split('.')[0]} of inputs of different dtypes ({named}), "
                    "which its real kernel refuses"
                )
        return func(*args, **(kwargs or {}))
