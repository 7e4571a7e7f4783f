"""A ResNet-style convnet on decoded, augmented images: ``--model workloads.convnet:resnet_tiny``.

Each sample is decompressed from a zlib record into an HxWx3 uint8 image, randomly cropped,
flipped and normalised, as an image pipeline does; ``decode_rounds`` scales that CPU cost.
Sizes: resnet_tiny (CI), resnet_small, resnet18 (ImageNet-scale, for a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

from workloads._cost import compressed_records, decode


@dataclass(frozen=True)
class ConvConfig:
    image: int = 32
    widths: tuple[int, ...] = (16, 32)
    blocks_per_stage: int = 1
    classes: int = 10
    samples: int = 2048
    decode_rounds: int = 1


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, config: ConvConfig | None = None) -> None:
        super().__init__()
        self.workload_config = config = config or ConvConfig()
        self.stem = nn.Sequential(
            nn.Conv2d(3, config.widths[0], 3, 1, 1, bias=False),
            nn.BatchNorm2d(config.widths[0]),
            nn.ReLU(),
        )
        stages, cin = [], config.widths[0]
        for i, width in enumerate(config.widths):
            for j in range(config.blocks_per_stage):
                stages.append(BasicBlock(cin, width, 2 if (i > 0 and j == 0) else 1))
                cin = width
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, config.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class EncodedImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Images decoded from compressed records and augmented on every access."""

    def __init__(self, config: ConvConfig, seed: int = 0) -> None:
        self.config = config
        self.stored = config.image + config.image // 8  # crop back to config.image
        self.records = compressed_records(32, self.stored * self.stored * 3, seed)

    def __len__(self) -> int:
        return self.config.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        raw = decode(self.records[index % len(self.records)], self.config.decode_rounds)
        image = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        image = image.view(self.stored, self.stored, 3).permute(2, 0, 1)
        g = torch.Generator().manual_seed(index)
        top, left = torch.randint(0, self.stored - self.config.image + 1, (2,), generator=g)
        size = self.config.image
        image = image[:, top : top + size, left : left + size].float().div_(255)
        if torch.rand((), generator=g) < 0.5:
            image = image.flip(2)
        mean, std = image.mean(dim=(1, 2), keepdim=True), image.std(dim=(1, 2), keepdim=True)
        return (image - mean) / (std + 1e-6), torch.tensor(index % self.config.classes)


def autotune_dataset(model: ResNet) -> EncodedImages:
    return EncodedImages(model.workload_config)


def resnet_tiny() -> ResNet:
    return ResNet(ConvConfig())


def resnet_small() -> ResNet:
    return ResNet(ConvConfig(image=64, widths=(32, 64, 128), blocks_per_stage=2, samples=8192))


def resnet18() -> ResNet:
    return ResNet(
        ConvConfig(
            image=224, widths=(64, 128, 256, 512), blocks_per_stage=2, classes=1000, samples=100_000
        )
    )
