"""The memory a trial is judged by."""

from __future__ import annotations

from autotune.config import make_config
from autotune.result import RankReport, TrialResult
from autotune.search.log import memory_used

GIB = 1 << 30


def _result(device: str, *ranks: RankReport) -> TrialResult:
    config = make_config({"global_batch_size": 8, "device": device})
    return TrialResult(config=config, status="ok", ranks=list(ranks))


def test_cuda_is_judged_by_what_the_allocator_reserved() -> None:
    # CUDA graphs' private pools: 5 GiB allocated at the peak, 43 GiB taken from the device.
    rank = RankReport(rank=0, status="ok", peak_memory_bytes=5 * GIB, peak_reserved_bytes=43 * GIB)
    assert memory_used(_result("cuda", rank), "cuda") == 43 * GIB


def test_cuda_takes_the_largest_rank_and_cpu_adds_the_ranks_up() -> None:
    ranks = [
        RankReport(rank=0, status="ok", peak_memory_bytes=2 * GIB, peak_reserved_bytes=3 * GIB),
        RankReport(rank=1, status="ok", peak_memory_bytes=4 * GIB, peak_reserved_bytes=5 * GIB),
    ]
    assert memory_used(_result("cuda", *ranks), "cuda") == 5 * GIB
    cpu = [RankReport(rank=i, status="ok", peak_memory_bytes=GIB) for i in range(2)]
    assert memory_used(_result("cpu", *cpu), "cpu") == 2 * GIB
