"""The pruning benchmark's table: what a hopeless trial cost once pruned, in baseline trials
(``scripts/bench_pruning.py`` runs the cases; ``workloads.hopeless`` is the hopeless model)."""

from __future__ import annotations

import statistics
from typing import Any

TARGET_BASELINE_TRIALS = 2.0
TARGET_SLOWDOWN = 100.0


def summarise(case: str, runs: dict[str, list[dict[str, Any]]], judged: bool) -> dict[str, Any]:
    """One row of the table from a case's runs (each: status, samples_per_s, measured_steps,
    measured_s, wall_s); ``judged``: whether the target is about this case. It is judged only
    where the measured slowdown is at least ``TARGET_SLOWDOWN``: a milder one proves less."""
    base = runs["baseline"]
    base_wall = statistics.median(r["wall_s"] for r in base)
    base_speed = statistics.median(r["samples_per_s"] for r in base)
    base_step = statistics.median(r["measured_s"] / r["measured_steps"] for r in base)
    (pruned,) = runs["pruned"]
    (unpruned,) = runs["unpruned"]
    (after,) = runs["after"]
    slowdown = base_speed / unpruned["samples_per_s"] if unpruned["samples_per_s"] else None
    restart = max(0.0, after["overhead_s"] - statistics.median(r["overhead_s"] for r in base))
    cost = (pruned["wall_s"] + restart) / base_wall
    if judged and (slowdown is None or slowdown < TARGET_SLOWDOWN):
        judged, target = False, f"not judged: slower by under {TARGET_SLOWDOWN:g}x"
    else:
        target = f"<= {TARGET_BASELINE_TRIALS:g} baseline trials" if judged else "not judged"
    return {
        "case": case,
        "baseline_step_s": base_step,
        "baseline_wall_s": base_wall,
        "baseline_samples_per_s": base_speed,
        "slowdown": slowdown,
        "pruned_status": pruned["status"],
        "pruned_steps": pruned["measured_steps"],
        "pruned_wall_s": pruned["wall_s"],
        "restart_charged_s": restart,
        "pruned_cost_in_baseline_trials": cost,
        "unpruned_wall_s": unpruned["wall_s"],
        "target": target,
        "met": (pruned["status"] == "pruned" and cost <= TARGET_BASELINE_TRIALS)
        if judged
        else None,
        "runs": runs,
    }
