"""A hopeless workload for the pruning benchmark: an MLP that, under fp16 autocast, repeats its
forward (in fp32) ``REPEATS`` times per step, so that one knob makes a configuration about 100x
slower with nothing else changed (``scripts/bench_pruning.py``)."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.data import Dataset

REPEATS = 400


class Repeats(nn.Module):
    """An MLP that, under fp16 autocast, computes its forward ``REPEATS`` times in fp32 (the
    output is their mean, so the backward repeats too); otherwise once."""

    def __init__(self, width: int = 256, depth: int = 4) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 10)
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        fp16 = torch.is_autocast_enabled(device) and (
            torch.get_autocast_dtype(device) == torch.float16
        )
        repeats = REPEATS if fp16 else 1
        with torch.autocast(device, enabled=False):
            x = x.float()
            return sum(self.head(self.body(x)) for _ in range(repeats)) / repeats


class WideRepeats(Repeats):
    def __init__(self) -> None:
        super().__init__(width=2048, depth=4)


class Features(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed random samples held in memory: loading costs next to nothing."""

    def __init__(self, width: int, length: int = 4096) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(length, width, generator=generator)
        self.y = torch.randint(0, 10, (length,), generator=generator)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def autotune_dataset(model: nn.Module) -> Features:
    return Features(model.width)  # type: ignore[arg-type]
