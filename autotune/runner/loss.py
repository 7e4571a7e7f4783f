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
            if class_dimension(tuple(logits.shape), tuple(target.shape)) == 1:
                return F.cross_entropy(logits.float(), target)  # PyTorch's (N, C, d1, ...)
            return F.cross_entropy(logits.flatten(0, -2).float(), target.flatten())
        return F.mse_loss(logits.float(), target.float())
    return logits.float().square().mean()


_SAID: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()


def class_dimension(scores: tuple[int, ...], target: tuple[int, ...]) -> int:
    """Where the class scores are: the dimension the target lacks. -1 (the last, as Hugging Face
    models return them: (N, ..., C)) or 1 (PyTorch's cross-entropy layout: (N, C, d1, ...)).
    When both fit, the last is taken and said once; when neither does, a one-line error."""
    import warnings

    last = len(scores) == len(target) + 1 and scores[:-1] == target
    second = (
        len(scores) == len(target) + 1 and scores[:1] == target[:1] and scores[2:] == target[1:]
    )
    if last and second and len(scores) > 2 and (scores, target) not in _SAID:
        _SAID.add((scores, target))  # (N, C) is both at once: nothing to choose there
        warnings.warn(
            f"cross-entropy: output {list(scores)} and target {list(target)} fit class scores "
            "in the last dimension and in dimension 1; taking the last (pass --loss to choose)",
            stacklevel=3,
        )
    if last:
        return -1
    if second:
        return 1
    raise WorkloadError(
        f"cross-entropy cannot pair the output {list(scores)} with the integer target "
        f"{list(target)}: class scores must be in the last dimension (N, ..., C) or in "
        "dimension 1 (N, C, d1, ...), the target without them; or pass --loss"
    )


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
