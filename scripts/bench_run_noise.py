"""Run-to-run noise: one configuration run again and again on one machine.

    python scripts/bench_run_noise.py                      # gpt_tiny's grid optimum, 25 runs
    python scripts/bench_run_noise.py --workload mlp --runs 40

Every run is an ordinary trial of the benchmark's protocol (3 warm-up steps, then the adaptive
window: at least 1 s, until the 95% interval of the mean step time is within +-5%, at most 4 s)
on one Ray executor, so the gang is reused as in a search. What the search, the race and the
judge must see through is how much one run moves (the coefficient of variation) and whether
neighbouring runs move together (the lag-1 autocorrelation: near 0 for independent draws, high
when the machine passes through slow and fast stretches, which pairing in rounds absorbs and a
single long run does not). Prints the runs and a summary, writes results/run_noise.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from autotune.bench.noise import lag1_autocorrelation
from autotune.bench.output import write_json


def main() -> None:
    from autotune.bench.landscape import Landscape
    from autotune.bench.live import WORKLOADS, Live
    from autotune.runner.platform import detect_platform
    from autotune.runner.workload import WorkloadSpec

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="gpt", choices=["mlp", "convnet", "gpt"])
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument(
        "--landscapes",
        default="results/landscapes",
        help="The configuration run is the optimum of this workload's landscape.",
    )
    parser.add_argument("--out", default="results/run_noise.json")
    args = parser.parse_args()
    if args.runs < 3:
        parser.error(f"--runs {args.runs}: at least 3 are needed for a spread")
    model, _ = WORKLOADS["cpu"][args.workload]
    config = Landscape.load(Path(args.landscapes) / f"{args.workload}.json").optimum().config
    platform = detect_platform("cpu")
    protocol = argparse.Namespace(
        warmup_steps=3, measured_steps=5, target_interval=0.05, max_measure_s=4.0, seed=0
    )
    live = Live(platform, WorkloadSpec(model=model, search_path=(os.getcwd(),)), protocol, None)
    runs = []
    print(f"{args.workload}: {config.summary()}, {args.runs} runs in a row")
    for number in range(1, args.runs + 1):
        measured, run = live.run(config)
        at = time.perf_counter() - live.started
        runs.append({"at_s": at, "samples_per_s": measured.samples_per_s,
                     "measured_s": run.measured_s, "status": measured.status})  # fmt: skip
        print(f"  run {number:>3}  t={at:6.1f} s  {measured.samples_per_s or 0:8.1f} samples/s  "
              f"window {run.measured_s:.2f} s", flush=True)  # fmt: skip
    live.close()
    values = [r["samples_per_s"] for r in runs if r["status"] == "ok" and r["samples_per_s"]]
    mean = statistics.fmean(values)
    half = len(values) // 2
    summary = {
        "workload": args.workload,
        "config": config.summary(),
        "machine": f"{platform.device_name}, {platform.cpu_count} cores, torch "
        f"{platform.torch_version}",
        "runs": len(values),
        "mean_samples_per_s": mean,
        "cv": statistics.stdev(values) / mean,
        "cv_without_first": statistics.stdev(values[1:]) / statistics.fmean(values[1:]),
        "lag1_autocorrelation": lag1_autocorrelation(values),
        "first_half_mean": statistics.fmean(values[:half]),
        "second_half_mean": statistics.fmean(values[half:]),
    }
    print(
        f"mean {mean:.1f} samples/s; CV {summary['cv']:.1%} ({summary['cv_without_first']:.1%} "
        f"without the first run); lag-1 autocorrelation {summary['lag1_autocorrelation']:.2f}; "
        f"halves {summary['first_half_mean']:.1f} / {summary['second_half_mean']:.1f}"
    )
    write_json(args.out, {**summary, "per_run": runs}, indent=1)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
