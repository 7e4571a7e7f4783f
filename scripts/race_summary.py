"""A study's race, read from its database: each raced configuration's mean throughput, its
speed-up over the baseline and over the standard recipe from the paired rounds (95% interval),
tokens per second and model FLOPs utilisation.

    python scripts/race_summary.py STUDY.db --model examples/hf_models.py:gpt2_small_1k \\
        --peak-tflops 989.4 [--out FILE]

For a search cut before its recommendation (a lent GPU's minutes ran out in the race): the
rounds that ran are stored, and this reads them as the search's own race would (the same pure
functions of the records), without running anything. The FLOPs of one training sample are
counted on this machine's CPU (``scripts/model_flops.py``); tokens per sample are the length of
the dataset's first sample's ``input_ids``, where it has them. The peak is the device's dense
bf16 datasheet figure, given by the caller: the utilisation is a ratio of a count, a
measurement and a datasheet number.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def tokens_per_sample(model_ref: str) -> int | None:
    from autotune.runner.workload import WorkloadSpec, build_workload

    sample = build_workload(WorkloadSpec(model=model_ref)).dataset[0]
    ids = sample.get("input_ids") if isinstance(sample, dict) else None
    return int(ids.numel()) if ids is not None else None


def summary(storage: str, model: str, peak_tflops: float) -> dict[str, Any]:
    import optuna
    from model_flops import flops_per_sample

    from autotune.config import TrainConfig
    from autotune.search import race
    from autotune.search.log import stored_records
    from autotune.search.tuner import RECIPE_ATTR

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage if "://" in storage else f"sqlite:///{storage}"
    (name,) = optuna.get_all_study_names(url)
    study = optuna.load_study(study_name=name, storage=url)
    records = stored_records(study)
    base = next(r.config for r in records if r.role == "baseline" and r.fits and r.config)
    stored = study.user_attrs.get(RECIPE_ATTR)  # the standard recipe, as the search measured it
    recipe = TrainConfig.model_validate(stored) if stored else None
    recipe_key = recipe.key() if recipe is not None else None
    flops, tokens = flops_per_sample(model), tokens_per_sample(model)
    rows = []
    for config in race.raced(records):
        runs = race.race_runs(records, config)
        speeds = [r.samples_per_s for r in runs.values() if r.fits and r.samples_per_s]
        mean = statistics.fmean(speeds)
        over_base = race.speedup(records, config, base)
        over_recipe = race.speedup(records, config, recipe) if recipe is not None else None
        rows.append(
            {
                "config": config.summary(),
                "role": "baseline"
                if config.key() == base.key()
                else ("recipe" if config.key() == recipe_key else "finalist"),
                "rounds": sorted(runs),
                "samples_per_s": speeds,
                "mean_samples_per_s": mean,
                "speedup_over_baseline": over_base,
                "speedup_over_recipe": over_recipe if config.key() != recipe_key else None,
                "peak_bytes": max(r.memory_used_bytes or 0 for r in runs.values()),
                "allocated_bytes": max((r.allocated_bytes or 0 for r in runs.values()), default=0)
                or None,  # CUDA, stored since 2026-11-26
                "predicted_bytes": [r.predicted_memory_bytes for r in runs.values()],
                "tokens_per_s": mean * tokens if tokens else None,
                "model_tflops": flops * mean / 1e12,
                "mfu": flops * mean / 1e12 / peak_tflops,
            }
        )
    return {
        "study": name,
        "storage": storage,
        "model": model,
        "flops_per_sample": flops,
        "tokens_per_sample": tokens,
        "peak_tflops": peak_tflops,
        "rows": rows,
    }


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
    out = summary(args.storage, args.model, args.peak_tflops)
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
        Path(args.out).write_text(json.dumps(out, indent=2, default=_json) + "\n")
        print(f"written: {args.out}")


def _json(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(type(value).__name__)


if __name__ == "__main__":
    main()
