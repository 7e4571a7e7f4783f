"""Whether a micro-batch's loss couples its samples, told from three forwards of two samples.

Gradient accumulation and data parallelism keep the global batch and split it into smaller
micro-batches. That trains the same thing only where the loss of a micro-batch is the mean (or
the sum) of its samples' own losses. A contrastive loss over in-batch negatives (CLIP, SimCLR),
a mean over the tokens of a padded batch, a mixture's load-balancing loss: each is computed over
the micro-batch together, and a smaller micro-batch changes what is trained.

For samples ``a`` and ``b``, a loss of each sample alone, reduced by mean or by sum, gives
``L([a, b]) == (L([a, a]) + L([b, b])) / 2``; a coupled one does not. The three forwards run in
eval mode (dropout off, a batch norm's running statistics: batch norms are told apart by their
class) without gradients, each from the same random seed; a loss that still differs between two
runs of one batch (a VAE's sampled latent) cannot be told this way: the check says so, as it
says why for any it could not tell. Nor can a model whose output in eval mode is not what it
trains on (torchvision's detection models return their losses in training and their detections
in eval mode), told by one forward in training mode first (the default loss's rule for each).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

from autotune.errors import error_line
from autotune.runner.compile_state import eager_compiles
from autotune.runner.loss import LEFT_OUT, DefaultLoss, call_loss

RELATIVE_TOLERANCE = 1e-3
"""How far the pair's loss may lie from the mean of the duplicated pairs' and count as equal:
far above float32's rounding in batched kernels (1e-6), far below what coupling moves (an
in-batch contrastive loss moves by its whole size)."""

FLOAT64_TOLERANCE = 1e-9
"""The same in float64, whose rounding lies near 1e-15."""

FLOAT32_LOSS_TOLERANCE = 1e-5
"""The same for a model run in float64 whose loss rounds to float32 at its end (a mean of a few
thousand float32 terms: about 1e-6 at most); a padded language model's token mean moved the
pair's loss by 7.7e-4 of it."""

LOW_PRECISION_TOLERANCE = 3e-2
"""The same for a model whose parameters are 16-bit floats."""


def _loss(
    model: Any,
    batch: Any,
    loss_fn: Callable[[Any, Any], Any],
    split: Callable[[Any], tuple[tuple[Any, ...], dict[str, Any], Any]],
    rounded: list[Any],
    seed: int = 0,
) -> float:
    """The loss of ``batch``, split by ``split`` (``training.split_batch`` for the model),
    drawn from ``seed``; its dtype added to ``rounded`` where it is not float64 (a loss that
    upcasts float64 logits to float32, as torch's and Hugging Face's default ones do)."""
    import torch

    torch.manual_seed(seed)
    args, kwargs, target = split(batch)
    loss = call_loss(loss_fn, model(*args, **kwargs), target, kwargs)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError("the loss is not a scalar tensor")
    if loss.dtype != torch.float64:
        rounded.append(loss.dtype)
    return float(loss.detach().double())


def _training_rule(
    model: Any,
    batch: Any,
    loss_fn: Callable[[Any, Any], Any],
    split: Callable[[Any], tuple[tuple[Any, ...], dict[str, Any], Any]],
) -> str | None:
    """Which of the default loss's rules takes the loss in training mode (None for a loss of
    the user's): a model whose output in eval mode is another (torchvision's detection models
    return their losses in training, their detections in eval mode) is not checked on it. The
    forward's updates of the model's buffers (batch norms' running statistics) are undone."""
    if not isinstance(loss_fn, DefaultLoss):
        return None
    buffers = [(buffer, buffer.clone()) for buffer in model.buffers()]
    model.train()
    try:
        _loss(model, batch, loss_fn, split, [])
    finally:
        for buffer, saved in buffers:
            buffer.copy_(saved)
    return _rule(loss_fn)


def _rule(loss_fn: Any) -> str:
    """The default loss's last rule, without what it adds after it (a scalar left out)."""
    return str(loss_fn.rule).split(LEFT_OUT)[0]


def _close(x: float, y: float, tolerance: float, *scale: float) -> bool:
    return abs(x - y) <= tolerance * max(1e-6, *(abs(s) for s in scale))


