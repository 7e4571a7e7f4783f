"""How well the memory model, calibrated on a stored search's own trials, explains each of them:
every trial that ran predicted from the others (leave one out), as the search takes its margin.

    python scripts/bench_study_memory.py --storage autotune.db --study NAME --model MOD:ATTR \
        [--data MOD:ATTR] [--device cpu] [--out results/study_memory.json]

Run it from the directory the search ran in (its model's module must import). Each trial's
configuration is traced again under fake tensors (nothing runs); the table gives, per trial,
the measured peak per device, the prediction from all other trials and its error, and the
calibration's parts. ``--without-compile`` fits as the model did before it learnt what compiling
adds (one fit over compiled and eager trials), for comparison.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from autotune.bench.memory_prediction import machine
from autotune.bench.output import write_json
from autotune.runner.workload import WorkloadSpec
from autotune.search.calibration import fit, prior_for
from autotune.search.driver import load_recommendation
from autotune.search.memory_model import MemoryModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", required=True)
    parser.add_argument("--study", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--without-compile", action="store_true")
    parser.add_argument("--out", default="results/study_memory.json")
    args = parser.parse_args()

    sys.path.insert(0, ".")  # the search's directory, where its model's module lies
    spec = WorkloadSpec(model=args.model, data=args.data, search_path=(str(Path.cwd()),))
    model = MemoryModel(spec, args.device, prior_for(args.device, spec))
    trials = load_recommendation(args.storage, args.study).trials
    points, configs = [], []
    for trial in trials:
        point = model.point(trial)
        if point is None or trial.config is None:  # a point has a config: for the type checker
            continue
        points.append(replace(point, compiled=False) if args.without_compile else point)
        configs.append(f"#{trial.number} {trial.config.summary()}")
    calibration = fit(points, model.prior)
    rows = []
    print(f"{'trial':64} {'measured':>9} {'predicted':>9} {'error':>7}")
    for config, point, error in zip(configs, points, calibration.errors, strict=True):
        predicted = point.measured_bytes * (1 - error)
        rows.append({"trial": config, "measured_bytes": point.measured_bytes,
                     "predicted_left_out_bytes": int(predicted), "error": error})  # fmt: skip
        print(
            f"{config[:64]:64} {point.measured_bytes / 2**20:>8,.0f}M "
            f"{predicted / 2**20:>8,.0f}M {error:>+7.1%}"
        )
    within = sum(abs(e) <= 0.10 for e in calibration.errors)
    largest = max((abs(e) for e in calibration.errors), default=0.0)
    print(f"within ±10%: {within} of {len(points)}; largest {largest:.1%}")
    print(calibration.describe())
    report = {
        "machine": machine(),
        "study": args.study,
        "model": args.model,
        "without_compile": args.without_compile,
        "calibration": calibration.describe(),
        "within_10pct": within,
        "trials": len(points),
        "largest_error": largest,
        "rows": rows,
    }
    write_json(args.out, report, indent=1)


if __name__ == "__main__":
    main()
