"""What one DataLoader worker copies of a dataset over an epoch, against what a trial sees.

    python scripts/bench_epoch_copy.py [--samples 1000000] [--out results/epoch_copy.json]

Per dataset of ``autotune.bench.epoch_copy.DATASETS`` (strings, a dict a sample, one tensor):
one worker reads a shuffled epoch while the rank waits; what it holds beside the rank
(``runner.memory.workers_bytes``) after three batches (about what a trial's window reads) and at
most over the epoch, against ``runner.memory.epoch_copy_bytes`` (a forked child touching every
object of the dataset), the figure a recommendation's memory caveat gives.
"""

from __future__ import annotations

import argparse

from autotune.bench.epoch_copy import DATASETS, measured
from autotune.bench.memory_prediction import machine
from autotune.bench.output import write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--out", default="results/epoch_copy.json")
    args = parser.parse_args()
    rows = []
    print(f"{'dataset':10} {'3 batches':>10} {'an epoch':>10} {'measured beside':>16} {'walk':>7}")
    for name in DATASETS:
        row = measured(name, args.samples)
        rows.append(row)
        fields = ("first_batches_bytes", "epoch_bytes", "epoch_copy_bytes")
        mib = {k: row[k] / 2**20 for k in fields}
        print(
            f"{name:10} {mib['first_batches_bytes']:>6,.0f} MiB {mib['epoch_bytes']:>6,.0f} MiB "
            f"{mib['epoch_copy_bytes']:>12,.0f} MiB {row['epoch_copy_s']:>5.1f} s"
            + ("" if row["epoch_copy_whole"] else " (stopped early: a lower bound)")
        )
    report = {"machine": machine(), "samples": args.samples, "rows": rows}
    write_json(args.out, report, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