def loss_couples_samples(
    model: Any,
    samples: list[Any],
    collate: Callable[[list[Any]], Any],
    loss_fn: Callable[[Any, Any], Any],
    budget_s: float | None = None,
    float64: bool = False,
) -> bool | str:
    """Whether the loss of ``samples[0]`` and ``samples[1]`` together differs from the mean of
    each one's with a copy of itself (module docstring); where that cannot be told, why, in a
    few words: fewer than two samples, a forward or loss that fails or is not a finite scalar, a
    loss that differs between two runs of one batch; or, with ``budget_s``, a first forward that
    took longer (the other three would take as long each). The model's mode is restored after.

    ``float64``: convert the model (in place: give one built for the check) and the samples'
    floating tensors to float64 first, and tell apart what float32 cannot. A freshly initialised
    language model gives every token about the same loss, so a mean over the tokens of padded
    samples of different lengths moves the pair's loss by about 1e-4 of it, inside float32's
    tolerance. A model that fails in float64 is checked in float32."""
    if len(samples) < 2:
        return "the dataset gives fewer than two samples"
    with eager_compiles():  # what the model compiles itself: its loss, not its speed
        if float64:
            try:
                model = model.double()
                return _couples(model, samples, _in_float64(collate), loss_fn, budget_s, True)
            except Exception:  # an op without float64, a dtype the model fixes: float32 then
                model.float()
        try:
            return _couples(model, samples, collate, loss_fn, budget_s, False)
        except Exception as error:  # the trials will say what fails
            return f"a forward and loss of two samples failed here: {error_line(error)}"


def _in_float64(collate: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    from autotune.runner.training import map_tensors  # imports torch

    def make(samples: list[Any]) -> Any:
        return map_tensors(collate(samples), lambda t: t.double() if t.is_floating_point() else t)

    return make


def _couples(
    model: Any,
    samples: list[Any],
    collate: Callable[[list[Any]], Any],
    loss_fn: Callable[[Any, Any], Any],
    budget_s: float | None,
    float64: bool,
) -> bool | str:
    import time

    import torch

    from autotune.runner.lazy_modules import materialize  # imports torch
    from autotune.runner.training import (  # imports torch
        forward_keywords,
        split_batch,
        target_into,
    )

    a, b = samples[:2]
    # how every forward below takes its batch, read once from the model's forward
    split = partial(
        split_batch, accepts=forward_keywords(model), target_into=target_into(model, loss_fn)
    )
    low = any(p.dtype in (torch.float16, torch.bfloat16) for p in model.parameters())
    rounded: list[Any] = []
    training = model.training
    try:
        materialize(model, collate([a, b]))
        with torch.no_grad():
            trained_on = _training_rule(model, collate([a, b]), loss_fn, split)
            model.eval()
            start = time.perf_counter()
            pair = _loss(model, collate([a, b]), loss_fn, split, rounded, seed=0)
            took = time.perf_counter() - start
            if budget_s is not None and took > budget_s:
                return f"a forward of two samples took {took:.1f} s here, over {budget_s:g} s"
            if trained_on is not None and _rule(loss_fn) != trained_on:
                return (
                    "its output in eval mode is not what it trains on (in training: "
                    f"{trained_on}; in eval mode: {_rule(loss_fn)})"
                )
            again = _loss(model, collate([a, b]), loss_fn, split, rounded, seed=1)
            first, second = (_loss(model, collate([s, s]), loss_fn, split, rounded) for s in (a, b))
    finally:
        model.train(training)
    if low or any(dtype in (torch.float16, torch.bfloat16) for dtype in rounded):
        tolerance = LOW_PRECISION_TOLERANCE
    elif not float64:
        tolerance = RELATIVE_TOLERANCE
    else:
        tolerance = FLOAT32_LOSS_TOLERANCE if rounded else FLOAT64_TOLERANCE
    values = (pair, again, first, second)
    if not all(math.isfinite(v) for v in values):
        return "its loss of two samples is not finite"
    if not _close(pair, again, tolerance, *values):
        return "its loss differs between two runs of one batch: it draws at random"
    return not _close(pair, (first + second) / 2, tolerance, *values)
