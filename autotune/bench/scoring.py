"""Scoring a live benchmark run: each method's row against the grid, and the targets."""

from __future__ import annotations

from typing import Any

from autotune.bench.landscape import Landscape, Measured
from autotune.bench.live import TARGET_ERROR, TARGET_RATIO, TARGET_WALL_SHARE, Method


def summarise(method: Method, landscape: Landscape, grid: Method) -> dict[str, Any]:
    measured = sum(m.measured_s for m in method.trials)
    point = landscape.lookup(method.pick) if method.pick else None
    return {
        "pick": method.pick.summary() if method.pick else None,
        "pick_config": method.pick.model_dump(mode="json") if method.pick else None,
        "own_samples_per_s": method.pick_samples_per_s,
        "grid_samples_per_s": point.value if point else None,
        "ratio_to_optimum": landscape.ratio(method.pick),
        "fits_budget": bool(point and landscape.feasible(point)),
        "trials": len(method.trials),
        "trial_share": len(method.trials) / len(grid.trials),
        "wall_s": method.wall_s,
        "wall_share": method.wall_s / grid.wall_s,
        "measured_share": measured / method.wall_s if method.wall_s else 0.0,
        "best_so_far": best_so_far(method.trials),
        **method.extra,
    }


def best_so_far(trials: list[Measured]) -> list[tuple[float, float]]:
    curve, best = [], 0.0
    for m in sorted(trials, key=lambda m: m.elapsed_s):
        if m.fits and (m.samples_per_s or 0.0) > best:
            best = m.samples_per_s or 0.0
            curve.append((round(m.elapsed_s, 2), best))
    return curve


def targets(rows: dict[str, dict[str, Any]], fidelity: dict[str, Any]) -> dict[str, bool]:
    tuned = rows["autotune"]
    rules = [r for r in ("bs-finder", "deepspeed", "recipe") if r in rows]
    heuristic = max(rows[r]["ratio_to_optimum"] for r in rules)
    return {
        "ratio_at_least_0.97_and_fits": tuned["ratio_to_optimum"] >= TARGET_RATIO
        and tuned["fits_budget"],
        "wall_at_most_15pct": tuned["wall_share"] <= TARGET_WALL_SHARE,
        "at_least_random_same_wall": tuned["ratio_to_optimum"]
        >= rows["random"]["ratio_to_optimum"],
        "at_least_best_heuristic": tuned["ratio_to_optimum"] >= heuristic,
        "estimate_within_5pct": fidelity["error"] is not None
        and abs(fidelity["error"]) <= TARGET_ERROR,
        "no_oom_in_verification": tuned.get("verification_status") != "oom"
        and fidelity["status"] != "oom"
        and bool(fidelity["fits"]),
    }
