"""The loss a trial (and ``autotune.apply``) uses when the user gives none: the model's own loss
when its output carries one, else a rule chosen from the target."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.errors import WorkloadError

TARGET_KEYS = ("labels", "label", "targets", "target", "y")
"""The keys of a dict batch the default loss takes as its target, the first found (Hugging
Face's name first)."""
TARGET_PARAMETERS = TARGET_KEYS[:-1]
"""The names of a forward's parameter that takes the target (``training.target_parameter``):
``TARGET_KEYS`` but ``y``, as often an input (a diffusion model's class labels,
``forward(x, timesteps, y=None)``)."""


LEFT_OUT = "; the output's "
"""How a rule goes on where it leaves out a scalar the output holds, or scores shaped as those
it takes (``DefaultLoss.rule``)."""


class DefaultLoss:
    """The loss when the user gives none: the model's own loss when its output carries one;
    otherwise a loss from the target. ``rule`` says which it took at its last call, for the
    trial's report.

    Order: a scalar tensor output; an output object with a tensor ``.loss`` (Hugging Face); a
    dict with ``"loss"``; a tuple whose first item is a scalar (``(loss, logits, ...)``, Hugging
    Face's with ``return_dict=False``); where the forward was given the target, the one scalar
    its output holds (nanoGPT's ``(logits, loss)``); a dict of losses alone, summed
    (``_losses_dict``: torchvision's detection models). Else, with a target (of a dict batch, the
    first of ``TARGET_KEYS``): cross-entropy for integer targets (class indices, logits in the last
    dimension), mean squared error for floating targets. With no target at all (synthetic data),
    or one no rule takes (a list of dicts), the mean square of the output stands in, for
    measuring speed only, and the rule says so.
    """

    def __init__(self) -> None:
        self.rule = ""

    def __call__(self, output: Any, target: Any, fed: bool = False) -> Any:
        """``fed``: the forward was given the target (``fed_target``), so a scalar its output
        holds beside the logits is the model's own loss."""
        loss, self.rule = _default_loss(output, target, fed)
        return loss


def fed_target(kwargs: Mapping[str, Any]) -> bool:
    """Whether the forward's keyword arguments hold a target (one of ``TARGET_PARAMETERS``)."""
    return any(key in kwargs for key in TARGET_PARAMETERS)


def call_loss(loss_fn: Any, output: Any, target: Any, kwargs: Mapping[str, Any]) -> Any:
    """``loss_fn(output, target)``; the default loss is also told whether the forward, called
    with ``kwargs``, was given the target (``fed_target``)."""
    if isinstance(loss_fn, DefaultLoss):
        return loss_fn(output, target, fed=fed_target(kwargs))
    return loss_fn(output, target)


def _default_loss(output: Any, target: Any, fed: bool = False) -> tuple[Any, str]:
    """(the loss, the rule that made it, in words): ``DefaultLoss``'s order."""
    import torch  # lazily: the workload module, and so the CLI, import this one

    loss, rule = getattr(output, "loss", None), "the model output's .loss"
    if loss is None and isinstance(output, dict):
        loss, rule = output.get("loss"), "the model output's 'loss'"
    if loss is None and isinstance(output, torch.Tensor) and output.dim() == 0:
        loss, rule = output, "the model's scalar output"
    if loss is None and isinstance(output, (tuple, list)) and output:
        first = output[0]  # Hugging Face's tuples (return_dict=False) put the loss first
        if isinstance(first, torch.Tensor) and first.dim() == 0 and len(output) > 1:
            loss, rule = first, "the scalar first in the model's output, (loss, ...)"
    scalars = [] if isinstance(loss, torch.Tensor) else _scalar_items(output)
    if loss is None and fed and len(scalars) == 1:  # nanoGPT's (logits, loss)
        where, loss = scalars[0]
        rule = f"the model's own loss, the scalar {where} of its output (its forward was given "
        rule += "the target)"
    if loss is None and _losses_dict(output, scalars, fed):  # torchvision's detection models
        loss = sum(value for _, value in scalars)
        rule = f"the sum of the model's own losses, {', '.join(w for w, _ in scalars)}"
    if isinstance(loss, torch.Tensor):
        return loss, rule
    logits = first_tensor(output)
    if logits is None:
        raise WorkloadError(
            f"the model returned {type(output).__name__} with no tensor in it; return a tensor "
            "or an object with a .loss, or pass --loss"
        )
    loss, rule = _target_loss(logits, target)
    # a scalar beside the scores: an auxiliary loss (a mixture's load balancing) left out
    if left := [where for where, value in scalars if value is not logits]:
        rule += (
            f"{LEFT_OUT}scalar {', '.join(left)} is left out (an auxiliary loss? add it with "
            "--loss or autotune_loss)"
        )
    # scores of the same shape beside them: an auxiliary classifier's (Inception's, a
    # segmentation model's "aux"), whose loss torchvision's reference training adds
    if target is not None and (alike := _alike(output, logits)):
        rule += (
            f"{LEFT_OUT}{', '.join(alike)}, shaped as these scores, "
            f"{'is' if len(alike) == 1 else 'are'} left out (an auxiliary head's? add its "
            "loss with --loss or autotune_loss)"
        )
    return loss, rule


def _alike(output: Any, logits: Any) -> list[str]:
    """Where ``output`` (a dict, list or tuple) holds other tensors of ``logits``'s shape."""
    import torch

    return [
        where
        for where, value in _items(output)
        if isinstance(value, torch.Tensor)
        and value is not logits
        and value.dim() > 0
        and value.shape == logits.shape
    ]


def _losses_dict(output: Any, scalars: list[tuple[str, Any]], fed: bool) -> bool:
    """Whether ``output`` is a dict of two or more losses and nothing else (``scalars``: its
    scalar items), to be summed as torchvision's reference training sums a detection model's
    ``loss_classifier``, ``loss_box_reg``, ...: every value a scalar, and either the forward was
    given the target (RetinaNet's ``classification`` and ``bbox_regression``) or every key
    names a loss."""
    if not isinstance(output, dict) or len(scalars) < 2 or len(scalars) != len(output):
        return False
    return fed or all("loss" in str(key).lower() for key in output)


def _items(output: Any) -> list[tuple[str, Any]]:
    """(where, value) of each item a dict, list or tuple output holds (a named tuple's by its
    field: Inception's ``aux_logits``)."""
    if isinstance(output, dict):
        return [(repr(key), value) for key, value in output.items()]
    if isinstance(output, tuple) and hasattr(output, "_fields"):
        return [(repr(field), value) for field, value in zip(output._fields, output, strict=True)]
    if isinstance(output, (tuple, list)):
        return [(f"item {i}", value) for i, value in enumerate(output)]
    return []


def _scalar_items(output: Any) -> list[tuple[str, Any]]:
    """(where, tensor) of each scalar tensor a tuple, list or dict output holds."""
    import torch

    return [(w, v) for w, v in _items(output) if isinstance(v, torch.Tensor) and v.dim() == 0]


def _target_loss(logits: Any, target: Any) -> tuple[Any, str]:
    """(the loss of ``logits`` against ``target``, its rule): ``DefaultLoss``'s last rules."""
    import torch
    import torch.nn.functional as F

    against = ""
    if isinstance(target, Mapping):
        key = next((k for k in TARGET_KEYS if isinstance(target.get(k), torch.Tensor)), None)
        if key is not None:
            target, against = target[key], f" (the batch's {key!r})"
    if isinstance(target, torch.Tensor):
        if not target.is_floating_point():
            rule = f"cross-entropy against the integer targets{against}, class scores in dimension"
            if class_dimension(tuple(logits.shape), tuple(target.shape)) == 1:
                return _cross_entropy(logits, target, 1), f"{rule} 1"  # (N, C, d1, ...)
            return _cross_entropy(logits, target, -1), f"{rule} -1 (the last)"
        compared = regression_output(logits, target)
        rule = f"mean squared error against the floating targets{against}"
        if compared.shape != logits.shape:
            rule += f" (the output's {list(logits.shape)} as their {list(target.shape)})"
        return F.mse_loss(compared.float(), target.float()), rule
    if target is None:
        return logits.float().square().mean(), "the output's mean square (no target: speed only)"
    if isinstance(target, Mapping):
        keys = ", ".join(map(repr, TARGET_KEYS))
        why = f"the batch holds none of {keys}"
    else:
        why = f"the target, a {type(target).__name__}, is no tensor a default rule takes"
    return (
        logits.float().square().mean(),
        f"the output's mean square (speed only: {why}; pass --loss)",
    )


def _cross_entropy(logits: Any, target: Any, classes: int) -> Any:
    """The default cross-entropy, class scores in dimension ``classes`` (1 or -1); a target
    outside the classes (an ignored label: VOC's 255) is a one-line error that says how to give
    the loss that ignores it (torch's ignores -100 alone)."""
    import torch.nn.functional as F

    try:
        if classes == 1:
            return F.cross_entropy(logits.float(), target)
        return F.cross_entropy(logits.flatten(0, -2).float(), target.flatten())
    except IndexError as error:  # the CPU kernel's words; CUDA's asserts on the device
        if "out of bounds" not in str(error):
            raise
        count = logits.shape[classes]
        raise WorkloadError(
            f"cross-entropy over the output's {count} classes met a target outside 0-{count - 1} "
            f"({error}): a label to ignore (VOC's 255)? the default loss ignores -100 alone; "
            "pass --loss, e.g. F.cross_entropy(output, target, ignore_index=255)"
        ) from error


default_loss = DefaultLoss()
"""The default loss (``DefaultLoss``), as trials and ``autotune.apply`` use it."""


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


def regression_output(output: Any, target: Any) -> Any:
    """``output`` shaped as the floating ``target`` it is compared with. A regression head's
    (N, 1) against a target of (N,) would broadcast to (N, N) in mean squared error: a wrong
    loss whose memory and time grow with the batch squared. The same values in another shape
    of singleton dimensions are viewed as the target's shape (said once); shapes that differ
    otherwise are a one-line error."""
    import warnings

    if output.shape == target.shape:
        return output
    mine, theirs = list(output.shape), list(target.shape)
    if [d for d in mine if d != 1] == [d for d in theirs if d != 1]:
        if (key := (tuple(mine), tuple(theirs))) not in _SAID:
            _SAID.add(key)
            warnings.warn(
                f"mean squared error: output {mine} compared with the target {theirs} as "
                f"{theirs} (broadcast, they would make {_broadcast(mine, theirs)}); pass --loss "
                "to compare them otherwise",
                stacklevel=3,
            )
        return output.reshape(target.shape)
    raise WorkloadError(
        f"mean squared error cannot pair the output {mine} with the floating target {theirs}: "
        "they differ in more than dimensions of size 1; return the output in the target's "
        "shape, or pass --loss"
    )


def _broadcast(a: list[int], b: list[int]) -> list[int]:
    """The shape two shapes broadcast to (for the warning: what the loss would have made)."""
    longest = max(len(a), len(b))
    a, b = [1] * (longest - len(a)) + a, [1] * (longest - len(b)) + b
    return [max(x, y) for x, y in zip(a, b, strict=True)]
