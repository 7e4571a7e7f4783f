"""Replay at a chosen noise, the standard recipe by hand, and the row the noise benchmark
prints, on the recorded test landscape (everything seeded)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from autotune.bench.landscape import Landscape
from autotune.bench.pick_quality import judge
from autotune.bench.replay import ReplayExecutor, make_replay_tuner, replay_recipe

LANDSCAPE = Path(__file__).resolve().parent.parent / "data" / "landscape.json"


@pytest.fixture(scope="module")
def landscape() -> Landscape:
    return Landscape.load(LANDSCAPE)


def test_a_replay_at_a_chosen_noise_draws_at_that_noise(landscape: Landscape) -> None:
    point = landscape.optimum()
    exact = ReplayExecutor(landscape, random.Random(0), noise=0.0).result(point.config)
    assert exact.samples_per_s == pytest.approx(point.value)
    draws = [
        ReplayExecutor(landscape, random.Random(seed), noise=0.02).result(point.config)
        for seed in range(200)
    ]
    values = [d.samples_per_s / point.value for d in draws]  # type: ignore[operator]
    spread = (sum((v - 1) ** 2 for v in values) / len(values)) ** 0.5
    assert 0.015 < spread < 0.025  # 2%, not the landscape's recorded noise
    assert landscape.run_noise > 0.05


def test_the_recipe_by_hand_takes_the_largest_micro_batch_that_fits(landscape: Landscape) -> None:
    replayed = replay_recipe(landscape, 0, noise=0.0)
    assert replayed.pick is not None
    point = landscape.lookup(replayed.pick)
    assert point is not None and landscape.feasible(point)
    tried = replayed.measured
    assert tried[-1] == replayed.pick  # it stops at the first that fits
    for config in tried[:-1]:  # every one before it was tried first, and did not fit
        earlier = landscape.lookup(config)
        assert earlier is None or not landscape.feasible(earlier)
    assert replayed.pick.amp in ("bf16", "fp16") or "bf16" not in landscape.space.params[
        "amp"
    ].choices  # fmt: skip


def test_the_recipe_by_hand_and_the_tuners_take_autocast_only_where_it_was_native(
    landscape: Landscape,
) -> None:
    # Recorded before the device's native autocasts were kept: the space's, as then.
    assert (
        landscape.native_amp is None and replay_recipe(landscape, 0, noise=0.0).pick.amp == "bf16"
    )
    emulated = landscape.model_copy(update={"native_amp": ()})  # a CPU without AVX512-BF16
    pick = replay_recipe(emulated, 0, noise=0.0).pick
    assert pick is not None and pick.amp == "off"
    tuner = make_replay_tuner(emulated, 0, trials=4, noise=0.0)
    assert tuner.native_amp[0] == ()
    assert tuner.run([], "replay", "replay").recipe.amp == "off"


def test_the_noise_row_counts_picks_and_compares_with_the_recipe_and_random(
    landscape: Landscape,
) -> None:
    row = judge(landscape, seeds=3, trials=10, noise=0.02)
    assert row["noise"] == 0.02 and row["trials"] == 10 and row["seeds"] == 3
    assert len(row["per_seed"]) == 3
    assert row["at_least_0.97"] == sum(s["tuner"] >= 0.97 for s in row["per_seed"])
    assert row["tuner_at_least_recipe"] == sum(s["tuner"] >= s["recipe"] for s in row["per_seed"])
    assert row["finishing_runs_median"] > 0  # the race's cost, in trial runs
    assert judge(landscape, seeds=1, trials=10)["noise"] == "recorded"
