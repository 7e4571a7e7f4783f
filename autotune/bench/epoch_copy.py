"""What a DataLoader worker copies of its rank's dataset over an epoch, against what a trial's
first batches show and what ``runner.memory.epoch_copy_bytes`` measures beside the bare rank
(``scripts/bench_epoch_copy.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from autotune.runner.memory import child_pids, epoch_copy_bytes, workers_bytes

FIRST_BATCHES = 3
"""About what a trial's window reads: a warm-up step and two measured ones."""


class Strings(Dataset[Any]):
    """Samples held as Python strings (text read into a list), tokenised as they are read."""

    def __init__(self, count: int) -> None:
        self.items = [f"sample number {i} of a text held as a string " for i in range(count)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([len(word) for word in self.items[i].split()])


class Records(Dataset[Any]):
    """Samples held as a dict each (token ids in a list and a label): a parsed JSON file."""

    def __init__(self, count: int) -> None:
        self.items = [
            {"ids": [i % 97 + k for k in range(16)], "label": i % 3} for i in range(count)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        item = self.items[i]
        return torch.tensor(item["ids"]), int(item["label"])  # type: ignore[call-overload]


class Tensors(Dataset[Any]):
    """The same ids in one tensor: a buffer, not an object a sample."""

    def __init__(self, count: int) -> None:
        self.ids = torch.arange(count * 16).reshape(count, 16) % 97
        self.labels = torch.arange(count) % 3

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ids[i], self.labels[i]


DATASETS: dict[str, Callable[[int], Dataset[Any]]] = {
    "strings": Strings,
    "records": Records,
    "tensors": Tensors,
}


def measured(name: str, count: int, batch_size: int = 256) -> dict[str, Any]:
    """One worker reading ``count`` samples of ``DATASETS[name]`` in a shuffled epoch: what it
    holds beside the rank after ``FIRST_BATCHES`` batches and at most over the epoch, sampled
    every 50 batches (``workers_bytes``), against ``epoch_copy_bytes`` of the dataset."""
    dataset = DATASETS[name](count)
    started = time.perf_counter()
    predicted, whole = epoch_copy_bytes(dataset)
    predicted_s = time.perf_counter() - started
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=1, shuffle=True)
    first = most = 0
    for i, _ in enumerate(loader):
        if i == FIRST_BATCHES - 1 or i % 50 == 0 or i == len(loader) - 1:
            held = workers_bytes(child_pids())
            first = held if i == FIRST_BATCHES - 1 else first
            most = max(most, held)
    return {
        "dataset": name,
        "samples": count,
        "first_batches_bytes": first,
        "epoch_bytes": most,
        "epoch_copy_bytes": predicted,
        "epoch_copy_whole": whole,
        "epoch_copy_s": predicted_s,
    }
