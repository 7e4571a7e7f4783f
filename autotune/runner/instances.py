"""Models a reference names as an instance, not as a class or factory: a module-level model
(``mymodule:model``), or a model object given to the API, which in the caller's own process is
the caller's model itself (``autotune.runner.pickled``). Loading such a reference gives the same
object every time, so whatever the search does to it before any trial (the coupling check casts
it to float64, the bf16 check to bf16, the memory trace swaps its tensors for fake ones) would
be done to the user's model. Those steps work on a copy: a real one where they run the model, one
whose tensors are meta or fake where they only trace it (no parameter memory). A rank copies its
model for each trial the same way where ``copy.deepcopy`` refuses it (``WorkloadCache``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from autotune.errors import WorkloadError
from autotune.runner.references import resolve_reference


def names_an_instance(reference: str) -> bool:
    """Whether ``reference`` names a built model (every load gives the same object)."""
    import torch.nn as nn

    return isinstance(resolve_reference(reference, "--model")[1], nn.Module)


def real_copy(model: Any, reference: str) -> Any:
    """A deep copy of ``model`` in host memory, for a check that runs it on the CPU and changes
    it (a model the caller moved to its GPU is copied from there, not on it); a
    ``WorkloadError`` naming ``reference`` where it cannot be copied (it holds a lock, an open
    file)."""
    return copy_with_tensors(model, lambda t: t.to("cpu", copy=True), reference)


def copy_with_tensors(model: Any, convert: Callable[[Any], Any], reference: str) -> Any:
    """A copy of ``model``'s modules whose parameters, buffers and tensors kept as plain
    attributes are ``convert`` of the original's (a meta or fake tensor, which copies none of
    its memory; a host copy; a clone); tied ones stay tied, lazy ones are copied as they are,
    a Parameter subclass becomes a Parameter. The original is left as it was."""
    import torch
    from torch.nn.parameter import is_lazy

    memo: dict[int, Any] = {}
    for tensor in model.parameters():
        if id(tensor) not in memo and not is_lazy(tensor):
            swapped = convert(tensor.detach())
            memo[id(tensor)] = torch.nn.Parameter(swapped, requires_grad=tensor.requires_grad)
    for tensor in model.buffers():
        if tensor is not None and id(tensor) not in memo and not is_lazy(tensor):
            memo[id(tensor)] = convert(tensor)
    for module in model.modules():  # a tensor kept as a plain attribute: weight_norm's weight,
        for value in vars(module).values():  # computed, which deepcopy refuses to copy
            if isinstance(value, torch.Tensor) and id(value) not in memo and not is_lazy(value):
                memo[id(value)] = convert(value.detach())
    try:
        return copy.deepcopy(model, memo)
    except Exception as error:
        raise _uncopyable(reference, error) from None


def _uncopyable(reference: str, error: Exception) -> WorkloadError:
    return WorkloadError(
        f"--model {reference!r}: the built model cannot be copied ({type(error).__name__}: "
        f"{error}), and checks before the trials would change it; give the class or a factory "
        "that builds it"
    )
