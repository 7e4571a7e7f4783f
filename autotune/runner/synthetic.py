"""Synthetic samples for models that bring no data: random tensors shaped like one real sample."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

SYNTHETIC_LENGTH = 1 << 20


def _template(value: Any) -> Any:
    """A picklable description of ``value``: (shape, dtype, high) leaves in the same structure."""
    if isinstance(value, torch.Tensor):
        high = None if value.is_floating_point() else max(int(value.max().item()) + 1, 2)
        return ("tensor", tuple(value.shape), value.dtype, high)
    if isinstance(value, dict):
        return {k: _template(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_template(v) for v in value)
    raise TypeError(f"example input holds a {type(value).__name__}; expected tensors")


def _draw(template: Any, generator: torch.Generator) -> Any:
    if isinstance(template, dict):
        return {k: _draw(v, generator) for k, v in template.items()}
    if template[0] == "tensor":
        _, shape, dtype, high = template
        if high is None:
            return torch.randn(shape, generator=generator).to(dtype)
        return torch.randint(0, high, shape, generator=generator, dtype=dtype)
    return tuple(_draw(v, generator) for v in template)


class SyntheticDataset(Dataset[Any]):
    """Deterministic random samples (seeded by index) with the structure of a template."""

    def __init__(self, template: Any, length: int = SYNTHETIC_LENGTH) -> None:
        self.template = template
        self.length = length

    @classmethod
    def like(cls, example: Any) -> SyntheticDataset:
        """Samples shaped like ``example`` (one sample, no batch dimension)."""
        return cls(_template(example))

    @classmethod
    def from_shape(cls, shape: tuple[int, ...], dtype: str) -> SyntheticDataset:
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise ValueError(f"input dtype {dtype!r} is not a torch dtype (e.g. float32, int64)")
        high = None if torch_dtype.is_floating_point else 1000
        return cls(("tensor", tuple(shape), torch_dtype, high))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        generator = torch.Generator().manual_seed(index)
        return _draw(self.template, generator)
