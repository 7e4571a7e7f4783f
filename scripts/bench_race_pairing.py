"""How long should a race run be? Paired rounds of two configurations at several run lengths.

    python scripts/bench_race_pairing.py                          # mlp, runs of 0.5-4 s
    python scripts/bench_race_pairing.py --workload gpt --cycles 10

The race decides between finalists on the mean log ratio of their runs, round by round
(``autotune.search.race``). How tight that mean gets for a minute of racing depends on the run
length: a shorter run is noisier, but the two runs of a round lie closer together in time (so
the machine's drift hits both alike) and more rounds fit in the minute; each run also pays a
fixed cost (launch on the warm gang, warm-up steps, the DataLoader's first batches). This
script measures that trade on this machine: the grid optimum of a recorded landscape (A) and
its runner-up (B) run in rounds (A B, then B A), at each run length in turn, the lengths
rotating from block to block so that every length meets every stretch of the machine. Every
run is an ordinary race run on one Ray executor (3 warm-up steps, then exactly the floor: at
least ``--min-steps`` steps and the run length).

Per run length it prints the rounds, the median wall time of a round, the spread of one run's
log throughput and of a round's log ratio, how much the pairing removed of the ratio's variance
(1 - var(ratio) / (2 var(run))), the figure that decides: the standard error of the mean log
ratio after one minute of racing the two (spread / sqrt(rounds per minute)), and whether the
second run of a round measures faster than the first (its edge: rotating the order cancels it
in the mean, but it widens the spread). The spreads are robust (1.4826 median absolute
deviations): this machine passes through stretches ten times slower for a minute, which would
decide a plain standard deviation alone (the JSON keeps the plain ones too). Writes
results/race_pairing.json.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from autotune.bench.noise import pairing_row
from autotune.bench.output import write_json


def duet(args: argparse.Namespace, a: Any, b: Any, spec: Any, length: float, platform: Any) -> None:
    """A and B in duet rounds and in sequential rounds, blocks of each alternating."""
    from autotune.bench import duet as duets

    why = duets.cores_for_duet()
    if why is not None:
        raise SystemExit(f"--duet cannot run here: {why}")
    first = duets.request_of(a, spec, length, args.min_steps)
    second = duets.request_of(b, spec, length, args.min_steps)
    print(f"duet of A = {a.summary()} and B = {b.summary()}, runs of {length:g} s")
    by_mode: dict[str, list[dict[str, Any]]] = {"sequential": [], "duet": []}
    started = time.perf_counter()
    for cycle in range(args.cycles):
        for mode in ("duet", "sequential") if cycle % 2 else ("sequential", "duet"):
            for _ in range(args.rounds):
                number = len(by_mode[mode])
                by_mode[mode].append(duets.measure_round(first, second, mode == "duet", number))
            elapsed = time.perf_counter() - started
            print(f"  cycle {cycle + 1}/{args.cycles}, {mode}: t={elapsed:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
    rows = {mode: pairing_row(length, rounds) for mode, rounds in by_mode.items()}
    print("\n| mode | rounds | s per round | B/A (median) | round ratio's sd | se after 1 min |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode, r in rows.items():
        print(f"| {mode} | {r['rounds']} | {r['round_wall_s']:.2f} | {r['median_ratio']:.3f} "
              f"| {r['ratio_sd']:.1%} | {r['se_after_minute']:.2%} |")  # fmt: skip
    summary = {
        "workload": args.workload,
        "a": a.summary(),
        "b": b.summary(),
        "run_length_s": length,
        "machine": f"{platform.device_name}, {platform.cpu_count} cores, torch "
        f"{platform.torch_version}",
        "rows": rows,
        "duet_against_sequential": duets.summary_of(rows),
        "per_round": by_mode,
    }
    write_json(args.out, summary, indent=1)
    print(f"results: {args.out}")


def main() -> None:
    from autotune.bench.landscape import Landscape
    from autotune.bench.live import WORKLOADS, Live
    from autotune.config import TrainConfig
    from autotune.runner.platform import detect_platform
    from autotune.runner.request import TrialOptions
    from autotune.runner.workload import WorkloadSpec

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="mlp", choices=["mlp", "convnet", "gpt"])
    parser.add_argument("--lengths", default="0.5,1,2,4", help="Run lengths, seconds.")
    parser.add_argument("--cycles", type=int, default=6, help="Blocks per run length.")
    parser.add_argument("--rounds", type=int, default=4, help="Rounds per block.")
    parser.add_argument("--min-steps", type=int, default=3)
    parser.add_argument("--landscapes", default="results/landscapes")
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--duet",
        action="store_true",
        help="Duet benchmarking instead: A and B at the same time on cores 0 and 1, against "
        "one after the other on core 0, at the first of --lengths (results/race_duet.json).",
    )
    args = parser.parse_args()
    args.out = args.out or ("results/race_duet.json" if args.duet else "results/race_pairing.json")
    try:
        lengths = [float(x) for x in args.lengths.split(",")]
    except ValueError:
        parser.error(f"--lengths {args.lengths!r}: expected seconds separated by commas")
    if not lengths or min(lengths) <= 0:
        parser.error(f"--lengths {args.lengths!r}: every length must be above 0")
    if args.cycles * args.rounds < 3:
        parser.error("--cycles x --rounds must be at least 3: a spread needs three rounds")

    landscape = Landscape.load(Path(args.landscapes) / f"{args.workload}.json")
    fitting = sorted(
        (p for p in landscape.points if landscape.feasible(p)),
        key=lambda p: p.value or 0.0,
        reverse=True,
    )
    a, b = fitting[0].config, fitting[1].config
    model, _ = WORKLOADS["cpu"][args.workload]
    spec = WorkloadSpec(model=model, search_path=(os.getcwd(),))
    platform = detect_platform("cpu")
    if args.duet:
        duet(args, a, b, spec, lengths[0], platform)
        return
    live = Live(platform, spec, args, None)  # the benchmark's executor, as its grid runs

    def run(config: TrainConfig, length: float) -> float:
        options = TrialOptions(
            warmup_steps=3,
            measured_steps=args.min_steps,
            min_measure_s=length,
            max_measure_s=length,
            timeout_s=120.0,
        )
        measured, run = live.run(config, options=options)
        if measured.status != "ok" or not measured.samples_per_s:
            raise SystemExit(f"{config.summary()}: {measured.status} {run.message}")
        return math.log(measured.samples_per_s)

    print(f"{args.workload}: A = {a.summary()} ({fitting[0].value:.1f} samples/s in the grid)")
    print(f"{' ' * len(args.workload)}  B = {b.summary()} ({fitting[1].value:.1f})")
    run(a, lengths[0])  # the gang's first trial is a cold one
    by_length: dict[float, list[dict[str, float]]] = {length: [] for length in lengths}
    started = time.perf_counter()
    for cycle in range(args.cycles):
        order = lengths[cycle % len(lengths) :] + lengths[: cycle % len(lengths)]
        for length in order:
            for _ in range(args.rounds):
                first_a = len(by_length[length]) % 2 == 0  # A B, then B A
                began = time.perf_counter()
                if first_a:
                    log_a = run(a, length)
                    log_b = run(b, length)
                else:
                    log_b = run(b, length)
                    log_a = run(a, length)
                wall = time.perf_counter() - began
                by_length[length].append(
                    {
                        "log_a": log_a,
                        "log_b": log_b,
                        "log_ratio": log_b - log_a,
                        "wall_s": wall,
                        "a_first": first_a,
                    }
                )
            print(
                f"  cycle {cycle + 1}/{args.cycles}, runs of {length:g} s: "
                f"t={time.perf_counter() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    live.close()

    rows = [pairing_row(length, by_length[length]) for length in lengths]
    print(
        "\n| run length | rounds | s per round | B/A (median) | one run's sd | round ratio's sd "
        "| pairing removed | se of the ratio after 1 min | second run's edge |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for r in rows:
        print(
            f"| {r['run_length_s']:g} s | {r['rounds']} | {r['round_wall_s']:.2f} "
            f"| {r['median_ratio']:.3f} | {r['run_sd']:.1%} | {r['ratio_sd']:.1%} "
            f"| {r['paired_share']:.0%} | {r['se_after_minute']:.2%} "
            f"| {r['second_run_edge']:.3f}x |"
        )
    summary = {
        "workload": args.workload,
        "a": a.summary(),
        "b": b.summary(),
        "machine": f"{platform.device_name}, {platform.cpu_count} cores, torch "
        f"{platform.torch_version}",
        "min_steps": args.min_steps,
        "rows": rows,
        "per_round": {str(length): by_length[length] for length in lengths},
    }
    write_json(args.out, summary, indent=1)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
