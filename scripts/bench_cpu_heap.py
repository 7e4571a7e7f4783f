"""What glibc's heap does to a CPU rank's resident peak and throughput: each configuration run
with the default heap and with the mmap threshold fixed, alternately.

    python scripts/bench_cpu_heap.py [--models workloads.gpt:gpt_long_context ...] \
        [--threshold 4MiB] [--repeats 2] [--out results/cpu_heap.json]

Why the CPU memory prediction misses on activation-heavy models (``bench_memory_prediction.py``):
by default glibc keeps freed heap pages resident for reuse and raises its mmap threshold as
large blocks are freed, so a rank's resident peak lies above its live tensors by an amount that
depends on the sizes and order of its allocations. With the threshold fixed the peak follows
the tensors; this measures what that costs in speed. Per configuration: the traced tensors, the
resident peak per rank under each heap, and samples/s under each (the median of the repeats).
"""

from __future__ import annotations

import argparse
import os

from autotune.bench.memory_prediction import grid_shape, heap_pairs, heap_summary, machine
from autotune.bench.output import write_json
from autotune.config import TrainConfig
from autotune.runner.workload import WorkloadSpec
from autotune.units import parse_bytes

MODELS = (
    "workloads.gpt:gpt_long_context",
    "workloads.gpt:gpt_small",
    "workloads.convnet:resnet_small",
)
"""The activation-heavy models whose CPU grids miss the prediction's target."""


def configs(batch: int, segments: int) -> list[TrainConfig]:
    """Large and small micro-batches, one device and two, with and without checkpointing."""
    shapes = [("single", 1, 1, 0), ("single", 1, 4, 0), ("ddp", 2, 4, segments)]
    return [
        TrainConfig(global_batch_size=batch, amp="off", device="cpu", parallel=parallel,
                    world_size=world, grad_accum_steps=accum, checkpoint_segments=checkpointed)
        for parallel, world, accum, checkpointed in shapes
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--threshold", default="4MiB", help="The fixed mmap threshold.")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="results/cpu_heap.json")
    args = parser.parse_args()
    threshold = parse_bytes(args.threshold)

    report: dict[str, object] = {"machine": machine(), "threshold_bytes": threshold, "models": {}}
    print(
        f"{'model':32} {'config':48} {'tensors':>8} {'default':>8} {'fixed':>8} "
        f"{'samples/s default':>18} {'fixed':>7}"
    )
    for model in args.models:
        batch, segments = grid_shape(model, "cpu")
        workload = WorkloadSpec(model=model, search_path=(os.getcwd(),))
        rows = heap_pairs(workload, configs(batch, segments), threshold, args.repeats)
        report["models"][model] = rows  # type: ignore[index]
        for row in heap_summary(rows):
            print(
                f"{model:32} {row['config']:48} {row['tensors_bytes'] / 2**20:7.0f}M "
                f"{row['measured_bytes_default'] / 2**20:7.0f}M "
                f"{row['measured_bytes_fixed'] / 2**20:7.0f}M "
                f"{row['samples_per_s_default']:18.1f} {row['samples_per_s_fixed']:7.1f}"
            )
    write_json(args.out, report, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
