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
runs of one batch (a VAE's sampled latent) cannot be told this way, and is not flagged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

RELATIVE_TOLERANCE = 1e-3
"""How far the pair's loss may lie from the mean of the duplicated pairs' and count as equal:
far above float32's rounding in batched kernels (1e-6), far below what coupling moves (an
in-batch contrastive loss moves by its whole size)."""

LOW_PRECISION_TOLERANCE = 3e-2
"""The same for a model whose parameters are 16-bit floats."""


def _loss(
    model: Any,
    batch: Any,
    loss_fn: Callable[[Any, Any], Any],
    accepts: frozenset[str] | None,
    seed: int = 0,
) -> float:
    import torch

    from autotune.runner.training import split_batch  # imports torch

    torch.manual_seed(seed)
    args, kwargs, target = split_batch(batch, accepts)
    loss = loss_fn(model(*args, **kwargs), target)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError("the loss is not a scalar tensor")
    return float(loss.detach().double())


def _close(x: float, y: float, tolerance: float, *scale: float) -> bool:
    return abs(x - y) <= tolerance * max(1e-6, *(abs(s) for s in scale))


def loss_couples_samples(
    model: Any,
    samples: list[Any],
    collate: Callable[[list[Any]], Any],
    loss_fn: Callable[[Any, Any], Any],
    budget_s: float | None = None,
) -> bool | None:
    """Whether the loss of ``samples[0]`` and ``samples[1]`` together differs from the mean of
    each one's with a copy of itself (module docstring); None where that cannot be told: fewer
    than two samples, a forward or loss that fails or is not a finite scalar, or a loss that
    differs between two runs of one batch; or, with ``budget_s``, a first forward that took
    longer (the other three would take as long each). The model's mode is restored after."""
    import time

    import torch

    from autotune.runner.lazy_modules import materialize  # imports torch
    from autotune.runner.training import forward_keywords  # imports torch

    if len(samples) < 2:
        return None
    a, b = samples[:2]
    accepts = forward_keywords(model)
    low = any(p.dtype in (torch.float16, torch.bfloat16) for p in model.parameters())
    tolerance = LOW_PRECISION_TOLERANCE if low else RELATIVE_TOLERANCE
    training = model.training
    try:
        materialize(model, collate([a, b]))
        model.eval()
        with torch.no_grad():
            start = time.perf_counter()
            pair = _loss(model, collate([a, b]), loss_fn, accepts, seed=0)
            if budget_s is not None and time.perf_counter() - start > budget_s:
                return None
            again = _loss(model, collate([a, b]), loss_fn, accepts, seed=1)
            first, second = (_loss(model, collate([s, s]), loss_fn, accepts) for s in (a, b))
    except Exception:  # the trials will say what fails
        return None
    finally:
        model.train(training)
    values = (pair, again, first, second)
    if not all(math.isfinite(v) for v in values) or not _close(pair, again, tolerance, *values):
        return None
    return not _close(pair, (first + second) / 2, tolerance, *values)
