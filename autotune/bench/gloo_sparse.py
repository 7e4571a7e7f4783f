"""How often DDP over gloo kills a rank for a model of several lookups with sparse gradients: plain
PyTorch, no autotune in the ranks but its memory sampler where a variant asks for it
(``refusals.GLOO_SPARSE`` stands on it).

Each run is a fresh process of two CPU ranks (``torch.multiprocessing.spawn``) training a model of
``tables`` ``EmbeddingBag(sparse=True)`` for ``steps`` steps of SGD; its outcome is "ok" or how a
rank died (SIGABRT: "malloc(): unaligned tcache chunk detected", SIGSEGV). The crash is now and
then, not every run, so it is counted over many runs rather than pinned by a test.

    python -m autotune.bench.gloo_sparse PORT TABLES STEPS [VARIANT]   # one run (``run``'s)
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from autotune.runner.launch import free_port, kill_group

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
    compressed = "powersgd" in variant
    # PowerSGD's ranks may wait on each other for good: gloo gives up after 15 s where it can
    wait = datetime.timedelta(seconds=15) if compressed else None
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=wait)
    torch.manual_seed(rank)
    views = "bucket-view" in variant
    model = DistributedDataParallel(Bags(), gradient_as_bucket_view=views)
    if compressed:  # compressing from the third step, at rank 1
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

        state = powersgd.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if "sample" in variant:  # a trial's window: autotune's memory sampler in its thread
        from autotune.runner.memory import MemoryTracker  # imports torch: the rank's alone

        MemoryTracker(torch.device("cpu")).start()  # a daemon thread, until the process ends
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
    "head+bucket-view+sample",
    "powersgd",
    "head+powersgd",
)
"""The lookups alone, or with a dense head after them (DDP then reduces dense buckets too), each
with or without DDP's ``gradient_as_bucket_view``; "agree": each step then all-reduces its time
(the largest over the ranks) on the same group, as a trial's ranks do (``rank._Agreement``);
"sample": autotune's memory sampler runs in its thread meanwhile, as in a trial's window;
"powersgd": DDP's PowerSGD hook, compressing from the third step (gloo's timeout 15 s)."""


def run(tables: int, steps: int, timeout_s: float = 300, variant: str = "plain") -> str:
    """One run's outcome: "ok", the signal a rank died of ("SIGABRT"), "failed" (another error,
    its last line after a colon), or "hung" (still running at ``timeout_s``: its ranks killed)."""
    command = [sys.executable, "-m", "autotune.bench.gloo_sparse", str(free_port())]
    return outcome([*command, str(tables), str(steps), variant], timeout_s)


def outcome(command: list[str], timeout_s: float) -> str:
    """How ``command`` (a run, ``run``'s) ended, as ``run`` says it; at ``timeout_s`` it is
    killed with every process of its session."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:  # the ranks too, left waiting in a collective
        kill_group(process)
        process.communicate()
        return "hung"
    if process.returncode == 0:
        return "ok"
    died = re.search(r"terminated with signal (SIG[A-Z]+)", stderr)
    if died:
        return died.group(1)
    errors = [line for line in stderr.splitlines() if "Error: " in line]
    if not errors:
        lines = stderr.strip().splitlines()
        return "failed: " + (lines[-1] if lines else f"exit {process.returncode}")
    # a hook's error comes wrapped once per callback it passed through: its own words, last
    said = errors[-1].rpartition("when running the callback: ")[2]
    said = re.sub(r"\[[^\]]*:\d+\] ", "", said)  # gloo's source line
    said = re.sub(r"(\[[\d.]+\]):\d+", r"\1", said)  # the peer's port: one key a cause
    return "failed: " + said.split(". ")[0].strip()[:200]


def tally(outcomes: list[str]) -> dict[str, int]:
    """How many runs ended each way."""
    return dict(Counter(outcomes))


if __name__ == "__main__":
    from torch.multiprocessing.spawn import spawn

    port, tables, steps = (int(a) for a in sys.argv[1:4])
    variant = sys.argv[4] if len(sys.argv) > 4 else "plain"
    spawn(_rank, args=(port, tables, steps, variant), nprocs=2)  # type: ignore[no-untyped-call]
