"""What a hopeless trial costs once pruned (target: a configuration 100x slower than the baseline
costs at most about two baseline trials' wall time).

    python scripts/bench_pruning.py [--out results/pruning.json]

Per case, on one local Ray instance with the search's own trial options (the tool's defaults,
``MeasurementSettings.options``), all on one single-rank gang that is reused throughout:

  baseline   the fast configuration, --baseline-runs times, unpruned: its trial wall time;
  pruned     the slow configuration as a search trial meets it, pruned against prune_ratio
             (0.5) of the baseline's median samples/s: its wall time, in baseline trials;
  after      the baseline once more, right after: when the pruned trial was ended mid-step,
             the gang's processes were ended with it and this trial starts fresh ones; what
             that adds to its overhead (wall time outside warm-up and measured steps) over the
             baseline runs' median is charged to the pruned trial;
  unpruned   the slow configuration once more without pruning, over a fixed window of one
             warm-up and two measured steps: how much slower it really is (the measured
             slowdown), and a lower bound on what it would have cost (the search's own window
             measures at least five steps after its warm-up).

Cases:

  convnet fp16   ``workloads.convnet:resnet_tiny``, AMP fp16 against fp32: a real slow knob on a
                 CPU without fast fp16 kernels (how slow it is depends on the CPU).
  100x, short    ``workloads.hopeless:Repeats``, a 4-layer MLP whose fp32 step takes
                 milliseconds; under fp16 autocast it runs its forward, in fp32, ``REPEATS``
                 (400) times per step, so the step does more work with nothing else changed:
                 a hopeless configuration whose slowdown is measured (about 100x or more
                 here: the optimizer step and the loading are not repeated).
  100x, long     the same with wider layers, whose fp32 step takes a tenth of a second or more:
                 the first step of the hopeless configuration runs for seconds, past the rule's
                 limit long before it ends, so the executor ends it from outside
                 (``autotune.runner.executor.cut_reason``) and the next trial pays for fresh
                 ranks.

Prints a table, writes results/pruning.json. Wall times are the driver's, submit to result.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from autotune.bench.output import write_json
from autotune.bench.pruning import summarise
from workloads.hopeless import REPEATS

CASES: dict[str, dict[str, Any]] = {  # "judged": the target is about this case
    "convnet fp16": {"model": "workloads.convnet:resnet_tiny", "judged": False},
    "100x, short": {"model": "workloads.hopeless:Repeats", "judged": True},
    "100x, long": {"model": "workloads.hopeless:WideRepeats", "judged": True},
}
SLOW = {"amp": "fp16"}
"""What makes each case's configuration slow (the baseline is the plain one: fp32)."""


def print_table(rows: list[dict[str, Any]], machine: str) -> None:
    head = (
        f"{'case':<14} {'base step s':>11} {'base trial s':>12} {'slowdown':>8} "
        f"{'pruned':>7} {'steps':>5} {'pruned s':>8} {'restart s':>9} {'in base trials':>14} "
        f"{'unpruned 1+2 steps s':>20}  target"
    )
    print(head)
    for r in rows:
        slowdown = f"{r['slowdown']:.0f}x" if r["slowdown"] else "-"
        verdict = {True: "met", False: "MISSED", None: "-"}[r["met"]]
        print(
            f"{r['case']:<14} {r['baseline_step_s']:>11.4f} {r['baseline_wall_s']:>12.2f} "
            f"{slowdown:>8} {r['pruned_status']:>7} {r['pruned_steps']:>5} "
            f"{r['pruned_wall_s']:>8.2f} {r['restart_charged_s']:>9.2f} "
            f"{r['pruned_cost_in_baseline_trials']:>14.2f} "
            f"{r['unpruned_wall_s']:>20.2f}  {r['target']}: {verdict}"
        )
    print(f"\non {machine}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--baseline-runs", type=int, default=3)
    parser.add_argument("--global-batch-size", type=int, default=32)
    parser.add_argument("--out", default="results/pruning.json")
    args = parser.parse_args()
    if args.baseline_runs < 1:
        parser.error(f"--baseline-runs {args.baseline_runs}: at least 1")

    from autotune.config import make_config
    from autotune.runner.executor import run_to_end
    from autotune.runner.platform import detect_platform
    from autotune.runner.ray_executor import RayExecutor
    from autotune.runner.request import TrialOptions, TrialRequest
    from autotune.runner.workload import WorkloadSpec
    from autotune.search.settings import make_settings

    measurement = make_settings({}).measurement
    unpruned_options = TrialOptions(
        warmup_steps=1, measured_steps=2, target_interval=0, timeout_s=600
    )
    platform = detect_platform("cpu")
    executor = RayExecutor(platform, cpus_per_rank=2, num_cpus=max(8, os.cpu_count() or 1))
    search_path = (os.getcwd(),)

    def run(model: str, values: dict[str, Any], options: TrialOptions) -> dict[str, Any]:
        config = make_config(
            {"global_batch_size": args.global_batch_size, "device": "cpu", **values}
        )
        request = TrialRequest(
            config=config,
            workload=WorkloadSpec(model=model, search_path=search_path),
            options=options,
        )
        started = time.perf_counter()
        result = run_to_end(executor, request)
        wall = time.perf_counter() - started
        if result.status not in ("ok", "pruned"):
            raise SystemExit(f"{config.summary()} of {model}: {result.status}: {result.message}")
        return {
            "config": config.summary(),
            "status": result.status,
            "samples_per_s": result.samples_per_s,
            "measured_steps": result.measured_steps,
            "measured_s": result.measured_s,
            "wall_s": wall,
            "overhead_s": max(0.0, wall - result.warmup_s - result.measured_s),
            "message": result.message,
        }

    rows = []
    try:
        for case in args.cases:
            spec = CASES[case]
            run(spec["model"], {}, measurement.options())  # the gang's first trial is cold
            base = [
                run(spec["model"], {}, measurement.options()) for _ in range(args.baseline_runs)
            ]
            line = statistics.median(r["samples_per_s"] for r in base) * measurement.prune_ratio
            pruned = run(spec["model"], SLOW, measurement.options(prune_below=line))
            after = run(spec["model"], {}, measurement.options())
            unpruned = run(spec["model"], SLOW, unpruned_options)
            runs = {
                "baseline": base,
                "pruned": [pruned],
                "after": [after],
                "unpruned": [unpruned],
            }
            rows.append({"model": spec["model"], **summarise(case, runs, spec["judged"])})
            print(f"{case}: done", flush=True)
    finally:
        executor.shutdown()

    machine = f"{platform.device_name}, {platform.cpu_count} cores, torch {platform.torch_version}"
    print_table(rows, machine)
    out = Path(args.out)
    summary = {
        "machine": machine,
        "global_batch_size": args.global_batch_size,
        "prune_ratio": measurement.prune_ratio,
        "repeats": REPEATS,
        "cases": rows,
    }
    write_json(out, summary, indent=2)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
