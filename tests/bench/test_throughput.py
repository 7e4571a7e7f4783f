"""A study's race read back from its database, as the search itself ranked it
(``autotune.bench.throughput``, ``scripts/race_summary.py``)."""

from __future__ import annotations

import random
from pathlib import Path

import optuna
import pytest

from autotune.bench.throughput import flops_per_sample, race_summary, tokens_per_sample
from autotune.config import TrainConfig
from autotune.result import TrialResult
from autotune.search.study import make_sampler
from tests.search.fakes import FakeExecutor, make_tuner, ok

SPACE = {"parallel": ["ddp"], "world_size": [2], "amp": ["off", "bf16"], "num_workers": [0, 1]}
RNG = random.Random()


def _outcome(config: TrainConfig, before: int) -> TrialResult:
    speed = 1000.0 + 100 * config.num_workers  # a worker helps; the recipe (bf16, a worker) 900
    if config.amp == "bf16":
        speed = 900.0 if config.num_workers else speed * 1.01
    return ok(config, speed * RNG.gauss(1, 0.005), 100)


def test_a_stored_race_reads_back_with_the_speed_ups_the_recommendation_states(
    tmp_path: Path,
) -> None:
    RNG.seed(5)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(
        storage=storage, study_name="s", direction="maximize", sampler=make_sampler(0)
    )
    tuner = make_tuner(FakeExecutor(_outcome), SPACE, study=study, trials=4, race_rounds=4)
    recommendation = tuner.run([], storage, "s")
    model = "tests.fixtures.models:Small"
    read = race_summary(str(tmp_path / "s.db"), model, peak_tflops=1.0)
    rows = {row["role"]: row for row in read["rows"]}
    assert set(rows) == {"baseline", "recipe", "finalist"}
    assert rows["recipe"]["config"] == recommendation.recipe.summary()  # type: ignore[union-attr]
    pick = next(r for r in read["rows"] if r["config"] == recommendation.config.summary())
    estimate, low, high = pick["speedup_over_recipe"]
    assert low < estimate < high
    # the recommendation's figure is the same paired ratio, corrected for the winner's luck
    assert recommendation.speedup_over_recipe == pytest.approx(estimate, rel=0.02)
    assert pick["mfu"] == pytest.approx(
        read["flops_per_sample"] * pick["mean_samples_per_s"] / 1e12
    )
    assert read["tokens_per_sample"] is None  # Small is fed feature vectors, not token ids


def test_a_language_models_tokens_and_flops_are_counted_from_one_sample() -> None:
    model = "examples/hf_models.py:gpt2_tiny"
    assert tokens_per_sample(model) == 256
    assert flops_per_sample(model) > 6 * 256 * 1e5  # forward and backward over every token
