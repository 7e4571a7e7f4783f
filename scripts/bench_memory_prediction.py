"""Predicted against measured peak memory, per configuration of a grid, and how fast ``plan`` is
(target: within +-10% of the measured CPU resident peak; ``plan`` of gpt2_124m over the default
space at 64 devices under 30 s).

    python scripts/bench_memory_prediction.py [--models workloads.gpt:gpt_tiny ...] \
        [--out results/memory_prediction.json] [--plan-model workloads.gpt:gpt2_124m]
    python scripts/bench_memory_prediction.py --models workloads.gpt:gpt_small --plan-model "" \
        --amp off --malloc-mmap-threshold 4MiB --out results/memory_prediction_fixed_heap.json
    python scripts/bench_memory_prediction.py --device cuda --plan-model "" --measure-only \
        --models workloads.convnet:resnet18 --out resnet18_cuda.json   # on a lent GPU; then here:
    python scripts/bench_memory_prediction.py --rescore resnet18_cuda.json --out SCORED.json
    python scripts/bench_memory_prediction.py --grid workers --plan-model "" --models \
        workloads.gpt:gpt_tiny workloads.gpt:gpt_small workloads.mlp:mlp_small \
        workloads.convnet:resnet_small --out results/memory_prediction_workers.json
    python scripts/bench_memory_prediction.py --models --plan-model "" \
        --search workloads.gpt:gpt_tiny --budget 700MiB --out results/memory_bound_search.json
    python scripts/bench_memory_prediction.py --models --plan-model "" --search-predict on \
        --search workloads.gpt:gpt_tiny --budget 400MiB --search-space default \
        --out results/memory_bound_search_default.json
    python scripts/bench_memory_prediction.py --models --plan-model "" \
        --repeat workloads.gpt:gpt_tiny --rounds 6 --out results/memory_repeat.json
    python scripts/bench_memory_prediction.py --models --plan-model "" --rounds 5 \
        --fresh workloads.convnet:resnet_small workloads.gpt:gpt_long_context \
        --out results/memory_fresh.json

The Hugging Face models (``examples/hf_models.py``, built from configs) need the ``trainers``
extra. Per model: the grid of ``autotune.bench.memory_prediction.grid`` (single, DDP x2 and
FSDP x2 on gloo; fp32 and bf16; no checkpointing and every block checkpointed; accumulation 1
and 4; and two DataLoader workers once), each configuration traced under fake tensors and run as
a real short trial. The error is (measured - predicted) / measured of the rank's resident peak:
``before any`` the first guess a search starts from (the workload's rank measured without its
tensors, ``autotune.runner.memory.bare_rank_bytes``, when the grid is scored, on this machine),
``after one`` calibrated on the grid's first configuration alone (what a search has after its
baseline), ``left out`` on every other configuration of the grid. Then ``autotune plan`` of
``--plan-model`` over the default space at 64 devices of 80 GiB, timed from the command line.

``--grid workers``: per model, one rank in fp32 with 0, 1 and 2 DataLoader workers, persistent or
not (what forking them leaves to them: ``MemoryModel.forked``).

``--device cuda``: the grid on this machine's GPUs (NCCL; one GPU: DDP and FSDP of one rank),
measured against the allocator's reserved peak, each row also giving the traced tensors (the
prediction a machine without a GPU makes) against the allocator's peak of allocated memory.

``--search MODEL --budget SIZE``: a memory-bound search (``--search-space``, quick by default;
2 ranks, 10 trials, where most of the space does not fit the budget) run twice, without and
with the prediction (``--search-predict on``: with it only): the trials that ran and did not
fit, and each search's wall time.

``--fresh MODEL... --rounds N``: one configuration run again and again, each time in fresh
processes with the grid's own window: how far its peak moves when nothing about it changes.

``--repeat MODEL --rounds N``: the configurations of ``REPEATED`` (fp32 and bf16, DDP and one
device, with and without a DataLoader worker, compiled or not) measured N times each, in turn,
by one Ray executor whose gangs are reused as a search's are: how far a configuration's peak
measured later in a gang lies from its first, on a fresh one (target: within 5%).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autotune.bench.memory_prediction import (
    CUDA_GRIDS,
    GRIDS,
    MMAP_THRESHOLD_ENV,
    GridPoint,
    errors,
    grid,
    grid_shape,
    machine,
    measure_grid,
    plan_seconds,
    print_scores,
    rescored,
    unfinished,
    worker_grid,
)
from autotune.bench.memory_runs import REPEAT_SETS, fresh_report, repeat_report, search_report
from autotune.bench.output import write_json
from autotune.runner.workload import WorkloadSpec
from autotune.units import parse_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        nargs="*",
        help="Default: on a CPU every grid but the GPU-scale models' (GPT-2 small's fp32 grid "
        "alone takes about 40 min on 2 cores: name them to run them); on CUDA those two.",
    )
    parser.add_argument(
        "--grid",
        default="default",
        choices=("default", "workers"),
        help="Per model: the default grid, or one rank with 0, 1 and 2 DataLoader workers, "
        "persistent or not (CPU).",
    )
    parser.add_argument("--out", default="results/memory_prediction.json")
    parser.add_argument("--plan-model", default="workloads.gpt:gpt2_124m")
    parser.add_argument("--search", help="A model for the memory-bound search.")
    parser.add_argument(
        "--rescore",
        help="Score the grids saved in this JSON again with the calibration as it now stands "
        "(no trial runs); writes --out.",
    )
    parser.add_argument("--budget", default="700MiB", help="Its memory budget (all ranks).")
    parser.add_argument("--search-space", default="quick", help="Its search space.")
    parser.add_argument(
        "--search-predict",
        choices=("both", "on"),
        default="both",
        help="Run it without and with the prediction, or with it only.",
    )
    parser.add_argument(
        "--repeat",
        help="A model whose configurations (fp32 and bf16, with and without a DataLoader worker, "
        "compiled or not) are measured --rounds times each by one Ray executor reusing its "
        "gangs: first and later peaks.",
    )
    parser.add_argument(
        "--repeat-set",
        default="default",
        choices=list(REPEAT_SETS),
        help="--repeat's configurations: the default five, one device with and without a "
        "DataLoader worker (bf16 and fp32), or one device compiled four ways (bf16).",
    )
    parser.add_argument(
        "--fresh",
        nargs="+",
        help="Models whose one-device fp32 configurations (with and without checkpointing) are "
        "measured --rounds times each, every run in fresh processes: the measurement's own "
        "spread.",
    )
    parser.add_argument(
        "--measure-only",
        action="store_true",
        help="Run the grid's trials and trace nothing; score the JSON later, on any machine, "
        "with --rescore (on a lent GPU, its minutes go to the trials alone).",
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--malloc-mmap-threshold",
        help="Run the grid's ranks with glibc's mmap threshold fixed at this size (e.g. 4MiB): "
        "their resident peak then follows the live tensors (see bench_cpu_heap.py).",
    )
    parser.add_argument(
        "--amp",
        nargs="+",
        default=["off", "bf16"],
        choices=["off", "bf16"],
        help="The grid's precisions (bf16 autocast on a CPU without bf16 units is emulated, "
        "about 100x slower: a grid of a larger model's bf16 trials does not fit a session).",
    )
    args = parser.parse_args()
    devices = 2
    if args.device == "cuda":
        import torch

        devices = torch.cuda.device_count()

    report: dict[str, object] = {"machine": machine(), "models": {}}
    if args.malloc_mmap_threshold:  # the local launcher's ranks inherit the environment
        threshold = parse_bytes(args.malloc_mmap_threshold)
        os.environ[MMAP_THRESHOLD_ENV] = str(threshold)
        report["malloc_mmap_threshold_bytes"] = threshold
    if args.rescore:
        saved = json.loads(Path(args.rescore).read_text())
        report = {**saved, "rescored_from": args.rescore, "models": {}}
        for model, rows in saved["models"].items():
            report["models"][model] = rescored(model, rows)  # type: ignore[index]
            print_scores(model, report["models"][model])  # type: ignore[index]
        write_json(args.out, report, indent=2)
        print(f"wrote {args.out}")
        return
    print(
        f"{'model':32} {'config':58} {'tensors':>8} {'measured':>9} {'before':>8} {'1 trial':>8} "
        f"{'others':>7}" + (f" {'allocated':>10}" if args.device == "cuda" else "")
    )
    missing: dict[str, list[dict[str, str]]] = {}
    report["unfinished"] = missing  # configurations that measured nothing, with why
    if args.models is None:
        gpu_scale = list(CUDA_GRIDS)
        args.models = (
            gpu_scale if args.device == "cuda" else [m for m in GRIDS if m not in gpu_scale]
        )
    for model in args.models:
        batch, segments = grid_shape(model, args.device)
        configs = (
            worker_grid(batch)
            if args.grid == "workers"
            else grid(batch, segments, devices, args.device, tuple(args.amp))
        )
        workload = WorkloadSpec(model=model, search_path=(os.getcwd(),))
        if args.measure_only:  # rows for --rescore to trace and score elsewhere
            rows = report["models"][model] = []  # type: ignore[index]

            def keep(p: GridPoint, rows: list[dict[str, Any]] = rows, name: str = model) -> None:
                rows.append(asdict(p))  # written at once: a cut run keeps what it measured
                _write(args.out, report)
                print(f"{name:32} {p.config:58} measured {(p.measured_bytes or 0) >> 20:,} MiB")

            measure_grid(workload, configs, trace=False, measured=keep)
            continue
        points = measure_grid(workload, configs)
        rows = errors(points, workload)
        report["models"][model] = rows  # type: ignore[index]
        print_scores(model, rows)
        missing[model] = unfinished(points)
        for row in missing[model]:
            print(f"{model}: {row['config']} measured nothing: {row['status']}: {row['message']}")
        _write(args.out, report)  # a long run keeps every grid it finished
    if args.plan_model:
        seconds = plan_seconds(args.plan_model)
        report["plan"] = {"model": args.plan_model, "devices": 64, "seconds": seconds}
        print(f"autotune plan --model {args.plan_model} --devices 64: {seconds:.1f} s")
    if args.search:
        both = args.search_predict == "both"
        report["search"] = search_report(args.search, args.budget, args.search_space, both)
    if args.repeat:
        report["repeat"] = repeat_report(args.repeat, args.rounds, args.repeat_set)
    if args.fresh:
        report["fresh"] = fresh_report(args.fresh, args.rounds)
    _write(args.out, report)
    print(f"wrote {args.out}")


def _write(out: str, report: dict[str, object]) -> None:
    write_json(out, report, indent=2)


if __name__ == "__main__":
    main()
