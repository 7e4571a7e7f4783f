"""Hooks a model registers on its own parameters: the one module on torch's private hook
dictionaries.

``gradient_hooked`` names the trainable parameters that carry a gradient hook
(``Tensor.register_hook``, kept in ``Tensor._backward_hooks``) or a hook run after the gradient
accumulates (``Tensor.register_post_accumulate_grad_hook``, in
``Tensor._post_accumulate_grad_hooks``). Both dictionaries are private: pinned by
tests/runner/test_tensor_hooks.py. Where a release renames them, ``gradient_hooked`` returns
None, not an empty list: unknown, not "none".

Why it matters: FSDP2's ``fully_shard`` replaces a module's parameters with sharded ones, and
the hooks stay behind on the parameters it dropped. Gradients a model clips or scales so (RL
code clamps them that way) then train unclipped: measured on two gloo ranks, a clamp to 1e-4
left gradients up to 3.6. Checkpointing, compile and DDP keep the parameters, and the hooks run.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import first_three

_DICTIONARIES = ("_backward_hooks", "_post_accumulate_grad_hooks")


def gradient_hooked(model: Any) -> list[str] | None:
    """The names of ``model``'s trainable parameters that carry a gradient hook, in order; None
    where a parameter lacks either of the dictionaries this module reads (a torch that keeps
    its hooks elsewhere: the fallback the module docstring describes)."""
    hooked = []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        if not all(hasattr(parameter, attribute) for attribute in _DICTIONARIES):
            return None
        if any(getattr(parameter, attribute) for attribute in _DICTIONARIES):
            hooked.append(name)
    return hooked


def fsdp_drops_hooks(model: Any) -> str | None:
    """Why FSDP would train ``model`` other than it trains itself: the parameters that carry
    gradient hooks, named; None where none does (or torch keeps its hooks elsewhere)."""
    hooked = gradient_hooked(model)
    if not hooked:
        return None
    return (
        "FSDP replaces the parameters it shards, and the gradient hooks the model registers on "
        f"them ({first_three(hooked)}) stay on the ones it dropped: its gradients would train "
        "unhooked (unclipped, unscaled)"
    )
