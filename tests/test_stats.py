"""Paired ratios: the geometric mean of run-by-run ratios, with the t interval of their logs."""

from __future__ import annotations

import math

import pytest

from autotune.stats import ratio_interval


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
