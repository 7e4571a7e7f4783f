"""The machine's own drift: how much a fixed computation's speed moves, with no tool involved.

    python scripts/bench_machine_noise.py                  # 300 s of 1-s windows
    python scripts/bench_machine_noise.py --seconds 600 --threads 1
    python scripts/bench_machine_noise.py --series results/machine_noise.json --wait 60

One process multiplies the same two matrices for --seconds, counting multiplications per
1-s window (a race run's floor). Nothing of autotune runs: what this measures is the floor under
every number the benchmark reports on this machine. Printed and written to
results/machine_noise.json:

  scale     the coefficient of variation of the mean speed over windows of 1, 5, 20 and 60 s
            (independent 1-s windows would shrink it by the square root of the window count;
            slow and fast stretches keep it up);
  lag-1     the autocorrelation of neighbouring 1-s windows;
  fidelity  the benchmark's fidelity check replayed on this series: an estimate from --runs
            1-s windows --gap s apart (the race runs of the pick), against a --long s window
            starting --wait s after the last of them (the 20x run after the search ends); the
            median and 90th percentile of |error| over every start, and the share within 5%;
  referee   the same for a perfect estimate, the mean of the whole series: how often a single
            --long s run lies within 5% of it. Below 100%, the long run is itself a draw.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from autotune.bench.noise import (
    summarize,
    window_speeds,
)
from autotune.bench.output import write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=300)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--runs", type=int, default=4, help="Race runs behind an estimate.")
    parser.add_argument("--gap", type=int, default=6, help="Seconds between them.")
    parser.add_argument("--wait", type=int, default=30, help="Seconds until the long run.")
    parser.add_argument("--long", type=int, default=20, help="Seconds of the long run.")
    parser.add_argument(
        "--series", help="Analyse the windows saved in this output instead of measuring."
    )
    parser.add_argument("--out", default="results/machine_noise.json")
    args = parser.parse_args()
    saved = json.loads(Path(args.series).read_text()) if args.series else None
    seconds = len(saved["per_window"]) if saved else args.seconds
    if seconds < (args.runs - 1) * args.gap + args.wait + args.long:
        parser.error(f"--seconds {seconds}: shorter than one fidelity check's span")

    import torch

    from autotune.runner.platform import detect_platform

    host = detect_platform("cpu")
    machine = f"{host.device_name}, {host.cpu_count} cores"
    if saved:
        machine, series, args.threads = saved["machine"], saved["per_window"], saved["threads"]
        print(f"{len(series)} windows of 1 s from {args.series}, {args.threads} thread(s)")
    else:
        print(f"{seconds} windows of 1 s, {args.threads} thread(s), torch {torch.__version__}")
        series = window_speeds(seconds, args.threads)
    summary = summarize(series, args)
    print(f"{'window':>8}{'CV':>8}{'if independent':>16}")
    one = summary["cv_by_window_s"]["1"]
    for width, cv in summary["cv_by_window_s"].items():
        alone = f"{one / int(width) ** 0.5:.1%}" if one else "-"
        print(f"{width + ' s':>8}{(f'{cv:.1%}' if cv is not None else '-'):>8}{alone:>16}")
    f = summary["fidelity"]
    print(f"lag-1 autocorrelation of 1-s windows: {summary['lag1_autocorrelation']:.2f}")
    print(
        f"fidelity check on the machine alone ({f['runs']} 1-s runs {f['gap_s']} s apart vs a "
        f"{f['long_s']} s run {f['wait_s']} s later, {f['starts']} starts): median |error| "
        f"{f['median_abs_error']:.1%}, 90th percentile {f['p90_abs_error']:.1%}, "
        f"within 5%: {f['share_within_5pct']:.0%}"
    )
    r = summary["referee"]
    print(
        f"referee: the whole series' mean against one {r['long_s']} s run: median |error| "
        f"{r['median_abs_error']:.1%}, 90th percentile {r['p90_abs_error']:.1%}, within 5%: "
        f"{r['share_within_5pct']:.0%}"
    )
    out = {
        "machine": machine,
        "torch": saved["torch"] if saved else torch.__version__,
        "threads": args.threads,
        **summary,
        "per_window": series,
    }
    write_json(args.out, out, indent=1)
    print(f"results: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
