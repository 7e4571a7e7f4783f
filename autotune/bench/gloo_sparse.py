"""How often DDP over gloo kills a rank for a model of several lookups with sparse gradients: plain
PyTorch, no autotune in the ranks (``refusals.GLOO_SPARSE`` stands on it).

Each run is a fresh process of two CPU ranks (``torch.multiprocessing.spawn``) training a model of
``tables`` ``EmbeddingBag(sparse=True)`` for ``steps`` steps of SGD; its outcome is "ok" or how a
rank died (SIGABRT: "malloc(): unaligned tcache chunk detected", SIGSEGV). The crash is now and
then, not every run, so it is counted over many runs rather than pinned by a test.

    python -m autotune.bench.gloo_sparse PORT TABLES STEPS [VARIANT]   # one run (``run``'s)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from autotune.runner.launch import free_port

ROWS = (100_000, 50_000, 20_000, 5_000, 5_000, 5_000, 5_000, 5_000)
"""Each lookup's rows, of width 64, in order."""


def _rank(rank: int, port: int, tables: int, steps: int, variant: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel

    class Bags(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bags = nn.ModuleList(
                nn.EmbeddingBag(n, 64, mode="sum", sparse=True) for n in ROWS[:tables]
            )
            self.head = nn.Linear(64, 1) if "head" in variant else None

        def forward(self, ids: Any) -> Any:
            looked = [bag(ids[:, i]) for i, bag in enumerate(self.bags)]
            pooled = torch.stack(looked, 1).sum(1)
            return self.head(pooled) if self.head is not None else pooled

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    views = "bucket-view" in variant
    model = DistributedDataParallel(Bags(), gradient_as_bucket_view=views)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        started = time.perf_counter()
        ids = torch.stack([torch.randint(0, n, (128, 8)) for n in ROWS[:tables]], 1)
        model(ids).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if "agree" in variant:  # as a trial's ranks agree on the slowest step time each step
            took = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
    dist.destroy_process_group()


VARIANTS = (
    "plain",
    "head",
    "bucket-view",
    "head+bucket-view",
    "head+agree",
    "head+bucket-view+agree",
)
"""The lookups alone, or with a dense head after them (DDP then reduces dense buckets too), each
with or without DDP's ``gradient_as_bucket_view``; "agree": each step then all-reduces its time
(the largest over the ranks) on the same group, as a trial's ranks do (``rank._Agreement``)."""


def run(tables: int, steps: int, timeout_s: float = 300, variant: str = "plain") -> str:
    """One run's outcome: "ok", the signal a rank died of ("SIGABRT"), or "failed" (another
    error, its last line after a colon)."""
    command = [sys.executable, "-m", "autotune.bench.gloo_sparse", str(free_port())]
    command += [str(tables), str(steps), variant]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode == 0:
        return "ok"
    died = re.search(r"terminated with signal (SIG[A-Z]+)", done.stderr)
    if died:
        return died.group(1)
    lines = done.stderr.strip().splitlines()
    return "failed: " + (lines[-1] if lines else f"exit {done.returncode}")


def tally(outcomes: list[str]) -> dict[str, int]:
    """How many runs ended each way."""
    return dict(Counter(outcomes))


if __name__ == "__main__":
    from torch.multiprocessing.spawn import spawn

    port, tables, steps = (int(a) for a in sys.argv[1:4])
    variant = sys.argv[4] if len(sys.argv) > 4 else "plain"
    spawn(_rank, args=(port, tables, steps, variant), nprocs=2)  # type: ignore[no-untyped-call]
