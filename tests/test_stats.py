"""Paired ratios: the geometric mean of run-by-run ratios, with the t interval of their logs,
and how many pairs a comparison still open would need."""

from __future__ import annotations

import math
import statistics

import pytest

from autotune.stats import mean_interval, pairs_to_decide, ratio_interval, t_quantile


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
