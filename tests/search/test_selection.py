"""The winner's curse: the race's winner is shrunk back by the luck of having been chosen."""

from __future__ import annotations

import random
import statistics

import pytest

from autotune.config import TrainConfig
from autotune.html_report import render_html
from autotune.records import TrialRecord
from autotune.report import format_recommendation
from autotune.result import TrialResult
from autotune.search import race
from tests.search.fakes import FakeExecutor, MiB, make_tuner, ok

BASELINE = TrainConfig(global_batch_size=32, device="cpu")
FINALISTS = [TrainConfig(global_batch_size=32, device="cpu", num_workers=n) for n in (1, 2, 3)]


def raced(speeds: list[float], noise: float, rounds: int, rng: random.Random) -> list[TrialRecord]:
    """Race records of the three finalists (true ``speeds``) and a baseline at 500, every one
    in every round, with independent noise of ``noise`` per run."""
    records = []
    for n in range(1, rounds + 1):
        for config, true in zip([*FINALISTS, BASELINE], [*speeds, 500.0], strict=True):
            records.append(
                TrialRecord(
                    number=len(records), role="race", status="ok", config=config,
                    samples_per_s=true * rng.gauss(1, noise), memory_used_bytes=100 * MiB,
                    feasible=True, race_round=n,
                )
            )  # fmt: skip
    return records


def winner_error(speeds: list[float], noise: float, seed: int) -> tuple[float, float, float]:
    """(raw mean, corrected mean) of the race's winner over its true speed, and the factor."""
    records = raced(speeds, noise, 4, random.Random(seed))
    winner = race.ranking(records, [*FINALISTS, BASELINE])[0]
    runs = [r.samples_per_s or 0.0 for r in race.race_runs(records, winner).values()]
    true = speeds[FINALISTS.index(winner)]
    factor = race.selection_factor(records, winner, BASELINE)
    return statistics.fmean(runs) / true, statistics.fmean(runs) * factor / true, factor


def test_the_winner_of_equal_finalists_is_shrunk_back_to_their_true_speed() -> None:
    # Three equally fast finalists at 10% noise, 4 rounds: the best mean is flattered by about
    # 0.85 standard errors (4.3% over these seeds); the correction takes out most of it (1.2%
    # is left: with three finalists the spread of their true speeds is a noisy estimate).
    errors = [winner_error([1000.0] * 3, 0.10, seed) for seed in range(400)]
    raw = statistics.fmean(e[0] for e in errors) - 1
    corrected = statistics.fmean(e[1] for e in errors) - 1
    assert raw > 0.035
    assert abs(corrected) < raw / 3
    assert all(e[2] <= 1.0 for e in errors)  # never raised


def test_a_winner_that_left_the_others_behind_keeps_its_mean() -> None:
    for seed in range(20):
        assert winner_error([1000.0, 700.0, 600.0], 0.03, seed)[2] > 0.995


def test_without_a_second_finalist_nothing_is_taken_out() -> None:
    records = [r for r in raced([1000.0] * 3, 0.1, 4, random.Random(0)) if r.config in
               (FINALISTS[0], BASELINE)]  # fmt: skip
    assert race.selection_factor(records, FINALISTS[0], BASELINE) == 1.0


def test_the_recommendation_carries_the_correction_and_says_so() -> None:
    # Two finalists 2% apart and the baseline at 8% noise: the race cannot split them, so the
    # winner's mean is shrunk, and its interval and speed-up with it.
    flat = {"parallel": ["ddp"], "world_size": [2], "num_workers": [0, 1, 2]}
    rng = random.Random(5)

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        true = {0: 900.0, 1: 1000.0, 2: 980.0}[config.num_workers]
        return ok(config, true * rng.gauss(1, 0.08), 100.0)

    tuner = make_tuner(FakeExecutor(outcome), flat, trials=3, top_k=2, race_rounds=4)
    r = tuner.run([], "s.db", "s")
    assert r.selection_factor < 0.995
    mean = statistics.fmean(r.samples_per_s_runs)
    assert r.samples_per_s == pytest.approx(mean * r.selection_factor)
    assert r.samples_per_s_high is not None and r.samples_per_s_high < mean * 1.5
    base = r.baseline.config if r.baseline else None
    paired = race.speedup(tuner.log.records, r.config, base)  # type: ignore[arg-type]
    assert paired is not None and r.speedup == pytest.approx(paired[0] * r.selection_factor)
    text = format_recommendation(r)
    assert f"less {1 - r.selection_factor:.1%} for having been chosen among finalists" in text
    assert "chosen among finalists the noise could not split" in render_html(r)
