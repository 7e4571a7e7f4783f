"""Small-sample statistics for deciding on measurements: Student's t intervals, no SciPy.

Used where a number must be good enough before it decides something: a trial's step-time
window (``autotune.runner.window``) and the interval it reports (``autotune.result``), and the
race of the finalists (``autotune.search.race``).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``df`` degrees of freedom.

    Exact for 1 and 2 degrees of freedom; from df 3 on, the Cornish-Fisher expansion around the
    normal quantile (off by less than 0.5% at df 3, less than 0.01% from df 10).
    """
    if df < 1:
        raise ValueError(f"t quantile needs at least 1 degree of freedom, got {df}")
    p = (1 + confidence) / 2
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


@dataclass(frozen=True)
class Interval:
    """A mean and the half-width of its confidence interval (inf with fewer than 2 values)."""

    mean: float
    half_width: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def relative(self) -> float:
        """Half-width as a share of the mean (inf when the mean is 0)."""
        return self.half_width / abs(self.mean) if self.mean else math.inf


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Student's t interval of the mean of ``values``."""
    n = len(values)
    if n == 0:
        raise ValueError("an interval needs at least one value")
    mean = statistics.fmean(values)
    if n < 2:
        return Interval(mean, math.inf, n)
    sd = statistics.stdev(values)
    return Interval(mean, t_quantile(n - 1, confidence) * sd / math.sqrt(n), n)


def ratio_interval(
    log_ratios: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float, float] | None:
    """The geometric-mean ratio of paired runs and its interval, (estimate, low, high), from
    their log ratios; None with fewer than two pairs."""
    if len(log_ratios) < 2:
        return None
    interval = mean_interval(log_ratios, confidence)
    return math.exp(interval.mean), math.exp(interval.low), math.exp(interval.high)


def pairs_to_decide(
    values: Sequence[float], confidence: float = CONFIDENCE, most: int = 1000
) -> int | None:
    """A projection: how many values the interval of their mean would need to leave 0 out,
    if their mean and spread stayed as measured (at least ``len(values)``; ``most`` when it
    would take that many or more). None with fewer than two values or no spread."""
    n = len(values)
    if n < 2:
        return None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    if sd == 0:
        return None
    for count in range(n, most):
        if t_quantile(count - 1, confidence) * sd / math.sqrt(count) < abs(mean):
            return count
    return most


BATCHES = 10
"""Batch means: long runs of step times are cut into this many consecutive batches."""


def step_time_interval(steps: Sequence[float], sums: Sequence[float] | None = None) -> Interval:
    """The 95% interval of the mean of consecutive step times. From ``BATCHES * 2`` steps on, by
    batch means: consecutive steps are not independent (a step that waited for data is followed
    by fast ones while the refilled queue lasts), and the means of long runs of steps nearly
    are. Treating such steps as independent overstates the noise of a loading-bound pipeline
    many times over.

    ``sums``: the running sums of ``steps`` (``sums[i] == sum(steps[:i])``), kept by a caller
    that adds one step at a time; with them each call costs ``BATCHES`` steps, not all of them.
    """
    n = len(steps)
    if n < 2 * BATCHES:
        return mean_interval(steps)
    if sums is None:
        sums = list(itertools.accumulate(steps, initial=0.0))
    size = n // BATCHES
    start = n - size * BATCHES  # the latest steps: warm-up effects fade
    means = [(sums[start + (i + 1) * size] - sums[start + i * size]) / size for i in range(BATCHES)]
    return Interval(sums[n] / n, mean_interval(means).half_width, n)


DRIFT_STEPS = 9
"""The fewest steps a drift is judged on: three in each third."""
DRIFT_RATIO = 1.25
"""How far the last third's median must lie from the first third's, either way."""
DRIFT_Z = 3.0
"""How far the rank correlation of step time and step number must lie from none, in its
standard errors: random noise passes this about once in 400 trials."""


def drift_size(ratio: float) -> float:
    """How far a ``drift`` ratio lies from level, either way: 2.0 for 2.0 and for 0.5."""
    return max(ratio, 1 / ratio)


def drift(steps: Sequence[float]) -> float | None:
    """How far step time moved across consecutive steps: the median of the last third over
    that of the first third, when the steps rise or fall steadily; None when they hold level
    (or there are fewer than ``DRIFT_STEPS``).

    Steadily: Spearman's rank correlation of time and step number at least ``DRIFT_Z`` standard
    errors (``1 / sqrt(n - 1)``) from zero, and the thirds ``DRIFT_RATIO`` apart. A step that
    carries state to the next (a Transformer-XL's memory, filling for its first hundreds of
    steps: 198 ms rising to 875 ms over 18 steps) passes both; noise, however wide its spread,
    has no order and passes neither. A machine that got busier mid-run passes too."""
    n = len(steps)
    if n < DRIFT_STEPS:
        return None
    third = n // 3
    ratio = statistics.median(steps[-third:]) / statistics.median(steps[:third])
    if drift_size(ratio) < DRIFT_RATIO:
        return None
    order = sorted(range(n), key=steps.__getitem__)
    ranks = [0] * n
    for rank, index in enumerate(order):
        ranks[index] = rank
    mean = (n - 1) / 2
    covariance = sum((i - mean) * (r - mean) for i, r in enumerate(ranks))
    rho = covariance / sum((i - mean) ** 2 for i in range(n))  # the ranks are a permutation
    return ratio if abs(rho) * math.sqrt(n - 1) >= DRIFT_Z else None
