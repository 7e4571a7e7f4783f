"""How far a CPU rank's resident memory grows beyond what a short trial sees, and why.

    python scripts/bench_cpu_growth.py [--models examples/moe.py:MoEDecoder ...] \
        [--micro-batch 16] [--steps 120] [--out results/cpu_growth.json]

Per model, fresh processes train for ``--steps`` steps, fp32 and bf16 autocast, and bf16 again
with oneDNN's and ideep's kernel caches held to one entry (``autotune.bench.cpu_growth``): the
resident high-water mark after 3 steps (what a short trial reaches) and at the end, the step
from which it stopped growing, and the median step time. A mixture of experts routes a new number
of tokens to each expert every step, and autocast on CPU compiles a oneDNN kernel per shape.
"""

from __future__ import annotations

import argparse

from autotune.bench.cpu_growth import growth, summary
from autotune.bench.memory_prediction import machine
from autotune.bench.output import write_json

MODELS = ("examples/moe.py:MoEDecoder", "workloads.gpt:gpt_small")
"""A mixture of experts (shapes change every step) and a dense model (they do not)."""

RUNS = (("off", False), ("bf16", False), ("bf16", True))
"""(autocast, kernel caches capped)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--out", default="results/cpu_growth.json")
    args = parser.parse_args()

    report: dict[str, object] = {"machine": machine(), "runs": []}
    runs: list[dict[str, object]] = report["runs"]  # type: ignore[assignment]
    print(
        f"{'model':30} {'autocast':8} {'caches':7} {'after 3':>9} {'at the end':>11} "
        f"{'growth':>7} {'settled':>8} {'s/step':>7}"
    )
    for model in args.models:
        for amp, capped in RUNS:
            run = growth(model, amp, args.micro_batch, args.steps, capped)
            run["summary"] = s = summary(run)
            runs.append(run)
            print(
                f"{model:30} {amp:8} {'capped' if capped else 'default':7} "
                f"{s['early_hwm_bytes'] / 2**20:7,.0f}M {s['final_hwm_bytes'] / 2**20:9,.0f}M "
                f"{s['growth']:+7.0%} {s['settled_at_step']:8} {s['median_step_s']:7.2f}"
            )
            write_json(args.out, report, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
