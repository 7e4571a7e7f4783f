"""The batch a traced step runs: fake tensors shaped as the DataLoader batches the dataset's
first samples, widened to the micro-batch, with those samples' integer values beside it
(``autotune.runner.fake_memory`` traces the step; ``fake_routing`` reads the values)."""

from __future__ import annotations

from typing import Any

from autotune.runner.workload import first_samples

COLLATED_SAMPLES = 64
"""How many of the dataset's first samples shape the traced batch and show its values (a
user's collate function pads to the longest of them, as a batch of those would be)."""


def fake_batch(
    dataset: Any, micro_batch: int, mode: Any, collate: Any = None
) -> tuple[Any, list[Any]]:
    """A batch of ``micro_batch`` samples as fake tensors, shaped as the DataLoader's collate
    function (the user's, else torch's default) batches the dataset's first samples (up to
    ``COLLATED_SAMPLES``; a user's pads to the longest of them) and widened to ``micro_batch``;
    and those samples' own values of its integer and boolean tensors (labels, token ids, masks,
    lengths) beside each, as NumPy arrays: where a selection counts such values (DeBERTa's loss
    keeps the rows whose label is not negative), the trace takes the share those samples show.
    A batch some tensor of which does not hold the samples along its first dimension (a graph
    batch's concatenated nodes) cannot be widened, and is made of the first ``micro_batch``
    samples."""
    import torch
    from torch.utils.data import default_collate

    from autotune.runner.training import map_tensors  # imports torch

    samples = first_samples(dataset, min(micro_batch, COLLATED_SAMPLES))
    one = (collate or default_collate)(samples)
    if collate and micro_batch > len(samples) and not _widens(one, len(samples)):
        # a tensor without the samples along its first dimension (a graph batch's nodes,
        # concatenated): widening cannot size it, so the whole micro-batch is batched
        samples = first_samples(dataset, micro_batch)
        one = collate(samples)
    observed: list[Any] = []

    def widen(tensor: Any) -> Any:
        batched = tensor.dim() > 0 and tensor.shape[0] == len(samples)
        shape = (micro_batch, *tensor.shape[1:]) if batched else tuple(tensor.shape)
        with mode:
            fake = torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)
        if not tensor.is_floating_point() and not tensor.is_complex():
            observed.append((fake, tensor.detach().cpu().numpy()))
        return fake

    return map_tensors(one, widen), observed


def _shapes(batch: Any) -> list[tuple[int, ...]]:
    """The shapes of ``batch``'s tensors, in ``map_tensors``' order."""
    from autotune.runner.training import map_tensors  # imports torch

    shapes: list[tuple[int, ...]] = []
    map_tensors(batch, lambda t: shapes.append(tuple(t.shape)))
    return shapes


def varying(dataset: Any, collate: Any) -> bool:
    """Whether the user's ``collate`` batches other samples into other shapes (a graph batch's
    concatenated nodes, padding to each batch's longest sample): two batches of the dataset's
    first samples, told apart by their tensors' shapes."""
    if collate is None:  # torch's default stacks samples of one shape, or fails
        return False
    samples = first_samples(dataset, 2 * VARYING_SAMPLES)
    half = len(samples) // 2
    try:
        return half > 0 and _shapes(collate(samples[:half])) != _shapes(collate(samples[half:]))
    except Exception:  # samples the traced batch did not hold: the trials will tell
        return False


VARYING_SAMPLES = 8
"""How many samples each of ``varying``'s two batches holds."""


def _widens(batch: Any, samples: int) -> bool:
    """Whether every tensor of ``batch`` holds its ``samples`` along its first dimension, so
    that a larger micro-batch is the same batch widened."""
    return all(shape[:1] == (samples,) for shape in _shapes(batch))
