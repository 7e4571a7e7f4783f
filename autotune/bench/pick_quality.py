"""How often the search picks a configuration within 3% of the optimum, on recorded landscapes
where the truth is known, at a chosen run-to-run noise: the tuner with its default budget
against the standard recipe by hand and random search given as many trial runs as the tuner
spent (its race and verification included).

Replay draws each run around the landscape's value (``autotune.bench.replay``); ``noise`` is the
coefficient of variation of one run (0.02: an H100's race runs, 257.5-268.9 samples/s for one
configuration), or None for the landscape's recorded noise (10-13% on the 2-core CPU box).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from autotune.bench.landscape import Landscape
from autotune.bench.live import TARGET_RATIO
from autotune.bench.replay import replay_random, replay_recipe, replay_tuner

GPU_NOISE = 0.02
NOISE_LEVELS = (0.02, 0.05, 0.10, 0.20)
DEFAULT_TRIALS = 20
"""The tool's default trial budget (``--trials``)."""


@dataclass(frozen=True)
class Seed:
    """One seed's outcome: each strategy's pick, as a share of the optimum's true value."""

    tuner: float
    recipe: float
    random: float
    finishing_runs: int
    told_apart: bool | None


def judge_seed(landscape: Landscape, seed: int, trials: int, noise: float | None) -> Seed:
    """The tuner, the recipe and random search on ``landscape`` with ``seed``."""
    tuned = replay_tuner(landscape, seed, trials, noise=noise)
    by_hand = replay_recipe(landscape, seed, noise=noise)
    spent = len(tuned.measured) + tuned.finishing_runs  # random gets as many runs
    randomly = replay_random(landscape, seed, spent, noise=noise)
    return Seed(
        tuner=landscape.ratio(tuned.pick),
        recipe=landscape.ratio(by_hand.pick),
        random=landscape.ratio(randomly.pick),
        finishing_runs=tuned.finishing_runs,
        told_apart=tuned.told_apart,
    )


def judge(
    landscape: Landscape, seeds: int, trials: int = DEFAULT_TRIALS, noise: float | None = None
) -> dict[str, Any]:
    """The row of one landscape at one noise: picks at least ``TARGET_RATIO`` of the optimum,
    how the tuner's true value compares with the recipe's and random search's, and what the
    race cost."""
    rows = [judge_seed(landscape, seed, trials, noise) for seed in range(seeds)]
    tuner = [r.tuner for r in rows]
    misses = [r for r in rows if r.tuner < TARGET_RATIO]
    return {
        "noise": noise if noise is not None else "recorded",
        "recorded_noise": landscape.run_noise,
        "trials": trials,
        "seeds": seeds,
        "at_least_0.97": sum(t >= TARGET_RATIO for t in tuner),
        "tuner_median": statistics.median(tuner),
        "tuner_worst": min(tuner),
        "recipe_median": statistics.median(r.recipe for r in rows),
        "random_median": statistics.median(r.random for r in rows),
        "tuner_at_least_recipe": sum(r.tuner >= r.recipe for r in rows),
        "tuner_at_least_random": sum(r.tuner >= r.random for r in rows),
        "finishing_runs_median": statistics.median(r.finishing_runs for r in rows),
        # where picks are lost: a miss the recommendation called too close, or one it did not
        "misses_said_too_close": sum(r.told_apart is False for r in misses),
        "misses_worst": min((r.tuner for r in misses), default=None),
        "per_seed": [r.__dict__ for r in rows],
    }
