"""Paired ratios: the geometric mean of run-by-run ratios, with the t interval of their logs,
and how many pairs a comparison still open would need; and step times that drift."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from autotune.stats import drift, mean_interval, pairs_to_decide, ratio_interval, t_quantile


def test_one_pair_gives_no_interval() -> None:
    assert ratio_interval([math.log(1.2)]) is None


def test_the_ratio_is_the_geometric_mean_and_its_interval_is_symmetric_in_logs() -> None:
    ratios = [math.log(r) for r in (1.1, 1.3, 1.2, 1.2)]
    paired = ratio_interval(ratios)
    assert paired is not None
    estimate, low, high = paired
    assert estimate == pytest.approx((1.1 * 1.3 * 1.2 * 1.2) ** 0.25)
    assert low < estimate < high
    assert math.log(estimate / low) == pytest.approx(math.log(high / estimate))
    assert low > 1.0  # four pairs all faster: the slow end is still a speed-up


def test_a_wider_confidence_gives_a_wider_interval() -> None:
    ratios = [math.log(r) for r in (0.9, 1.1, 1.05, 0.95)]
    narrow, wide = ratio_interval(ratios, 0.5), ratio_interval(ratios, 0.99)
    assert narrow is not None and wide is not None
    assert wide[1] < narrow[1] < 1.0 < narrow[2] < wide[2]


def test_the_rounds_to_decide_are_where_the_interval_would_first_leave_zero_out() -> None:
    values = [0.02, -0.01, 0.05, 0.0]  # mean 0.015, spread 0.026: undecided after four
    assert mean_interval(values, 0.9).low < 0
    n = pairs_to_decide(values, 0.9)
    assert n is not None and n > len(values)
    sd = statistics.stdev(values)
    assert t_quantile(n - 1, 0.9) * sd / math.sqrt(n) < 0.015
    assert t_quantile(n - 2, 0.9) * sd / math.sqrt(n - 1) >= 0.015  # not one round sooner


def test_decided_values_need_no_more_and_alike_ones_never_split() -> None:
    assert pairs_to_decide([0.1, 0.11, 0.09], 0.9) == 3
    assert pairs_to_decide([0.01, -0.01, 0.01, -0.01], 0.9, most=50) == 50
    assert pairs_to_decide([0.1], 0.9) is None
    assert pairs_to_decide([0.1, 0.1], 0.9) is None  # no spread: nothing to project from


# A Transformer-XL's step times over 18 measured steps on this CPU (its memory of 1,024 tokens
# filling 64 a step): the step it measures is not the step a long run takes.
FILLING = [0.198, 0.231, 0.276, 0.317, 0.386, 0.416, 0.469, 0.526, 0.575]
FILLING += [0.615, 0.664, 0.677, 0.700, 0.793, 0.850, 0.815, 0.814, 0.875]


def test_a_step_time_that_keeps_rising_is_a_drift_of_its_thirds() -> None:
    assert drift(FILLING) == pytest.approx(0.8145 / 0.2965)
    assert drift(FILLING[::-1]) == pytest.approx(0.2965 / 0.8145)  # warming up: falling
    assert drift([1.0] * 10 + [1.5] * 10) == pytest.approx(1.5)  # a machine that got busier


def test_noise_without_order_is_no_drift_however_wide() -> None:
    rng = random.Random(0)
    found = [
        drift([rng.lognormvariate(0, 0.5) for _ in range(n)])
        for n in (9, 30, 300)
        for _ in range(100)
    ]
    assert found.count(None) >= 298  # DRIFT_Z: about one in 400 by chance
    # ordered, but too little to matter: the thirds 10% apart
    assert drift([1 + 0.1 * i / 29 for i in range(30)]) is None
    assert drift(FILLING[:8]) is None  # too few steps to judge
