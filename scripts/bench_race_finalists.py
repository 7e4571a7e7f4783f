"""Where replay's picks are lost: in the search, in choosing the finalists, or in the race.

    python scripts/bench_race_finalists.py [--top-k 3 5] [--race-rounds 4] [--trials 20]
        [--seeds 20] [--landscapes results/landscapes/*.json] [--out results/race_finalists.json]

For each landscape, seed, top_k and race-rounds (the most rounds of the race), the real Tuner
runs on the replaying executor (as ``bench_search_quality.py --replay`` does) and three counts
are kept, each "seeds in which a configuration within --share of the optimum was ...":
measured by the search, among the finalists (the top_k by their single search measurement),
and picked by the race. The drop from one column to the next says which stage loses the
answer; race runs per search say what a larger top_k or more rounds cost. "all" rows add up
every landscape's seeds.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from autotune.bench.output import write_json


def one_seed(
    landscape: Any, seed: int, trials: int, top_k: int, race_rounds: int
) -> dict[str, float]:
    from autotune.bench.replay import make_replay_tuner
    from autotune.search.evidence import finalists

    tuner = make_replay_tuner(landscape, seed, trials, top_k=top_k, race_rounds=race_rounds)
    tuner.baseline()
    tuner.search()
    measured = [r.config for r in tuner.log.measured().values() if r.config is not None]
    chosen = finalists(tuner.log.records, top_k)
    pick = tuner.verify(tuner.race())[0]
    return {
        "measured": max((landscape.ratio(c) for c in measured), default=0.0),
        "finalists": max((landscape.ratio(c) for c in chosen), default=0.0),
        "pick": landscape.ratio(pick) if pick is not None else 0.0,
        "race_runs": sum(1 for r in tuner.log.records if r.role == "race"),
    }


def label(path: str) -> str:
    """'mlp', or '2026-11-23d/mlp' for a recording's (results/recording_2026-11-23d/...)."""
    parent = Path(path).parent.parent.name
    recording = parent.removeprefix("recording_") if parent.startswith("recording_") else ""
    return f"{recording}/{Path(path).stem}" if recording else Path(path).stem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--landscapes", nargs="+", default=None)
    parser.add_argument("--top-k", nargs="+", type=int, default=[3, 5])
    parser.add_argument("--race-rounds", nargs="+", type=int, default=[4])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--share", type=float, default=0.97)
    parser.add_argument("--out", default="results/race_finalists.json")
    args = parser.parse_args()

    from autotune.bench.landscape import Landscape

    paths = args.landscapes or sorted(str(p) for p in Path("results/landscapes").glob("*.json"))
    rows = []
    print(
        f"seeds (of {args.seeds}) with a configuration within {args.share} of the optimum, "
        f"{args.trials} search trials"
    )
    print(
        f"{'landscape':<20}{'top_k':>6}{'rounds':>7}{'measured':>10}{'finalists':>11}{'picked':>8}"
        f"{'worst pick':>12}{'race runs':>11}"
    )
    combos = [(k, n) for k in args.top_k for n in args.race_rounds]
    for path in paths:
        landscape = Landscape.load(Path(path))
        for top_k, rounds in combos:
            seeds = [one_seed(landscape, s, args.trials, top_k, rounds) for s in range(args.seeds)]
            row = {
                "landscape": path,
                "top_k": top_k,
                "race_rounds": rounds,
                **{
                    k: sum(s[k] >= args.share for s in seeds)
                    for k in ("measured", "finalists", "pick")
                },
                "worst_pick": min(s["pick"] for s in seeds),
                "race_runs_mean": statistics.mean(s["race_runs"] for s in seeds),
                "raw": seeds,
            }
            rows.append(row)
            print(
                f"{label(path):<20}{top_k:>6}{rounds:>7}{row['measured']:>10}"
                f"{row['finalists']:>11}{row['pick']:>8}{row['worst_pick']:>12.3f}"
                f"{row['race_runs_mean']:>11.1f}",
                flush=True,
            )
    for top_k, rounds in combos:  # every landscape's seeds together
        mine = [r for r in rows if r["top_k"] == top_k and r["race_rounds"] == rounds]
        counts = [sum(r[k] for r in mine) for k in ("measured", "finalists", "pick")]
        runs = statistics.mean(r["race_runs_mean"] for r in mine)
        print(
            f"{'all':<20}{top_k:>6}{rounds:>7}{counts[0]:>10}{counts[1]:>11}{counts[2]:>8}"
            f"{'':>12}{runs:>11.1f}"
        )
    out = {"trials": args.trials, "seeds": args.seeds, "share": args.share, "rows": rows}
    write_json(args.out, out, indent=1)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
