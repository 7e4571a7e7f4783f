"""The bigger space: does the search still find the optimum when the knobs of real-scale training
are added? Replay on recorded landscapes and on the same landscapes extended with those knobs
(a labelled simulation: autotune.bench.extended gives each knob a published GPU effect; none
of them was measured here).

    python scripts/bench_bigger_space.py results/landscapes/*.json --seeds 20

Per landscape, recorded and extended: its size; the trials until a configuration within 98%
of the optimum was measured (median / worst over the seeds; the tuner capped at half the grid
and at most 40 trials, random search over the whole grid), at the landscape's recorded noise;
and how many seeds picked at least 0.97 of the optimum with the default 20 trials at 2% noise.
Writes results/bigger_space.json.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from autotune.bench.extended import SIMULATED, extend
from autotune.bench.landscape import Landscape
from autotune.bench.live import TARGET_RATIO
from autotune.bench.output import write_json
from autotune.bench.pick_quality import DEFAULT_TRIALS, GPU_NOISE
from autotune.bench.replay import (
    reach_cell,
    reach_summary,
    replay_random,
    replay_tuner,
    trials_to_reach,
)

CAP = 40
SHARE = 0.98


def row(landscape: Landscape, seeds: int) -> dict[str, Any]:
    n = len(landscape.points)
    cap = min(n // 2, CAP)
    tuner, randomly, picks = [], [], []
    for seed in range(seeds):
        measured = replay_tuner(landscape, seed, cap, finish=False).measured
        tuner.append(trials_to_reach(landscape, measured, SHARE))
        measured = replay_random(landscape, seed, n).measured
        randomly.append(trials_to_reach(landscape, measured, SHARE))
        pick = replay_tuner(landscape, seed, DEFAULT_TRIALS, noise=GPU_NOISE).pick
        picks.append(landscape.ratio(pick))
    return {
        "configs": n,
        "tuner_trials_to_98": reach_summary(tuner, cap),
        "random_trials_to_98": reach_summary(randomly, n),
        "picks_at_least_0.97_at_2pct": sum(p >= TARGET_RATIO for p in picks),
        "worst_pick_at_2pct": min(picks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("landscapes", nargs="+")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--out", default="results/bigger_space.json")
    args = parser.parse_args()
    started = time.perf_counter()
    out: dict[str, Any] = {
        "seeds": args.seeds,
        "trials": DEFAULT_TRIALS,
        "noise": {"trials_to_98": "recorded", "picks": GPU_NOISE},
        "simulated": {k.name: k.source for k in SIMULATED},
        "landscapes": {},
    }
    print(f"trials to 98% of the optimum (median / worst, {args.seeds} seeds, recorded noise); "
          f"picks >= 0.97 with {DEFAULT_TRIALS} trials at 2% noise")  # fmt: skip
    print(f"  {'landscape':<32} {'space':<9} {'configs':>7} {'autotune':>10} {'random':>10} "
          f"{'picks':>6}")  # fmt: skip
    for path in args.landscapes:
        recorded = Landscape.load(path)
        rows = {
            "recorded": row(recorded, args.seeds),
            "extended": row(extend(recorded), args.seeds),
        }
        out["landscapes"][path] = rows
        for kind, r in rows.items():
            print(
                f"  {path[-32:]:<32} {kind:<9} {r['configs']:>7} "
                f"{reach_cell(r['tuner_trials_to_98']):>10} "
                f"{reach_cell(r['random_trials_to_98']):>10} "
                f"{r['picks_at_least_0.97_at_2pct']:>3} of {args.seeds}",
                flush=True,
            )
    out["wall_s"] = time.perf_counter() - started
    write_json(args.out, out, indent=1)
    print(f"results: {args.out} ({out['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
