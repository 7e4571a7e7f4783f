"""Model FLOPs utilisation of a recommendation: counted FLOPs per sample x measured samples/s.

    python scripts/model_flops.py RECOMMENDATION.json --peak-tflops 989.4 [--out FILE]

RECOMMENDATION.json is what ``autotune search --json`` printed. The FLOPs of one training
sample (forward and backward, batch of one from the workload's own dataset) are counted on the
CPU with torch.utils.flop_counter, which counts matrix products and attention, the work the
peak figure is quoted for; the throughput is the recommendation's measured one, with its
interval. The peak is the device's dense bf16/fp16 figure, given by the caller (the H100 SXM
datasheet: 989.4 TFLOP/s), so the utilisation is a ratio of a count, a measurement and a
datasheet number, not a measurement of the device's own ceiling.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune.bench.output import write_json
from autotune.bench.throughput import flops_per_sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recommendation")
    parser.add_argument("--peak-tflops", type=float, required=True)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    rec = json.loads(Path(args.recommendation).read_text())
    flops = flops_per_sample(rec["model"])
    rows = []
    for label, speed in (
        ("measured", rec["samples_per_s"]),
        ("interval low", rec["samples_per_s_low"]),
        ("interval high", rec["samples_per_s_high"]),
    ):
        tflops = flops * speed / 1e12
        rows.append(
            {
                "throughput": label,
                "samples_per_s": speed,
                "model_tflops": tflops,
                "mfu": tflops / args.peak_tflops,
            }
        )
    out = {
        "model": rec["model"],
        "device": rec["platform"]["device_name"],
        "config": rec["config"],
        "flops_per_sample": flops,
        "peak_tflops": args.peak_tflops,
        "rows": rows,
    }
    print(f"{rec['model']} on {out['device']}: {flops / 1e9:,.1f} GFLOP per sample (counted)")
    print(f"{'throughput':<14}{'samples/s':>11}{'TFLOP/s':>10}{'MFU':>8}")
    for row in rows:
        print(
            f"{row['throughput']:<14}{row['samples_per_s']:>11.1f}"
            f"{row['model_tflops']:>10.1f}{row['mfu']:>8.1%}"
        )
    if args.out:
        write_json(args.out, out, indent=2)
        print(f"written: {args.out}")


if __name__ == "__main__":
    main()
