"""Replay on recorded landscapes: trials to reach a share of the optimum (the tuner's search
against random search), and the tuner's pick with its default finish, over many seeds.

    python scripts/bench_search_replay.py results/landscapes/*.json --seeds 20

Per landscape: median and worst trials until a configuration within --share (98%) of the
optimum was measured, for the tuner (capped at half the grid, at most 40) and for random search
(the whole grid); the tuner's pick with --tuner-trials (its race and verification on top), how
many seeds picked at least 0.97, what the recommendation said of the misses, and how far its
reported throughput lay from the landscape's truth. Writes results/search_replay.json. The
noise-controlled replay is scripts/bench_replay_noise.py.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from autotune.bench.landscape import Landscape
from autotune.bench.live import TARGET_ERROR, TARGET_RATIO
from autotune.bench.output import write_json

REPLAY_CAP = 40
"""Replay's search for trials-to-share stops here (or at half the grid): the sampler's cost
grows with its history."""


def replay(args: argparse.Namespace) -> None:
    from autotune.bench.replay import (
        reach_cell,
        reach_summary,
        replay_random,
        replay_tuner,
        trials_to_reach,
    )

    out: dict[str, Any] = {
        "share": args.share,
        "seeds": args.seeds,
        "noise": "recorded",  # each landscape's own run-to-run noise
        "trials": args.tuner_trials,
        "landscapes": {},
    }
    print(
        f"trials to reach {args.share:.0%} of the optimum over {args.seeds} seeds "
        f"(median / worst; '-': not reached by some seed within half the grid, at most "
        f"{REPLAY_CAP} trials, for autotune, the whole grid for random)"
    )
    print(
        f"  {'landscape':<28} {'configs':>7} {'autotune':>12} {'random':>12} {'tuner pick':>10} "
        f"{'>=0.97':>6} {'misses said too close':>21} {'good finalist':>13} "
        f"{'estimate error (race mean)':>26} {'within 5%':>9}"
    )
    for path in args.replay:
        landscape = Landscape.load(path)
        n = len(landscape.points)
        counts: dict[str, list[int | None]] = {"autotune": [], "random": []}
        picks: list[float] = []
        told: list[bool | None] = []
        good_raced: list[bool] = []
        errors: list[tuple[float, float]] = []  # (reported, race mean) over the pick's value
        # The sampler's cost grows with its history (and with the duplicates it proposes once
        # most of a grid is measured): half the grid, at most REPLAY_CAP trials.
        cap = min(n // 2, REPLAY_CAP)
        for seed in range(args.seeds):
            tuned = replay_tuner(landscape, seed, cap, finish=False)
            counts["autotune"].append(trials_to_reach(landscape, tuned.measured, args.share))
            randomly = replay_random(landscape, seed, n)
            counts["random"].append(trials_to_reach(landscape, randomly.measured, args.share))
            budgeted = replay_tuner(landscape, seed, args.tuner_trials)
            picks.append(landscape.ratio(budgeted.pick))
            told.append(budgeted.told_apart)
            good_raced.append(any(landscape.ratio(c) >= TARGET_RATIO for c in budgeted.raced))
            errors.extend(estimate_error(landscape, budgeted))
        stats = {
            "autotune": reach_summary(counts["autotune"], cap),
            "random": reach_summary(counts["random"], n),
        }
        missed = [t for p, t in zip(picks, told, strict=True) if p < TARGET_RATIO]
        good = [g for p, g in zip(picks, good_raced, strict=True) if p < TARGET_RATIO]
        stats["autotune_pick_ratio"] = {
            "median": statistics.median(picks),
            "worst": min(picks),
            "at_least_0.97": sum(p >= TARGET_RATIO for p in picks),
            # what the recommendation said of each pick: its runner-up ruled out, or too close
            "runner_up_ruled_out": sum(t is True for t in told),
            "misses": len(missed),
            "misses_said_too_close": sum(t is False for t in missed),
            # a miss whose race ran no configuration within 0.97 was lost before the race
            "misses_with_a_finalist_within_0.97": sum(good),
        }
        # Replay's noise is drawn around the landscape's value, so what is left is the tool's
        # own error: the estimate against the truth, without the machine's drift in between.
        stats["estimate_error"] = {
            "mean": statistics.fmean(e[0] for e in errors),
            "race_mean": statistics.fmean(e[1] for e in errors),
            "within_0.05": sum(abs(e[0]) <= TARGET_ERROR for e in errors),
            "race_mean_within_0.05": sum(abs(e[1]) <= TARGET_ERROR for e in errors),
            "picks": len(errors),
        }
        out["landscapes"][str(path)] = {"configs": n, "tuner_cap": cap, **stats, "raw": counts}
        error = stats["estimate_error"]
        ratio = stats["autotune_pick_ratio"]
        print(
            f"  {Path(path).name:<28} {n:>7} {reach_cell(stats['autotune']):>12} "
            f"{reach_cell(stats['random']):>12} {statistics.median(picks):>10.3f} "
            f"{ratio['at_least_0.97']:>6} {ratio['misses_said_too_close']:>14} of "
            f"{ratio['misses']:<4} {ratio['misses_with_a_finalist_within_0.97']:>8} of "
            f"{ratio['misses']:<4} {error['mean']:>+18.1%} ({error['race_mean']:+.1%}) "
            f"{error['within_0.05']:>4} of {error['picks']}",
            flush=True,
        )
    write_json(args.out, out, indent=1)
    print(f"results: {args.out}")


def estimate_error(landscape: Landscape, replayed: Any) -> list[tuple[float, float]]:
    """The pick's reported throughput and its race mean over its value in ``landscape``,
    each less one; empty without an estimate."""
    point = landscape.lookup(replayed.pick) if replayed.pick is not None else None
    if replayed.estimate is None or point is None or not point.value:
        return []
    reported = replayed.estimate / point.value
    return [(reported - 1, reported / replayed.selection_factor - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("replay", nargs="+", help="Landscape files to replay.")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--share", type=float, default=0.98)
    parser.add_argument("--tuner-trials", type=int, default=10)
    parser.add_argument("--out", default="results/search_replay.json")
    replay(parser.parse_args())


if __name__ == "__main__":
    main()
