"""torch.compile's state in the tool's processes: the one module on dynamo's private counter,
the module a compiled model wraps, and what a model compiles itself run eagerly where the tool
inspects it.

``eager_compiles`` runs what the model's own code compiled eagerly (the public ``force_eager``
stance) while the tool runs the model for what it is made of, not for its speed: the memory
trace, the meta-device forwards, the loss's coupling check, FSDP's bf16 forward check. Under a
dispatch mode (the trace's, ``FlopCounterMode``) dynamo compiles nothing; a ``fullgraph=True``
compile then raised, and the code it skipped stayed skipped in the process, so a later check of
the same model raised too ("Compilation was not attempted"). On the meta device, in float64 or
in bf16 it would compile for nothing (seconds a block).

``compiled_graphs`` reads ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` (private:
pinned by tests/runner/test_compile_state.py). Where a release moves or renames it, the count is
None: a trial then takes only its first warm-up step for compilation (a later recompile would be
judged as a slow step) and its diagnostics say the count is unknown, not zero. ``reset`` is the
public ``torch.compiler.reset``. ``compiled_module`` reads the module ``torch.compile`` wraps
(``torch._dynamo.eval_frame.OptimizedModule._orig_mod``, private: pinned by the same tests);
where a release moves the class, its fallback reads ``_orig_mod`` of any module holding one.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
import weakref
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def eager_compiles() -> Iterator[None]:
    """While entered, ``torch.compile`` runs what it wraps eagerly (the module docstring), and
    torch's notes on a compiled module beside global module hooks (the hooks of the tool's own
    modes) and on FlexAttention run uncompiled (by the tool) are not shown: not the user's to
    act on. The stance is left as it was where dynamo is not imported (nothing was compiled:
    ``torch.compile`` imports it, though a model compiling in its first forward is then not
    covered) or has no stances (torch before 2.6). The wrapper's frame stays, which
    ``fake_flex`` reads."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when")
        # and its note that FlexAttention runs uncompiled: here it is the tool that runs it so
        warnings.filterwarnings("ignore", message=r"flex_attention called without torch.compile")
        stance = None
        if "torch._dynamo" in sys.modules:
            import torch

            stance = getattr(torch.compiler, "set_stance", None)
        with stance("force_eager") if stance else contextlib.nullcontext():
            yield


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


def torchs_own_rules() -> None:
    """Dynamo's map of torch's functions built, with torch's own, before the memory trace puts
    stand-ins in their place (``fake_device.cuda_stand_ins``): dynamo builds it once, as it is
    imported, and builds it again when first used after a process group's start cleared it
    (``trace_rules.get_torch_obj_rule_map``, private, cached; pinned by
    tests/runner/test_fake_device.py). Built under the stand-ins it held them, and two stand-ins
    of one object failed its build ("Duplicate torch object"). Where a release moves it, dynamo's
    import alone: the stand-ins are each their own object, so a map built under them holds them
    but builds."""
    import torch._dynamo  # builds it

    rules = getattr(getattr(torch._dynamo, "trace_rules", None), "get_torch_obj_rule_map", None)
    if callable(rules):
        rules()  # cached: built again only where cleared


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
        original = wrapped_module(model)
    if original is not None:
        _UNWRAPPED.add(original)
    return original


def wrapped_module(model: Any) -> Any | None:
    """The module ``model`` holds as ``_orig_mod`` (what ``torch.compile`` wraps), whatever its
    class; None where it holds none. Remembers nothing."""
    import torch.nn as nn

    original = getattr(model, "_orig_mod", None) if isinstance(model, nn.Module) else None
    return original if isinstance(original, nn.Module) else None


def was_compiled(module: Any) -> bool:
    """Whether ``module`` came out of ``compiled_module``: its factory compiled it."""
    return module in _UNWRAPPED
