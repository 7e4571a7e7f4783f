"""A study's race, read from its database: each raced configuration's mean throughput, its
speed-up over the baseline and over the standard recipe from the paired rounds (95% interval),
tokens per second and model FLOPs utilisation.

    python scripts/race_summary.py STUDY.db --model examples/hf_models.py:gpt2_small_1k \\
        --peak-tflops 989.4 [--out FILE]

For a search cut before its recommendation (a lent GPU's minutes ran out in the race): the
rounds that ran are stored, and this reads them as the search's own race would (the same pure
functions of the records), without running anything (``autotune.bench.throughput``). The
FLOPs of one training sample are counted on this machine's CPU; tokens per sample are the
length of the dataset's first sample's ``input_ids``, where it has them. The peak is the
device's dense bf16 datasheet figure, given by the caller: the utilisation is a ratio of a
count, a measurement and a datasheet number.
"""

from __future__ import annotations

import argparse
from typing import Any

from autotune.bench.output import write_json
from autotune.bench.throughput import race_summary


def _times(interval: Any) -> str:
    if not interval:
        return "-"
    estimate, low, high = interval
    return f"{estimate:.2f}x [{low:.2f}, {high:.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("storage", help="The study's database: a file or an Optuna URL.")
    parser.add_argument("--model", required=True, help="The workload the study searched.")
    parser.add_argument("--peak-tflops", type=float, required=True)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = race_summary(args.storage, args.model, args.peak_tflops)
    print(
        f"{out['study']}: {out['flops_per_sample'] / 1e9:,.1f} GFLOP per sample (counted), "
        f"{out['tokens_per_sample'] or '-'} tokens per sample"
    )
    header = f"{'role':<9}{'rounds':>7}{'samples/s':>11}{'tokens/s':>10}{'MFU':>7}"
    print(f"{header}  {'over baseline':<22}{'over recipe':<22}config")
    for row in out["rows"]:
        tokens = f"{row['tokens_per_s'] / 1e3:,.0f}K" if row["tokens_per_s"] else "-"
        print(
            f"{row['role']:<9}{len(row['rounds']):>7}{row['mean_samples_per_s']:>11.1f}"
            f"{tokens:>10}{row['mfu']:>7.1%}  {_times(row['speedup_over_baseline']):<22}"
            f"{_times(row['speedup_over_recipe']):<22}{row['config']}"
        )
    if args.out:
        write_json(args.out, out, indent=2)
        print(f"written: {args.out}")


if __name__ == "__main__":
    main()
