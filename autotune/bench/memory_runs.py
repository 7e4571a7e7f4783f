"""One configuration's peak measured again and again, and searches under a memory budget.

How far a configuration's measured peak moves when nothing about it changes (``fresh_peaks``:
in fresh rank processes each time), or as a search measures it (``repeated_peaks``: first on a
fresh Ray gang, later after other trials in it; the target: within 5%), and how many trials a
search runs that do not fit where most of its space does not (``memory_bound_search``; the
target: at most one). Each ``*_report`` runs its part of ``scripts/bench_memory_prediction.py``,
prints its lines and returns what the JSON holds.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from autotune.bench.memory_prediction import GRID_OPTIONS, grid, grid_shape
from autotune.config import TrainConfig
from autotune.errors import SearchError
from autotune.records import PREDICTED_NOT_TO_FIT
from autotune.runner.executor import run_to_end
from autotune.runner.launch import run_trial
from autotune.runner.platform import detect_platform
from autotune.runner.request import TrialOptions, TrialRequest
from autotune.runner.workload import WorkloadSpec
from autotune.search.driver import run_search
from autotune.search.log import memory_used, stored_records
from autotune.search.progress import Reporter
from autotune.search.settings import make_settings
from autotune.search.storage import load_stored_study


def memory_bound_search(
    model: str,
    budget: str,
    predict: bool,
    storage: str,
    trials: int = 10,
    seed: int = 0,
    space: str = "quick",
) -> dict[str, Any]:
    """One search of ``model`` over ``space`` under ``budget`` (where most of it does not fit),
    with or without the memory prediction: how many trials ran that did not fit, and the wall
    time."""
    started = time.perf_counter()
    settings = make_settings(
        {
            "global_batch_size": 32,
            "devices": 2,
            "space": space,
            "trials": trials,
            "memory_budget": budget,
            "predict_memory": predict,
            "storage": storage,
            "seed": seed,
            "race_rounds": 2,
        }
    )
    spec = WorkloadSpec(model=model, search_path=(os.getcwd(),))
    try:
        recommendation = run_search(spec, settings, Reporter())
        records, ended = recommendation.trials, None
    except SearchError as error:  # nothing fits: what ran is read back from the study
        recommendation, ended = None, str(error)
        records = stored_records(load_stored_study(storage, None)[0])
    wall = time.perf_counter() - started
    ran = [t for t in records if t.is_measurement]
    return {
        "predict_memory": predict,
        "wall_s": wall,
        "measured": len(ran),
        "ran_and_did_not_fit": sum(not t.fits for t in ran if t.status in ("ok", "oom")),
        "did_not_fit": [
            f"{t.role}: {t.config.summary() if t.config else '?'} (predicted "
            f"{(t.predicted_memory_bytes or 0) / 2**20:,.0f} MiB, measured "
            f"{(t.memory_used_bytes or 0) / 2**20:,.0f} MiB)"
            for t in ran
            if t.status in ("ok", "oom") and not t.fits
        ],
        "skipped_as_predicted": sum(
            t.status == "skipped" and t.message.startswith(PREDICTED_NOT_TO_FIT) for t in records
        ),
        "recommended": recommendation.config.summary() if recommendation else None,
        "samples_per_s": recommendation.samples_per_s if recommendation else None,
        "ended": ended,
        "repeat_spread": repeat_spread(ran),
        "prediction_errors": [t.prediction_error for t in ran if t.prediction_error is not None],
    }


def repeat_spread(records: list[Any]) -> dict[str, float]:
    """Per configuration measured more than once (search, race, verification: first on a fresh
    gang or later in a reused one): (max - min) / first of its measured peaks."""
    peaks: dict[str, list[int]] = {}
    for record in records:
        if record.status == "ok" and record.memory_used_bytes and record.config:
            peaks.setdefault(record.config.summary(), []).append(record.memory_used_bytes)
    return {summary: spread(values) for summary, values in peaks.items() if len(values) > 1}


def spread(values: list[int]) -> float:
    """(max - min) / first: how far a configuration's repeated peaks lie apart, against the
    first measurement (the issue's target: within 5%)."""
    return (max(values) - min(values)) / values[0]


def peak_rows(peaks: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Per configuration: every peak, in the order measured, and their ``spread``."""
    return [
        {
            "config": summary,
            "peaks_bytes": values,
            "spread": spread(values) if len(values) > 1 else None,
        }
        for summary, values in peaks.items()
    ]


REPEATED = (
    {"parallel": "ddp", "world_size": 2},
    {"parallel": "ddp", "world_size": 2, "compile": "default"},
    {"parallel": "ddp", "world_size": 2, "amp": "bf16", "num_workers": 1},
    {"parallel": "single", "world_size": 1, "amp": "bf16", "num_workers": 1},
    {"parallel": "single", "world_size": 1, "checkpoint_segments": 2, "grad_accum_steps": 2},
)
"""The configurations measured again and again by one executor (``repeated_peaks``): fp32 and
bf16, with and without a DataLoader worker (the pair whose repeats spread most before), and a
compiled one, whose ranks keep the compiler resident (``ray_gang.leaves_behind``)."""


WORKER_PAIRS = (
    {"parallel": "single", "world_size": 1, "amp": "bf16", "num_workers": 1},
    {"parallel": "single", "world_size": 1, "amp": "bf16"},
    {"parallel": "single", "world_size": 1, "num_workers": 1},
    {"parallel": "single", "world_size": 1},
)
"""One device with and without a DataLoader worker, bf16 and fp32 (``--repeat-set workers``):
whether a forked worker carries the gang's history into a configuration's repeated peaks."""
COMPILED_VARIANTS = (
    {"parallel": "single", "world_size": 1, "amp": "bf16", "compile": "default"},
    {"parallel": "single", "world_size": 1, "amp": "bf16", "compile": "default",
     "grad_accum_steps": 4},
    {"parallel": "single", "world_size": 1, "amp": "bf16", "compile": "default",
     "checkpoint_segments": 1},
    {"parallel": "single", "world_size": 1, "amp": "bf16", "compile": "default",
     "optimizer_impl": "foreach"},
)  # fmt: skip
"""One device compiled in bf16, four ways that compile other graphs (``--repeat-set
compiled``): a search's climb from a compiled recipe runs such variants one after another in
one gang, and the recipe measured 465 MiB in its search trial, 545 in the race after them."""
COMPILED_WORKER_VARIANTS = tuple({**v, "num_workers": 2} for v in COMPILED_VARIANTS)
"""The same four with two DataLoader workers each, as the search's climb ran them (``--repeat-set
compiled-workers``): whether forked workers carry the gang's compiled history."""
REPEAT_SETS = {
    "default": REPEATED,
    "workers": WORKER_PAIRS,
    "compiled": COMPILED_VARIANTS,
    "compiled-workers": COMPILED_WORKER_VARIANTS,
}


def repeated_peaks(
    model: str, rounds: int, global_batch_size: int = 32, configs_set: str = "default"
) -> list[dict[str, Any]]:
    """Each configuration of ``REPEATED`` (or another of ``REPEAT_SETS``) measured once per
    round, in turn, by one Ray executor as a search's are (a gang started for the first trial
    of its shape and reused after): the first measurement is on a fresh gang, the later ones
    follow other trials in it. Per configuration: every peak and (max - min) / first (the
    issue's target: within 5%)."""
    from autotune.runner.ray_executor import RayExecutor  # imports Ray

    platform = detect_platform("cpu")
    # room for every gang at once (none evicted, so each configuration's later runs share its
    # first's gang): of 2 ranks plain, compiled and autocast; of 1 plain and autocast; 2 CPUs each
    executor = RayExecutor(platform, cpus_per_rank=2, num_cpus=16)
    spec = WorkloadSpec(model=model, search_path=(os.getcwd(),))
    options = TrialOptions(warmup_steps=1, measured_steps=3, target_interval=0, min_measure_s=0)
    sets = REPEAT_SETS[configs_set]
    configs = [TrainConfig(global_batch_size=global_batch_size, **v) for v in sets]
    peaks: dict[str, list[int]] = {c.summary(): [] for c in configs}
    try:
        for _ in range(rounds):
            for config in configs:
                result = run_to_end(
                    executor, TrialRequest(config=config, workload=spec, options=options)
                )
                used = memory_used(result, "cpu")
                if result.status == "ok" and used:
                    peaks[config.summary()].append(used)
    finally:
        executor.shutdown()
    return peak_rows(peaks)


def fresh_peaks(model: str, rounds: int) -> list[dict[str, Any]]:
    """The one-device configurations of ``model``'s fp32 grid without accumulation (with and
    without its checkpointing), each run ``rounds`` times in turn, every run in fresh rank
    processes with the grid's own window: how far one configuration's measured peak moves when
    nothing about it changes, the floor under a prediction's error."""
    batch, segments = grid_shape(model, "cpu")
    configs = [
        c
        for c in grid(batch, segments, amps=("off",))
        if c.parallel == "single" and c.grad_accum_steps == 1 and c.num_workers == 0
    ]
    workload = WorkloadSpec(model=model, search_path=(os.getcwd(),))
    options = TrialOptions(**GRID_OPTIONS, timeout_s=1800.0)
    peaks: dict[str, list[int]] = {c.summary(): [] for c in configs}
    for _ in range(rounds):
        for config in configs:
            used = memory_used(run_trial(config, workload, options), "cpu")
            if used:
                peaks[config.summary()].append(used)
    return peak_rows(peaks)


def search_report(model: str, budget: str, space: str, both: bool) -> dict[str, Any]:
    """``memory_bound_search`` of ``model`` under ``budget`` over ``space``, with the prediction
    and (``both``) first without it, each in a study of its own; its lines printed."""
    runs = []
    for predict in (False, True) if both else (True,):
        with tempfile.TemporaryDirectory() as tmp:
            run = memory_bound_search(model, budget, predict, f"{tmp}/s.db", space=space)
        runs.append(run)
        most = max(run["repeat_spread"].values(), default=0.0)
        print(f"  one configuration's peaks, first and later in a gang: spread <= {most:.1%}")
        print(
            f"search predict_memory={predict}: {run['measured']} trials ran, "
            f"{run['ran_and_did_not_fit']} of them did not fit, "
            f"{run['skipped_as_predicted']} skipped as predicted, {run['wall_s']:.0f} s; "
            + (f"pick {run['recommended']}" if run["recommended"] else run["ended"])
        )
    return {"model": model, "budget": budget, "space": space, "runs": runs}


def repeat_report(model: str, rounds: int, configs_set: str) -> dict[str, Any]:
    """``repeated_peaks`` of ``model``, its lines printed."""
    rows = repeated_peaks(model, rounds, configs_set=configs_set)
    for row in rows:
        print(f"{row['config']:48} peaks {peaks_line(row)} (target 5%)")
    return {"model": model, "rounds": rounds, "set": configs_set, "configs": rows}


def fresh_report(models: list[str], rounds: int) -> dict[str, Any]:
    """``fresh_peaks`` of each of ``models``, its lines printed."""
    report: dict[str, Any] = {"rounds": rounds, "models": {}}
    for model in models:
        rows = report["models"][model] = fresh_peaks(model, rounds)
        for row in rows:
            print(f"{model} {row['config']:44} fresh peaks {peaks_line(row)}")
    return report


def peaks_line(row: dict[str, Any]) -> str:
    """A row of ``peak_rows`` in words: its peaks in MiB and their spread."""
    peaks = ", ".join(f"{p / 2**20:,.0f}" for p in row["peaks_bytes"])
    return f"{peaks} MiB: spread {'-' if row['spread'] is None else format(row['spread'], '.1%')}"
