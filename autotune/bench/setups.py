"""Sampler set-ups compared on recorded landscapes: the real ``Tuner`` replayed with each
(``scripts/bench_search_setup.py`` is the command)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from autotune.bench.landscape import Landscape
from autotune.bench.replay import replay_tuner, trials_to_reach

SHARE, PICK = 0.98, 0.97


def tpe(startup: int) -> Callable[[int], Any]:
    def make(seed: int) -> Any:
        import optuna

        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=startup, multivariate=True, group=True, constant_liar=True
        )

    return make


def random_sampler(seed: int) -> Any:
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


SETUPS: dict[str, tuple[Callable[[int], Any], bool]] = {
    "tpe, 3 start-up": (tpe(3), False),
    "tpe, 5 start-up": (tpe(5), False),
    "tpe, 10 start-up": (tpe(10), False),
    "random": (random_sampler, False),
    "climb, then tpe 5": (tpe(5), True),  # autotune's default
    "climb, then tpe 10": (tpe(10), True),
}


def study(path: str, name: str, seeds: int, budgets: list[int], cap: int | None) -> dict[str, Any]:
    """One set-up on one landscape: trials to 98% and the picks, over ``seeds`` seeds."""
    landscape = Landscape.load(path)
    cap = cap or len(landscape.points) // 4
    sampler, climb = SETUPS[name]
    reach = []
    for seed in range(seeds):
        run = replay_tuner(landscape, seed, cap, finish=False, climb=climb, sampler=sampler(seed))
        reach.append(trials_to_reach(landscape, run.measured, SHARE) or cap + 1)
    row: dict[str, Any] = {
        "trials_to_98_median": statistics.median(reach),
        "trials_to_98_p90": statistics.quantiles(reach, n=10, method="inclusive")[-1],
    }
    for budget in budgets:
        picks = [
            landscape.ratio(
                replay_tuner(landscape, s, budget, climb=climb, sampler=sampler(s)).pick
            )
            for s in range(seeds)
        ]
        row[f"pick_ge_{PICK}_at_{budget}"] = sum(p >= PICK for p in picks)
        row[f"worst_pick_at_{budget}"] = round(min(picks), 3)
    return row
