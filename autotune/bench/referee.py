"""The referees of a live benchmark run: the fidelity run (the tuner's estimate against one run
many times longer) and the paired judge (every method's pick against the optimum in
interleaved rounds). A grid value measured once is one noisy run; these say how far off it is.
"""

from __future__ import annotations

from typing import Any

from autotune.bench.landscape import Landscape
from autotune.bench.live import Live
from autotune.config import TrainConfig
from autotune.result import Platform
from autotune.runner.workload import WorkloadSpec
from autotune.search.race import rotated
from autotune.stats import ratio_interval

JUDGE_ROUNDS = 5
"""The paired check of the picks: the optimum and every method's pick, this many interleaved
rounds, each pick's mean log ratio to the optimum with its 95% interval."""


def run_fidelity(platform: Platform, spec: WorkloadSpec, args: Any, landscape: Landscape,
                 pick: TrainConfig, estimate: float,
                 interval: list[float] | None) -> dict[str, Any]:  # fmt: skip
    """The pick's estimate (the mean of its race runs, each the window's floor) against one run
    ``--fidelity-factor`` times the floor, on a gang warmed by an ordinary run first: the two
    differ in length only; and whether the long run lies inside the estimate's 95% interval
    (``interval``, as the recommendation reports it; None: it had none). (Until 2026-11-23 the
    long run was the first trial of a fresh Ray instance and had an adaptive window, which
    stays open longer while steps are noisy, and on this machine noisy stretches are slow
    ones: 8 of 9 errors were positive.)"""
    live = Live(platform, spec, args, landscape.memory_limit_bytes)
    warm, _ = live.run(pick)
    long, run = live.run(pick, longer=args.fidelity_factor, floor=True)
    live.close()
    error = estimate / long.samples_per_s - 1 if long.samples_per_s else None
    return {
        "config": pick.summary(),
        "warm_run_samples_per_s": warm.samples_per_s,
        "steps": run.measured_steps,
        "measured_s": run.measured_s,
        "factor": args.fidelity_factor,
        "estimate_samples_per_s": estimate,
        "long_run_samples_per_s": long.samples_per_s,
        "status": long.status,
        "error": error,
        "estimate_interval": interval,
        "long_run_in_interval": (
            interval[0] <= long.samples_per_s <= interval[1]
            if interval and long.samples_per_s
            else None
        ),
        "peak_memory_bytes": long.memory_used_bytes,
        "memory_limit_bytes": landscape.memory_limit_bytes,
        "fits": long.fits,
    }


def run_judge(platform: Platform, spec: WorkloadSpec, args: Any, landscape: Landscape,
              picks: dict[str, TrainConfig | None]) -> dict[str, Any]:  # fmt: skip
    """Every method's pick against the optimum, paired: ``JUDGE_ROUNDS`` interleaved rounds
    (the order rotating), each pick's geometric-mean ratio to the optimum with a 95% interval.
    A grid value of a point measured once is one run, with this machine's run-to-run noise;
    this says how far the picks really are from the optimum and how sure that is."""
    import math

    optimum = landscape.optimum().config
    configs = [optimum]
    for config in picks.values():
        if config is not None and landscape.ratio(config) > 0 and config not in configs:
            configs.append(config)
    live = Live(platform, spec, args, landscape.memory_limit_bytes)
    speeds: dict[str, list[float | None]] = {c.key(): [] for c in configs}
    for number in range(1, JUDGE_ROUNDS + 1):
        for config in rotated(configs, number):
            measured = live.measure(config)
            speeds[config.key()].append(measured.samples_per_s if measured.fits else None)
    wall_s = live.close()
    best = speeds[optimum.key()]
    judged: dict[str, Any] = {
        "rounds": JUDGE_ROUNDS,
        "wall_s": wall_s,
        "optimum_runs": best,
        "methods": {},
    }
    for method, config in picks.items():
        if config is None or config.key() not in speeds:
            continue
        own = speeds[config.key()]
        ratios = [math.log(b / a) for a, b in zip(best, own, strict=True) if a and b]
        row: dict[str, Any] = {"pick": config.summary(), "runs": own}
        paired = ratio_interval(ratios)
        if paired is not None:
            row.update(ratio=paired[0], low=paired[1], high=paired[2])
        judged["methods"][method] = row
    return judged
