"""Per-trial overhead of warm 2-rank trials on Ray (target: median at most 1.5 s).

    python scripts/bench_trial_overhead.py [--trials 12] [--out results/trial_overhead.json]

Runs a cold trial (gang start) and then warm trials on the reused rank actors, cycling through
configurations that differ in every knob a search turns (so nothing is cached by accident), and
splits each trial's wall time into overhead, warm-up and measured steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from autotune.bench.output import write_json

CONFIGS = [
    {"parallel": "ddp", "comm_hook": "none"},
    {"parallel": "ddp", "comm_hook": "fp16", "grad_accum_steps": 2},
    {"parallel": "fsdp", "checkpoint_segments": 2},
    {"parallel": "ddp", "amp": "bf16", "num_workers": 1, "prefetch_factor": 2},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--model", default="workloads.gpt:gpt_tiny")
    parser.add_argument("--out", default="results/trial_overhead.json")
    args = parser.parse_args()

    from autotune.config import make_config
    from autotune.runner.executor import run_to_end
    from autotune.runner.platform import detect_platform
    from autotune.runner.ray_executor import RayExecutor
    from autotune.runner.request import TrialOptions, TrialRequest
    from autotune.runner.workload import WorkloadSpec

    platform = detect_platform("cpu")
    executor = RayExecutor(platform, cpus_per_rank=2, num_cpus=8)
    rows = []
    try:
        for i in range(args.trials + 1):
            values = {
                "global_batch_size": 32,
                "world_size": 2,
                "device": "cpu",
                **CONFIGS[i % len(CONFIGS)],
            }
            request = TrialRequest(
                config=make_config(values),
                workload=WorkloadSpec(model=args.model, search_path=(os.getcwd(),)),
                options=TrialOptions(warmup_steps=2, measured_steps=8),
            )
            result = run_to_end(executor, request)
            assert result.ok, result.message
            rows.append(
                {
                    "trial": i,
                    "warm": i > 0,
                    "config": request.config.summary(),
                    "total_s": result.total_s,
                    "overhead_s": result.overhead_s,
                    "warmup_s": result.warmup_s,
                    "measured_s": result.measured_s,
                    "build_s": result.build_s,
                    "startup_s": result.startup_s,
                }
            )
    finally:
        executor.shutdown()

    warm = [r["overhead_s"] for r in rows if r["warm"]]
    summary = {
        "machine": f"{platform.device_name}, {platform.cpu_count} cores, torch "
        f"{platform.torch_version}",
        "model": args.model,
        "cold_overhead_s": rows[0]["overhead_s"],
        "warm_overhead_median_s": statistics.median(warm),
        "warm_overhead_max_s": max(warm),
        "target_s": 1.5,
        "met": statistics.median(warm) <= 1.5,
        "trials": rows,
    }
    print(
        f"{'trial':>5} {'warm':>5} {'overhead s':>10} {'warm-up s':>9} {'measured s':>10}  config"
    )
    for r in rows:
        print(
            f"{r['trial']:>5} {r['warm']!s:>5} {r['overhead_s']:>10.3f} "
            f"{r['warmup_s']:>9.3f} {r['measured_s']:>10.3f}  {r['config']}"
        )
    print(
        f"\ncold overhead {summary['cold_overhead_s']:.2f} s; warm overhead median "
        f"{summary['warm_overhead_median_s']:.3f} s (max {summary['warm_overhead_max_s']:.3f} s)"
        f", target <= 1.5 s: {'met' if summary['met'] else 'MISSED'} on {summary['machine']}"
    )
    out = Path(args.out)
    write_json(out, summary, indent=2)


if __name__ == "__main__":
    main()
