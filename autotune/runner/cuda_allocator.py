"""The CUDA caching allocator's settings, applied per trial: the one module on PyTorch's private
allocator-settings calls (``torch._C._accelerator_setAllocatorSettings`` and its getter; before
them, ``torch.cuda.memory._set_allocator_settings``), pinned by
``tests/runner/test_cuda_allocator.py``.

``expandable_segments`` is usually set by ``PYTORCH_CUDA_ALLOC_CONF`` when a process starts;
a rank that runs trial after trial (a reused Ray gang) must instead set it, on or off, for every
trial, or one trial's setting would leak into the next. New segments follow the setting; the
trial empties the cache first (``release_earlier_trials``), so none of the old kind are left.
"""

from __future__ import annotations

import torch


def apply_expandable_segments(on: bool) -> str:
    """Set ``expandable_segments`` for this process's allocator; return the allocator's
    settings as read back (what reached the rank), or why they could not be set."""
    setting = f"expandable_segments:{'True' if on else 'False'}"
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if setter is None:  # older releases: the CUDA-only, since deprecated, spelling
        legacy = getattr(torch.cuda.memory, "_set_allocator_settings", None)
        if legacy is None:
            return f"unavailable in torch {torch.__version__}: set PYTORCH_CUDA_ALLOC_CONF"
        legacy(setting)
        return setting
    setter(setting)
    return str(getter()) if getter is not None else setting
