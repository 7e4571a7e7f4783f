"""How often DDP over gloo kills a rank for a model of several sparse lookups, and of one
(``autotune.bench.gloo_sparse``: plain PyTorch, two CPU ranks, fresh processes each run).

    python scripts/bench_gloo_sparse.py [--runs 12] [--tables 4 1] [--steps 300] \
        [--variants plain] [--out results/gloo_sparse.json]

A variant adds a dense head after the lookups ("head"), DDP's gradient_as_bucket_view
("bucket-view"), or both ("head+bucket-view"); "+agree": a per-step all-reduce of the step's
time on the same group, as a trial's ranks do; "+sample": autotune's memory sampler in its
thread, as in a trial's measured window; "powersgd": DDP's PowerSGD hook (a run still waiting
at --timeout is "hung", its ranks killed). Several variants are run in turn, run by run, so
that what the machine does meanwhile falls on each alike.
"""

from __future__ import annotations

import argparse

from autotune.bench.gloo_sparse import VARIANTS, run, tally
from autotune.bench.memory_prediction import machine
from autotune.bench.output import write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--tables", type=int, nargs="+", default=[4, 1])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--variants", nargs="+", default=["plain"], choices=VARIANTS)
    parser.add_argument("--timeout", type=float, default=300, help="seconds a run may take")
    parser.add_argument("--out", default="results/gloo_sparse.json")
    args = parser.parse_args()
    report: dict[str, object] = {"machine": machine(), "steps": args.steps, "runs": {}}
    print(f"{'lookups':>7}  {'variant':<24}  {'runs':>4}  {'died':>4}  outcomes")
    for tables in args.tables:
        taken: dict[str, list[str]] = {variant: [] for variant in args.variants}
        for _ in range(args.runs):
            for variant in args.variants:
                taken[variant].append(run(tables, args.steps, args.timeout, variant))
        for variant, outcomes in taken.items():
            key = str(tables) if variant == "plain" else f"{tables} {variant}"
            report["runs"][key] = outcomes  # type: ignore[index]
            counts = tally(outcomes)
            died = sum(n for outcome, n in counts.items() if outcome != "ok")
            said = ", ".join(f"{outcome} {n}" for outcome, n in sorted(counts.items()))
            print(f"{tables:>7}  {variant:<24}  {args.runs:>4}  {died:>4}  {said}")
    write_json(args.out, report, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
