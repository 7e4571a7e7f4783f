"""An MLP on decoded feature records: ``--model workloads.mlp:mlp_tiny`` (or mlp_small, mlp_large).

Samples are (features, class) pairs; each is decompressed from a zlib record and normalised, and
``decode_rounds`` scales that CPU cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from workloads._cost import compressed_records, decode


@dataclass(frozen=True)
class MLPConfig:
    features: int = 64
    hidden: int = 128
    depth: int = 4
    classes: int = 10
    samples: int = 4096
    decode_rounds: int = 1


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, config: MLPConfig | None = None) -> None:
        super().__init__()
        self.workload_config = config = config or MLPConfig()
        self.embed = nn.Linear(config.features, config.hidden)
        self.blocks = nn.Sequential(*(Block(config.hidden) for _ in range(config.depth)))
        self.head = nn.Linear(config.hidden, config.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))


class FeatureRecords(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Compressed float records decoded per sample; the class is derived from the record."""

    def __init__(self, config: MLPConfig, seed: int = 0) -> None:
        self.config = config
        self.records = compressed_records(64, config.features * 4, seed)

    def __len__(self) -> int:
        return self.config.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        raw = decode(self.records[index % len(self.records)], self.config.decode_rounds)
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float()[: self.config.features * 4]
        x = x.view(self.config.features, 4).mean(dim=1)
        x = (x - x.mean()) / (x.std() + 1e-6) + 0.01 * (index % 7)
        return x, torch.tensor(index % self.config.classes)


def autotune_dataset(model: MLP) -> FeatureRecords:
    return FeatureRecords(model.workload_config)


def mlp_tiny() -> MLP:
    return MLP(MLPConfig())


def mlp_loading_bound() -> MLP:
    """Loading costs about as much as compute on one core: DataLoader workers matter."""
    return MLP(MLPConfig(features=256, hidden=256, depth=4, decode_rounds=40, samples=2048))


def mlp_small() -> MLP:
    return MLP(MLPConfig(features=256, hidden=512, depth=8, samples=16384))


def mlp_large() -> MLP:
    return MLP(MLPConfig(features=1024, hidden=4096, depth=16, samples=262144))
