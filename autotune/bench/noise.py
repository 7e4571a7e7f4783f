"""The analysis behind the noise benchmarks: how a machine's speed drifts and what that does to
a measurement (``scripts/bench_machine_noise.py``, ``bench_run_noise.py``), and how much a
race's pairing of runs takes out (``bench_race_pairing.py``). Pure functions of measured series,
but for ``window_speeds``, which measures one.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from typing import Any

from autotune.bench.live import TARGET_ERROR


def lag1_autocorrelation(values: list[float]) -> float:
    """Correlation of each run with the next (0 when fewer than three runs or no spread)."""
    if len(values) < 3:
        return 0.0
    mean = statistics.fmean(values)
    deviations = [v - mean for v in values]
    spread = sum(d * d for d in deviations)
    if spread == 0:
        return 0.0
    return sum(a * b for a, b in itertools.pairwise(deviations)) / spread


def window_speeds(seconds: int, threads: int, size: int = 384) -> list[float]:
    """Matrix multiplications per second in each of ``seconds`` consecutive 1-s windows."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(20):  # warm the caches and the thread pool
        a @ b
    speeds = []
    for _ in range(seconds):
        start, done = time.perf_counter(), 0
        while (elapsed := time.perf_counter() - start) < 1.0:
            for _ in range(5):
                a @ b
            done += 5
        speeds.append(done / elapsed)
    return speeds


def cv_at(series: list[float], width: int) -> float | None:
    """Coefficient of variation of the means of consecutive ``width``-window blocks (None with
    fewer than three blocks)."""
    blocks = [
        statistics.fmean(series[i : i + width]) for i in range(0, len(series) - width + 1, width)
    ]
    if len(blocks) < 3:
        return None
    return statistics.stdev(blocks) / statistics.fmean(blocks)


def fidelity_errors(series: list[float], runs: int, gap: int, wait: int, long: int) -> list[float]:
    """For every start: (mean of ``runs`` windows ``gap`` apart) / (mean of the ``long``
    windows starting ``wait`` after the last of them) - 1."""
    span = (runs - 1) * gap + wait + long
    errors = []
    for start in range(len(series) - span + 1):
        estimate = statistics.fmean(series[start + i * gap] for i in range(runs))
        first = start + (runs - 1) * gap + wait
        errors.append(estimate / statistics.fmean(series[first : first + long]) - 1)
    return errors


def referee_errors(series: list[float], long: int) -> list[float]:
    """For every start: (mean of the whole series) / (mean of ``long`` windows there) - 1."""
    mean = statistics.fmean(series)
    return [
        mean / statistics.fmean(series[start : start + long]) - 1
        for start in range(len(series) - long + 1)
    ]


def _spread(errors: list[float]) -> dict[str, Any]:
    errors = [abs(e) for e in errors]
    if not errors:
        return {"starts": 0, "median_abs_error": None, "p90_abs_error": None,
                "share_within_5pct": None}  # fmt: skip
    return {
        "starts": len(errors),
        "median_abs_error": statistics.median(errors),
        "p90_abs_error": percentile(errors, 0.9),
        "share_within_5pct": sum(e <= TARGET_ERROR for e in errors) / len(errors),
    }


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def summarize(series: list[float], args: Any) -> dict[str, Any]:
    errors = fidelity_errors(series, args.runs, args.gap, args.wait, args.long)
    return {
        "windows": len(series),
        "mean_per_s": statistics.fmean(series),
        "cv_by_window_s": {str(w): cv_at(series, w) for w in (1, 5, 20, 60)},
        "lag1_autocorrelation": lag1_autocorrelation(series),
        "fidelity": {
            "runs": args.runs,
            "gap_s": args.gap,
            "wait_s": args.wait,
            "long_s": args.long,
            **_spread(errors),
        },
        "referee": {"long_s": args.long, **_spread(referee_errors(series, args.long))},
    }


MAD_TO_SD = 1.4826


LOGS = ("log_a", "log_b")


def paired_share(run_sd: float, ratio_sd: float) -> float:
    """The share of two independent runs' variance that pairing removed from their ratio."""
    return 1.0 - ratio_sd**2 / (2 * run_sd**2) if run_sd > 0 else 0.0


def robust_sd(values: list[float]) -> float:
    """The standard deviation a normal sample with this median absolute deviation has: a slow
    stretch of the machine (runs at a tenth of the speed for a minute) does not swamp it."""
    middle = statistics.median(values)
    return MAD_TO_SD * statistics.median(abs(v - middle) for v in values)


def pairing_row(length: float, rounds: list[dict[str, float]]) -> dict[str, float]:
    """One run length's rounds: spreads, pairing and the standard error after a minute."""
    ratios = [r["log_ratio"] for r in rounds]
    # One run's spread around its own configuration's median (A and B differ in level).
    middle = {k: statistics.median(r[k] for r in rounds) for k in LOGS}
    centred = [r[k] - middle[k] for r in rounds for k in LOGS]
    run_sd, ratio_sd = robust_sd(centred), robust_sd(ratios)
    round_s = statistics.median(r["wall_s"] for r in rounds)
    # A B rounds measure log(B/A) + (second run's edge), B A rounds log(B/A) - (the edge).
    a_first = [r["log_ratio"] for r in rounds if r["a_first"]]
    b_first = [r["log_ratio"] for r in rounds if not r["a_first"]]
    edge = (statistics.median(a_first) - statistics.median(b_first)) / 2 if b_first else 0.0
    return {
        "run_length_s": length,
        "rounds": len(rounds),
        "round_wall_s": round_s,
        "median_ratio": math.exp(statistics.median(ratios)),
        "run_sd": run_sd,
        "ratio_sd": ratio_sd,
        "paired_share": paired_share(run_sd, ratio_sd),
        "se_after_minute": ratio_sd / math.sqrt(60.0 / round_s),
        "second_run_edge": math.exp(edge),
        "plain_run_sd": statistics.stdev(centred),
        "plain_ratio_sd": statistics.stdev(ratios),
    }
