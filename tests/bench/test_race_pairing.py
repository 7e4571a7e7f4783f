"""The race-pairing analysis (autotune.bench.noise, behind scripts/bench_race_pairing.py) on
known rounds."""

from __future__ import annotations

import math

import pytest

from autotune.bench import noise as pairing


def rounds(drift: list[float], ratio: float, edge: float = 1.0) -> list[dict[str, float]]:
    """A at the machine's speed of the round, B at ``ratio`` of it; the round's second run
    ``edge`` times faster; A first in even rounds."""
    out = []
    for number, speed in enumerate(drift):
        a_first = number % 2 == 0
        a, b = math.log(speed), math.log(speed * ratio)
        if a_first:
            b += math.log(edge)
        else:
            a += math.log(edge)
        out.append({"log_a": a, "log_b": b, "log_ratio": b - a, "wall_s": 3.0, "a_first": a_first})
    return out


def test_drift_shared_by_both_runs_of_a_round_leaves_the_ratio_exact() -> None:
    drift = [100.0, 60.0, 130.0, 90.0, 110.0, 70.0, 100.0, 120.0]
    row = pairing.pairing_row(1.0, rounds(drift, 0.9))
    assert row["median_ratio"] == pytest.approx(0.9)
    assert row["ratio_sd"] == pytest.approx(0.0)
    assert row["run_sd"] > 0.1
    assert row["paired_share"] == pytest.approx(1.0)
    assert row["se_after_minute"] == pytest.approx(0.0)
    assert row["second_run_edge"] == pytest.approx(1.0)


def test_a_second_run_edge_is_found_and_widens_the_ratio_not_its_median() -> None:
    row = pairing.pairing_row(1.0, rounds([100.0] * 8, 0.9, edge=1.1))
    assert row["second_run_edge"] == pytest.approx(1.1)
    assert row["ratio_sd"] > 0.05
    # A B rounds read 0.99, B A rounds 0.818: the rotation cancels the edge in the median.
    assert row["median_ratio"] == pytest.approx(0.9)


def test_one_slow_stretch_does_not_decide_the_robust_spread() -> None:
    steady = [100.0, 104.0, 96.0, 102.0, 98.0, 101.0, 99.0, 103.0, 97.0, 100.0]
    calm = pairing.robust_sd([math.log(v) for v in steady])
    stretched = pairing.robust_sd([math.log(v) for v in [*steady[:8], 10.0, 12.0]])
    assert stretched < 2 * calm
    assert pairing.paired_share(0.1, 0.1 * math.sqrt(2)) == pytest.approx(0.0)
