"""Search quality where the truth is known: replay on recorded landscapes at GPU-level noise
(2%), at each landscape's recorded noise, and the share of correct picks against noise.

    python scripts/bench_replay_noise.py results/landscapes/*.json \
        results/recording_2026-11-23*/landscapes/*.json --seeds 20 --out results/replay_noise.json

Targets (issue: the honest headline): at 2% noise, with the default budget (20 trials), the pick
at least 0.97 of the optimum in at least 18 of 20 seeds on every landscape, and its true value
at least the standard recipe's and random search's at equal trial runs. At recorded noise:
reported, not targeted. The library is ``autotune.bench.pick_quality``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from autotune.bench.landscape import Landscape
from autotune.bench.output import write_json
from autotune.bench.pick_quality import DEFAULT_TRIALS, GPU_NOISE, NOISE_LEVELS, judge


def _name(path: str) -> str:
    parts = Path(path).parts
    recording = next((p for p in parts if p.startswith("recording_")), "latest")
    return f"{recording.removeprefix('recording_')}/{Path(path).stem}"


def _row(name: str, row: dict[str, Any]) -> str:
    seeds = row["seeds"]
    return (
        f"  {name:<20} {row['recorded_noise']:>6.1%} {row['at_least_0.97']:>3} of {seeds:<3}"
        f"{row['tuner_median']:>7.3f} {row['tuner_worst']:>6.3f} {row['recipe_median']:>7.3f} "
        f"{row['random_median']:>7.3f} {row['tuner_at_least_recipe']:>4} of {seeds:<3}"
        f"{row['tuner_at_least_random']:>4} of {seeds:<3}{row['finishing_runs_median']:>6g} "
        f"{row['misses_said_too_close']:>5}"
    )


HEADER = (
    f"  {'landscape':<20} {'noise':>6} {'>=0.97':>9} {'median':>7} {'worst':>6} {'recipe':>7} "
    f"{'random':>7} {'>=recipe':>10} {'>=random':>10} {'race':>6} {'said close':>5}"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("landscapes", nargs="+")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS)
    parser.add_argument("--levels", type=float, nargs="+", default=list(NOISE_LEVELS))
    parser.add_argument("--out", default="results/replay_noise.json")
    args = parser.parse_args()
    started = time.perf_counter()
    landscapes = {_name(p): Landscape.load(p) for p in args.landscapes}
    out: dict[str, Any] = {"seeds": args.seeds, "trials": args.trials, "runs": {}}
    for noise in (GPU_NOISE, None):
        label = f"{noise:.0%} noise" if noise is not None else "recorded noise"
        print(f"\n{label}, {args.trials} trials, {args.seeds} seeds (ratios: true value / optimum)")
        print(HEADER)
        rows = {}
        for name, landscape in landscapes.items():
            rows[name] = judge(landscape, args.seeds, args.trials, noise)
            print(_row(name, rows[name]), flush=True)
        out["runs"][str(noise if noise is not None else "recorded")] = rows
    print(f"\nseeds picking at least 0.97 of the optimum, by noise ({args.trials} trials)")
    print(f"  {'landscape':<20}" + "".join(f"{level:>8.0%}" for level in args.levels))
    table: dict[str, dict[str, int]] = {}
    for name, landscape in landscapes.items():
        table[name] = {}
        for level in args.levels:
            done = out["runs"].get(str(level), {}).get(name)
            row = done or judge(landscape, args.seeds, args.trials, level)
            table[name][str(level)] = row["at_least_0.97"]
        print(f"  {name:<20}" + "".join(f"{table[name][str(v)]:>8}" for v in args.levels))
    total = len(landscapes) * args.seeds
    shares = {str(v): sum(t[str(v)] for t in table.values()) / total for v in args.levels}
    print(f"  {'all':<20}" + "".join(f"{shares[str(v)]:>8.0%}" for v in args.levels))
    out["correct_picks_by_noise"] = {"per_landscape": table, "share": shares}
    gpu = out["runs"][str(GPU_NOISE)].values()
    out["targets"] = {
        "18_of_20_at_gpu_noise_on_every_landscape": all(
            r["at_least_0.97"] >= 0.9 * r["seeds"] for r in gpu
        ),
        "at_least_recipe_and_random_median": all(
            r["tuner_median"] >= max(r["recipe_median"], r["random_median"]) for r in gpu
        ),
    }
    out["wall_s"] = time.perf_counter() - started
    print(f"\ntargets: {out['targets']}  ({out['wall_s']:.0f} s)")
    write_json(args.out, out, indent=1)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
