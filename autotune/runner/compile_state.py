"""torch.compile's state in a trial's process: the one module on dynamo's private counter.

``compiled_graphs`` reads ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` (private:
pinned by tests/runner/test_compile_state.py). Where a release moves or renames it, the count is
None: a trial then takes only its first warm-up step for compilation (a later recompile would be
judged as a slow step) and its diagnostics say the count is unknown, not zero. ``reset`` is the
public ``torch.compiler.reset``. ``compiled_module`` reads the module ``torch.compile`` wraps
(``torch._dynamo.eval_frame.OptimizedModule._orig_mod``, private: pinned by the same tests);
where a release moves the class, its fallback reads ``_orig_mod`` of any module holding one.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any


def compiled_graphs() -> int | None:
    """Graphs torch.compile has compiled in this process so far; None where torch no longer
    keeps the counter this module reads (the fallback the module docstring describes)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except (ImportError, AttributeError, KeyError, TypeError, ValueError):
        return None


def compiled_since(before: int | None) -> int | None:
    """Graphs compiled since ``compiled_graphs()`` gave ``before``; None where either is unknown."""
    now = compiled_graphs()
    return None if now is None or before is None else now - before


def reset() -> None:
    """Drop what torch.compile holds in this process (its caches, compiled graphs and, on CUDA,
    the CUDA graphs' memory pools); nothing where nothing compiled (dynamo's import costs ~1 s)."""
    if "torch._dynamo" in sys.modules:
        import torch

        torch.compiler.reset()


_UNWRAPPED: weakref.WeakSet[Any] = weakref.WeakSet()


def compiled_module(model: Any) -> Any | None:
    """The module ``torch.compile`` wrapped where ``model`` is what it returned (a factory that
    returns ``torch.compile(Net())``), remembered for ``was_compiled``; None where ``model`` is
    not compiled so. Dynamo is not imported for it: a model compiled has imported it already."""
    if "torch._dynamo" not in sys.modules:
        return None
    try:
        from torch._dynamo.eval_frame import OptimizedModule

        original = model._orig_mod if isinstance(model, OptimizedModule) else None
    except ImportError:  # the fallback the module docstring describes
        import torch.nn as nn

        original = getattr(model, "_orig_mod", None) if isinstance(model, nn.Module) else None
        original = original if isinstance(original, nn.Module) else None
    if original is not None:
        _UNWRAPPED.add(original)
    return original


def was_compiled(module: Any) -> bool:
    """Whether ``module`` came out of ``compiled_module``: its factory compiled it."""
    return module in _UNWRAPPED
