"""One workload of the search-quality benchmark, every method on it: the grid (saved as a
landscape), the tuner, random search in the tuner's wall time, the rules of thumb, the fidelity
run and the paired judge (``scripts/bench_search_quality.py`` is the command)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from autotune.bench.live import (
    progress,
    run_autotune,
    run_grid,
    run_heuristic,
    run_random,
)
from autotune.bench.referee import run_fidelity, run_judge
from autotune.bench.scoring import summarise, targets
from autotune.result import Platform
from autotune.runner.workload import WorkloadSpec
from autotune.search.model_facts import repeated_blocks
from autotune.search.probe import restrict_space
from autotune.search.space import enumerate_configs, load_space


def benchmark_workload(
    name: str, model: str, gbs: int, platform: Platform, args: Any, machine: str
) -> dict[str, Any]:
    """Every method on one workload: the grid (saved as a landscape under ``args.landscapes``),
    the tuner, random search in the tuner's wall time, the rules of thumb, the fidelity run
    and the paired judge; the workload's result, its rows and targets included."""

    device = platform.device_type
    spec = WorkloadSpec(model=model, search_path=(os.getcwd(),))
    blocks = repeated_blocks(spec)
    started = time.perf_counter()  # the probe's hook checks: once per machine, then cached
    space, _ = restrict_space(
        load_space(args.space), platform, args.devices_used, blocks[0] if blocks else None
    )
    probe_s = time.perf_counter() - started
    configs = enumerate_configs(space, {"global_batch_size": gbs, "device": device})
    budget = len(configs) // 4
    landscape, grid = run_grid(platform, spec, args, space, configs)
    landscape.save(Path(args.landscapes) / f"{name}.json")
    optimum = landscape.optimum()
    progress(f"grid done in {grid.wall_s:.0f} s; optimum {optimum.config.summary()}")
    methods = {"grid": grid}
    methods["autotune"] = run_autotune(spec, args, landscape, budget)
    progress(f"autotune done in {methods['autotune'].wall_s:.0f} s")
    methods["random"] = run_random(platform, spec, args, landscape, methods["autotune"].wall_s)
    for heuristic in ("bs-finder", "deepspeed", "recipe"):
        methods[heuristic] = run_heuristic(heuristic, platform, spec, args, landscape)
    tuned = methods["autotune"]
    assert tuned.pick is not None
    fidelity = run_fidelity(
        platform, spec, args, landscape, tuned.pick, tuned.pick_samples_per_s or 0.0,
        tuned.extra.get("estimate_interval"),
    )  # fmt: skip
    picks = {k: m.pick for k, m in methods.items() if k != "grid"}
    judged = run_judge(platform, spec, args, landscape, picks)
    rows = {k: summarise(m, landscape, grid) for k, m in methods.items()}
    return {
        "model": model,
        "machine": machine,
        "global_batch_size": gbs,
        "grid": {
            "configs": len(configs),
            "trial_budget": budget,
            "optimum": optimum.config.summary(),
            "optimum_samples_per_s": optimum.value,
            "memory_limit_bytes": landscape.memory_limit_bytes,
            "memory_limit_rule": "widest gap between 20% and 90% of the grid's peaks",
            "infeasible": sum(not landscape.feasible(p) for p in landscape.points),
            "oracle_remeasure_s": grid.extra["oracle_remeasure_s"],
        },
        "probe_s": probe_s,
        "methods": rows,
        "fidelity": fidelity,
        "judge": judged,
        "targets": targets(rows, fidelity),
    }


def plot(results: dict[str, Any], path: Path) -> bool:
    """Best feasible samples/s so far against wall time, a panel per workload (matplotlib, the
    ``bench`` extra); False, said on stderr, without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib is missing: no plot (pip install -e ".[bench]")', file=sys.stderr)
        return False
    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        result = results[name]
        for method, row in result["methods"].items():
            curve = row["best_so_far"]
            if not curve:
                continue
            xs = [x for x, _ in curve] + [row["wall_s"]]
            ys = [y for _, y in curve] + [curve[-1][1]]
            ax.step(xs, ys, where="post", label=method, linewidth=2 if method == "autotune" else 1)
        ax.axhline(result["grid"]["optimum_samples_per_s"], color="grey", linestyle=":", lw=1)
        ax.set_xscale("log")
        ax.set_title(f"{name} ({result['model'].split(':')[-1]})")
        ax.set_xlabel("wall time (s, log)")
        ax.set_ylabel("best feasible samples/s so far")
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Best-so-far against wall time on {results[names[0]]['machine']}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return True
