"""The machine-noise analysis (autotune.bench.noise, behind scripts/bench_machine_noise.py)
on known series."""

from __future__ import annotations

import pytest

from autotune.bench import noise


def test_a_steady_machine_gives_no_fidelity_error() -> None:
    errors = noise.fidelity_errors([100.0] * 80, runs=4, gap=6, wait=30, long=20)
    assert len(errors) == 80 - (3 * 6 + 30 + 20) + 1
    assert errors == [0.0] * len(errors)


def test_a_slow_stretch_under_the_long_run_shows_as_the_estimates_error() -> None:
    # Fast (100) for 40 windows, then slow (80): an estimate taken wholly in the fast part
    # against a long run wholly in the slow part is 25% too high.
    series = [100.0] * 40 + [80.0] * 40
    errors = noise.fidelity_errors(series, runs=2, gap=5, wait=10, long=20)
    assert errors[0] == pytest.approx(0.0)  # estimate 0, 5; long run 15..34: all fast
    assert errors[15] == pytest.approx(100 / 90 - 1)  # long run 30..49 straddles the step
    assert errors[25] == pytest.approx(0.25)  # estimate 25, 30; long run 40..59: all slow
    assert errors[-1] == pytest.approx(0.0)  # all slow


def test_blocks_of_independent_windows_vary_less_than_blocks_of_stretches() -> None:
    alternating = [90.0, 110.0] * 30  # fast and slow windows side by side
    stretches = [90.0] * 10 + [110.0] * 10 + [90.0] * 10 + [110.0] * 10 + [90.0] * 20
    assert noise.cv_at(alternating, 1) == pytest.approx(noise.cv_at(stretches, 1), rel=0.05)
    assert noise.cv_at(alternating, 10) == pytest.approx(0.0)
    assert noise.cv_at(stretches, 10) > 0.05
    lag1 = noise.lag1_autocorrelation
    assert lag1(alternating) < 0 < lag1(stretches)


def test_the_referee_is_the_whole_series_mean_against_each_long_window() -> None:
    series = [100.0] * 20 + [80.0] * 20  # mean 90
    errors = noise.referee_errors(series, long=20)
    assert len(errors) == 21
    assert errors[0] == pytest.approx(90 / 100 - 1)
    assert errors[10] == pytest.approx(0.0)
    assert errors[-1] == pytest.approx(90 / 80 - 1)
