"""Duet benchmarking: two configurations measured at the same time on disjoint cores, against
the race's way of measuring them one after the other (Bulej et al., ICPE 2020, report 2.3-12.5x
more accurate comparisons on shared cloud machines: what slows the machine then slows both).

Each run is a one-rank trial of the ``LocalExecutor`` whose processes are pinned to a core: a
thread sets its own CPU affinity and launches the trial, and the rank's processes inherit the
mask (Linux). In a duet round A and B start together on cores 0 and 1 (swapping cores every
round); in a sequential round they run one after the other on core 0, as the race runs them.
Used by ``scripts/bench_race_pairing.py --duet``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

from autotune.config import TrainConfig
from autotune.result import TrialResult
from autotune.runner.executor import run_to_end
from autotune.runner.launch import LocalExecutor
from autotune.runner.request import TrialOptions, TrialRequest
from autotune.runner.workload import WorkloadSpec


def _pinned(
    request: TrialRequest, cores: set[int], found: dict[int, TrialResult], key: int
) -> threading.Thread:
    """A thread that runs ``request`` with its processes allowed only ``cores``, into
    ``found[key]``: the thread sets its own CPU affinity, and what it launches inherits it."""

    def target() -> None:
        os.sched_setaffinity(0, cores)
        found[key] = run_to_end(LocalExecutor(), request)

    return threading.Thread(target=target)


def run_pinned(request: TrialRequest, cores: set[int]) -> TrialResult:
    """One trial whose processes may use only ``cores``."""
    found: dict[int, TrialResult] = {}
    thread = _pinned(request, cores, found, 0)
    thread.start()
    thread.join()
    return found[0]


def _both(first: TrialRequest, second: TrialRequest, cores: tuple[int, int]) -> list[TrialResult]:
    found: dict[int, TrialResult] = {}
    threads = [_pinned(first, {cores[0]}, found, 0), _pinned(second, {cores[1]}, found, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [found[0], found[1]]


def request_of(
    config: TrainConfig, workload: WorkloadSpec, length_s: float, min_steps: int
) -> TrialRequest:
    """A race-like run: 3 warm-up steps, then at least ``min_steps`` steps and ``length_s``."""
    options = TrialOptions(
        warmup_steps=3,
        measured_steps=min_steps,
        min_measure_s=length_s,
        max_measure_s=length_s,
        timeout_s=180.0,
    )
    return TrialRequest(config=config, workload=workload, options=options)


def measure_round(
    a: TrialRequest, b: TrialRequest, duet: bool, number: int
) -> dict[str, float | bool]:
    """One round of A and B (a ``noise.pairing_row`` round): at the same time on two cores
    (A on core 0 in even rounds), or one after the other on core 0 (A first in even rounds)."""
    even = number % 2 == 0
    started = time.perf_counter()
    if duet:
        first, second = _both(a, b, (0, 1) if even else (1, 0))
    elif even:
        first, second = run_pinned(a, {0}), run_pinned(b, {0})
    else:
        second, first = run_pinned(b, {0}), run_pinned(a, {0})
    wall = time.perf_counter() - started
    for result in (first, second):
        if result.status != "ok" or not result.samples_per_s:
            raise RuntimeError(f"{result.config.summary()}: {result.status} {result.message}")
    log_a, log_b = math.log(first.samples_per_s or 1.0), math.log(second.samples_per_s or 1.0)
    return {
        "log_a": log_a,
        "log_b": log_b,
        "log_ratio": log_b - log_a,
        "wall_s": wall,
        "a_first": even,
    }


def cores_for_duet() -> str | None:
    """Why a duet cannot run here (None: it can): it needs cores 0 and 1 and Linux's affinity."""
    if not hasattr(os, "sched_setaffinity"):
        return "no CPU affinity on this platform"
    usable = os.sched_getaffinity(0)
    return None if {0, 1} <= usable else f"cores 0 and 1 are not both usable ({sorted(usable)})"


def summary_of(rows: dict[str, Any]) -> dict[str, Any]:
    """Duet against sequential: how much less the ratio's standard error is after a minute."""
    duet, sequential = rows.get("duet"), rows.get("sequential")
    if not duet or not sequential or not duet["se_after_minute"]:
        return {}
    return {
        "se_ratio_sequential_over_duet": sequential["se_after_minute"] / duet["se_after_minute"],
        "ratio_sd_sequential_over_duet": sequential["ratio_sd"] / duet["ratio_sd"]
        if duet["ratio_sd"]
        else None,
    }
