"""torch.compile's state in a trial's process: the one module on dynamo's private counter.

``compiled_graphs`` reads ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` (private:
pinned by tests/runner/test_compile_state.py). Where a release moves or renames it, the count is
None: a trial then takes only its first warm-up step for compilation (a later recompile would be
judged as a slow step) and its diagnostics say the count is unknown, not zero. ``reset`` is the
public ``torch.compiler.reset``.
"""

from __future__ import annotations

import sys


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
