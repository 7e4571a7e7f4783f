"""How should the search spend 10-30 trials? Sampler set-ups compared on recorded landscapes.

    python scripts/bench_search_setup.py results/landscapes/*.json --seeds 20

Every set-up is the real ``Tuner`` (baseline, proposals with the memory pre-check and
pruning, the race of the finalists, verification) replayed on a landscape recorded by
``bench_search_quality.py``: nothing runs, each trial is the recorded median with the
recorded noise. Per landscape and set-up, over --seeds seeds:

  trials to 98%   measured trials until one within 98% of the optimum (median and 90th
                  percentile; the search is capped at --cap trials, a quarter of the grid by
                  default, and a seed that never gets there counts as the cap + 1);
  pick >= 0.97    in how many seeds the recommendation, after --budgets search trials and the
                  race, is within 97% of the optimum (and the worst pick's share).

Set-ups: Optuna's TPE (multivariate, group, constant liar) with 3, 5 or 10 random start-up
trials, random search through the same tuner, and the climb (one-knob moves from the fastest
configurations first, autotune's default) before TPE. Writes results/search_setup.json.
--jobs runs the (landscape, set-up) pairs in that many processes: TPE's later trials are slow,
and the whole study on three landscapes takes about an hour in one process.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from autotune.bench.output import write_json
from autotune.bench.setups import PICK, SETUPS, study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("landscapes", nargs="+")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budgets", type=int, nargs="+", default=[10, 20])
    parser.add_argument("--cap", type=int, help="trials for 'to 98%%' (a quarter of the grid)")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--out", default="results/search_setup.json")
    args = parser.parse_args()
    started = time.perf_counter()
    pairs = [(path, name) for path in args.landscapes for name in SETUPS]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [
            pool.submit(study, path, name, args.seeds, args.budgets, args.cap)
            for path, name in pairs
        ]
        rows = [f.result() for f in futures]
    results: dict[str, Any] = {
        "seeds": args.seeds,
        "budgets": args.budgets,
        "cap": args.cap,
        "landscapes": {},
    }
    for (path, name), row in zip(pairs, rows, strict=True):
        results["landscapes"].setdefault(path, {})[name] = row
    for path, by_setup in results["landscapes"].items():
        print(f"\n{path} ({args.seeds} seeds)")
        picks = "".join(f" {f'>=0.97 @{b}':>10} {'worst':>6}" for b in args.budgets)
        print(f"  {'set-up':<20} {'to 98%':>7} {'p90':>5}{picks}")
        for name, row in by_setup.items():
            cells = "".join(
                f" {row[f'pick_ge_{PICK}_at_{b}']:>10} {row[f'worst_pick_at_{b}']:>6.3f}"
                for b in args.budgets
            )
            print(f"  {name:<20} {row['trials_to_98_median']:>7g} "
                  f"{row['trials_to_98_p90']:>5g}{cells}")  # fmt: skip
    print(f"\n{time.perf_counter() - started:.0f} s")
    write_json(args.out, results, indent=1)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
