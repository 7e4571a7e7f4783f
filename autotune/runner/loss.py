"""The loss a trial (and ``autotune.apply``) uses when the user gives none: the model's own loss
when its output carries one, else a rule chosen from the target."""

from __future__ import annotations

from typing import Any

from autotune.errors import WorkloadError


def default_loss(output: Any, target: Any) -> Any:
    """The model's own loss when its output carries one; otherwise a loss from the target.

    Order: a scalar tensor output; an output object with a tensor ``.loss`` (Hugging Face); a
    dict with ``"loss"``. Else, with a target: cross-entropy for integer targets (class indices,
    logits in the last dimension), mean squared error for floating targets. With no target at all
    (synthetic data) the mean square of the output stands in, for measuring speed only.
    """
    import torch  # lazily: the workload module, and so the CLI, import this one
    import torch.nn.functional as F

    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, torch.Tensor) and output.dim() == 0:
        loss = output
    if isinstance(loss, torch.Tensor):
        return loss
    logits = first_tensor(output)
    if logits is None:
        raise WorkloadError(
            f"the model returned {type(output).__name__} with no tensor in it; return a tensor "
            "or an object with a .loss, or pass --loss"
        )
    if isinstance(target, torch.Tensor):
        if not target.is_floating_point():
            return F.cross_entropy(logits.flatten(0, -2).float(), target.flatten())
        return F.mse_loss(logits.float(), target.float())
    return logits.float().square().mean()


def first_tensor(value: Any) -> Any:
    """The first tensor in a model's output: the tensor itself, ``.logits``, or the first one
    found in a dict, list or tuple."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if hasattr(value, "logits"):
        return value.logits
    if isinstance(value, (list, tuple)):
        for item in value:
            found = first_tensor(item)
            if found is not None:
                return found
    return None
