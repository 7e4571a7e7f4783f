"""What a measured throughput means on a device: model FLOPs a sample, tokens a sample, and a
study's race read back from its database (for a search cut before its recommendation).

The FLOPs of one training sample (forward and backward, a batch of one from the workload's own
dataset) are counted on the CPU with ``torch.utils.flop_counter``, which counts matrix products
and attention, the work a device's peak figure is quoted for. Utilisation is that count times a
measured throughput over the peak the caller gives (a datasheet figure): a ratio of a count, a
measurement and a datasheet number, not a measurement of the device's own ceiling.
"""

from __future__ import annotations

import statistics
from typing import Any

from autotune.config import TrainConfig
from autotune.runner.workload import WorkloadSpec, build_workload
from autotune.search import race
from autotune.search.log import stored_records
from autotune.search.tuner import RECIPE_ATTR


def flops_per_sample(model_ref: str) -> int:
    """Counted FLOPs of one training sample of ``model_ref``'s workload."""
    from torch.utils.data import default_collate
    from torch.utils.flop_counter import FlopCounterMode

    from autotune.runner.training import split_batch  # imports torch

    workload = build_workload(WorkloadSpec(model=model_ref))
    args, kwargs, target = split_batch(default_collate([workload.dataset[0]]))
    counter = FlopCounterMode(display=False)
    with counter:
        loss = workload.loss(workload.model(*args, **kwargs), target)
        loss.backward()
    return int(counter.get_total_flops())


def tokens_per_sample(model_ref: str) -> int | None:
    """The length of the dataset's first sample's ``input_ids``; None where it has none."""
    sample = build_workload(WorkloadSpec(model=model_ref)).dataset[0]
    ids = sample.get("input_ids") if isinstance(sample, dict) else None
    return int(ids.numel()) if ids is not None else None


def race_summary(storage: str, model: str, peak_tflops: float) -> dict[str, Any]:
    """Each raced configuration of the one study in ``storage``: its race runs' throughput,
    its speed-up over the baseline and over the standard recipe from the paired rounds (the
    race's own functions of the stored records, nothing run again), peaks, tokens per second
    and utilisation of ``peak_tflops``."""
    import optuna

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
        key = config.key()
        rows.append(
            {
                "config": config.summary(),
                "role": "baseline"
                if key == base.key()
                else ("recipe" if key == recipe_key else "finalist"),
                "rounds": sorted(runs),
                "samples_per_s": speeds,
                "mean_samples_per_s": mean,
                "speedup_over_baseline": race.speedup(records, config, base),
                "speedup_over_recipe": race.speedup(records, config, recipe)
                if recipe is not None and key != recipe_key
                else None,
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
