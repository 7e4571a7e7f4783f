"""Synthetic samples for models that bring no data: random tensors shaped like one real sample."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

SYNTHETIC_LENGTH = 1 << 20
INTEGER_HIGH = 1000
"""Integer samples from ``--input-shape`` are drawn from ``[0, INTEGER_HIGH)`` unless the model
bounds them (``lookup_bound``)."""


def lookup_bound(model: torch.nn.Module) -> int | None:
    """The fewest rows of the model's lookup tables (``nn.Embedding``, ``nn.EmbeddingBag``):
    integer inputs below it index every table, where a larger draw would fail the lookup with
    "index out of range". None when the model has no such table."""
    sizes = [
        m.num_embeddings
        for m in model.modules()
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))
    ]
    return min(sizes) if sizes else None


def integer_high(dtype: torch.dtype, high: int) -> int | None:
    """``high`` for an integer ``dtype`` (a bool draws 0 or 1), None for a floating one."""
    if dtype.is_floating_point or dtype.is_complex:
        return None
    return 2 if dtype == torch.bool else high


def _template(value: Any, float32_as: torch.dtype | None = None) -> Any:
    """A picklable description of ``value``: (shape, dtype, high) leaves in the same structure;
    a float32 leaf described as ``float32_as`` where given."""
    if isinstance(value, torch.Tensor):
        high = None if value.is_floating_point() else max(int(value.max().item()) + 1, 2)
        dtype = float32_as if float32_as and value.dtype == torch.float32 else value.dtype
        return ("tensor", tuple(value.shape), dtype, high)
    if isinstance(value, dict):
        return {k: _template(v, float32_as) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_template(v, float32_as) for v in value)
    raise TypeError(f"example input holds a {type(value).__name__}; expected tensors")


def holds_float32(value: Any) -> bool:
    """Whether ``value`` (a tensor, or a structure of them) holds a float32 tensor."""
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.float32
    if isinstance(value, dict):
        return any(holds_float32(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds_float32(v) for v in value)
    return False


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
    def like(cls, example: Any, float32_as: str | None = None) -> SyntheticDataset:
        """Samples shaped like ``example`` (one sample, no batch dimension); its float32
        tensors drawn as ``float32_as`` where given (the model's own dtype)."""
        return cls(_template(example, getattr(torch, float32_as) if float32_as else None))

    @classmethod
    def from_shape(
        cls, shape: tuple[int, ...], dtype: str, high: int = INTEGER_HIGH
    ) -> SyntheticDataset:
        """Samples of ``shape`` and ``dtype``; integers are drawn from ``[0, high)``."""
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise ValueError(f"input dtype {dtype!r} is not a torch dtype (e.g. float32, int64)")
        return cls(("tensor", tuple(shape), torch_dtype, integer_high(torch_dtype, high)))

    @property
    def high(self) -> int | None:
        """The bound integer samples are drawn below (None for floating samples or a structure)."""
        template = self.template
        return template[3] if isinstance(template, tuple) and template[0] == "tensor" else None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        generator = torch.Generator().manual_seed(index)
        return _draw(self.template, generator)
