"""The measured window: how long a trial measures and when it stops early (no processes)."""

from __future__ import annotations

import random

import pytest

from autotune.config import TrainConfig
from autotune.result import RankReport, summarise_steps
from autotune.runner.request import TrialOptions
from autotune.runner.window import AFTER_FASTER, Window, overran, step_limit_s, warmup_phase
from autotune.stats import mean_interval, t_quantile


@pytest.mark.parametrize(
    ("df", "expected"), [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042)]
)
def test_t_quantiles_match_the_tables(df: int, expected: float) -> None:
    assert t_quantile(df) == pytest.approx(expected, rel=0.002)  # 0.1% off at df 3


def test_t_quantile_at_90_percent() -> None:
    assert t_quantile(2, 0.90) == pytest.approx(2.920, abs=0.002)
    assert t_quantile(4, 0.90) == pytest.approx(2.132, abs=0.002)


def _run(window: Window, steps: list[float]) -> tuple[str, int]:
    """Feed ``steps`` (seconds each) until the window decides; return (decision, steps used)."""
    elapsed = 0.0
    for i, step in enumerate(steps, start=1):
        elapsed += step
        decision = window.measured_step(step, elapsed)
        if decision != "measure":
            return decision, i
    return "measure", len(steps)


def test_a_fixed_window_measures_exactly_its_steps() -> None:
    window = Window(TrialOptions(measured_steps=4, target_interval=0), 32)
    assert _run(window, [0.01] * 100) == ("done", 4)


def test_fast_steady_steps_measure_for_the_minimum_time() -> None:
    window = Window(TrialOptions(measured_steps=5, min_measure_s=1.0), 32)
    rng = random.Random(0)
    decision, n = _run(window, [0.001 * (1 + rng.uniform(-0.05, 0.05)) for _ in range(5000)])
    assert decision == "done" and 990 <= n <= 1010  # one second of 1 ms steps
    assert window.interval().relative <= 0.03


def test_noisy_steps_measure_until_the_interval_is_tight() -> None:
    rng = random.Random(1)
    steps = [0.05 * (1 + rng.gauss(0, 0.3)) for _ in range(2000)]
    window = Window(TrialOptions(measured_steps=5, min_measure_s=0.0, max_measure_s=1e9), 32)
    decision, n = _run(window, steps)
    # 30% noise per step needs ~ (1.96 * 0.3 / 0.03)^2 = 384 steps for +-3%
    assert decision == "done" and 200 <= n <= 800
    assert window.interval().relative <= 0.03
    assert mean_interval(steps[:n]).relative <= 0.04  # independent steps: either way agrees


def test_the_window_ends_at_its_maximum_time_even_when_loose() -> None:
    rng = random.Random(2)
    steps = [1.0 * (1 + rng.gauss(0, 0.5)) ** 2 for _ in range(100)]
    window = Window(TrialOptions(measured_steps=2, min_measure_s=0, max_measure_s=10.0), 32)
    decision, n = _run(window, steps)
    assert decision == "done" and sum(steps[:n]) >= 10.0 and sum(steps[: n - 1]) < 10.0


def test_a_hopeless_step_is_pruned_at_once_even_in_warm_up() -> None:
    # pruning below 100 samples/s at global batch 32: a step at that speed takes 0.32 s
    window = Window(TrialOptions(prune_below_samples_per_s=100.0), 32)
    assert window.warmup_step(0.32 * 5) == "measure"  # slow, but a first step may be
    assert window.warmup_step(0.32 * 11) == "prune"
    assert "over 10x" in window.reason


def test_one_long_step_after_steps_within_the_limit_is_a_stall_not_the_trial() -> None:
    # Seen in a search on 2 CPU cores: a 0.49 s pause among steps of 26 ms pruned a trial
    # faster than the line (0.374 s was the one-step limit). The interval decides such a trial.
    window = Window(TrialOptions(prune_below_samples_per_s=100.0, target_interval=0), 32)
    assert window.warmup_step(0.1) == "measure"
    assert _run(window, [0.1] * 10 + [0.32 * 11] + [0.1] * 20) == ("done", 5)
    stalled = Window(TrialOptions(prune_below_samples_per_s=100.0), 32)  # at most 10 s
    assert _run(stalled, [0.1] * 10 + [0.32 * 11] + [0.1] * 200)[0] == "done"
    assert stalled.reason == ""


def test_a_stall_after_a_faster_step_is_not_ended_from_outside_either() -> None:
    options = TrialOptions(prune_below_samples_per_s=100.0)  # 0.32 s a step at the line
    window = Window(options, 32)
    assert window.phase("measured step 1") == "measured step 1"  # nothing shown yet
    assert overran(options, 32, window.phase("measured step 1"), 3.3) is not None
    window.measured_step(0.1, 0.1)
    phase = window.phase("measured step 2")
    assert phase == f"measured step 2{AFTER_FASTER}"
    assert overran(options, 32, phase, 100.0) is None  # a stall: the trial's timeout remains


def test_a_steps_wait_for_an_epochs_first_batch_is_not_held_against_it() -> None:
    options = TrialOptions(prune_below_samples_per_s=100.0)  # one-step limit 3.2 s
    assert Window(options, 32).warmup_step(4.0, epoch_start_s=3.5) == "measure"
    hopeless = Window(options, 32)
    assert hopeless.warmup_step(4.0, epoch_start_s=0.5) == "prune"
    assert hopeless.reason.startswith("one step took 3.5 s besides 0.5 s for an epoch's first")


def test_a_step_still_running_past_the_limit_is_known_hopeless_before_it_ends() -> None:
    options = TrialOptions(prune_below_samples_per_s=100.0)  # 0.32 s a step at the line
    assert step_limit_s(options, 32) == pytest.approx(3.2)
    assert step_limit_s(TrialOptions(), 32) is None  # no line, no limit
    assert overran(options, 32, "warm-up step 1", 3.1) is None
    why = overran(options, 32, "measured step 4", 3.3)
    assert why is not None and why.startswith("measured step 4 still running after 3.3 s")
    assert "over 10x the 0.32 s of a step at the pruning line, 100.0 samples/s" in why
    # what the rule never judges: a step that compiles, the epoch boundary, building
    for phase in ("compiling (first step)", "measuring an epoch boundary", "building the workload"):
        assert overran(options, 32, phase, 100.0) is None
    # under torch.compile any warm-up step may compile again: while it runs, it is judged only
    # past twice the first step's time (which compiled all of it), then by the rule
    assert [warmup_phase(i, compiling=True, first_step_s=20.0) for i in range(3)] == [
        "compiling (first step)",
        "compiled warm-up step 2 (compiling again: up to 40.0 s)",
        "compiled warm-up step 3 (compiling again: up to 40.0 s)",
    ]
    again = warmup_phase(1, compiling=True, first_step_s=20.0)
    assert overran(options, 32, again, 39.0) is None  # 12x the limit, but it may be compiling
    late = overran(options, 32, again, 41.0)
    assert late is not None and late.startswith(f"{again} still running after 41 s, over 10x")
    assert overran(TrialOptions(), 32, again, 1e6) is None  # no line, no limit
    assert overran(options, 32, warmup_phase(1, compiling=False), 100.0) is not None
    assert overran(TrialOptions(), 32, "warm-up step 1", 1e6) is None


def test_a_clearly_slower_trial_is_pruned_after_two_steps_and_a_close_one_is_not() -> None:
    slow = Window(TrialOptions(prune_below_samples_per_s=100.0), 32)
    assert _run(slow, [0.64, 0.65, 0.66, 0.64]) == ("prune", 2)  # half the threshold's speed
    assert "below the pruning line, 100.0 samples/s" in slow.reason
    close = Window(TrialOptions(prune_below_samples_per_s=100.0, target_interval=0), 32)
    rng = random.Random(3)
    noisy = [0.30 * (1 + rng.gauss(0, 0.2)) for _ in range(5)]  # faster than the threshold
    assert _run(close, noisy) == ("done", 5)


def test_a_fast_models_pruning_line_reads_as_the_progress_lines_do() -> None:
    # An MLP pruned against a line of 12,000 samples/s read "at most 5000 samples/s ..., below
    # the pruning line, 1.2e+04 samples/s" beside progress lines of "9,452.0 samples/s"
    fast = Window(TrialOptions(prune_below_samples_per_s=12000.0), 64)
    assert _run(fast, [0.0128, 0.0128, 0.0129, 0.0128]) == ("prune", 2)
    assert "at most 5,0" in fast.reason and "pruning line, 12,000.0 samples/s" in fast.reason
    slow = Window(TrialOptions(prune_below_samples_per_s=0.05), 8)  # a large model: 160 s a step
    assert _run(slow, [400.0, 410.0, 405.0]) == ("prune", 2)
    assert "at most 0.0" in slow.reason and "pruning line, 0.05 samples/s" in slow.reason


def test_one_epoch_boundary_is_spread_over_the_steps_of_an_epoch() -> None:
    config = TrainConfig(global_batch_size=32, device="cpu", grad_accum_steps=2)
    report = RankReport(
        rank=0,
        status="ok",
        measured_s=1.0,
        step_times_s=[0.1] * 10,
        epoch_boundary_s=0.5,
        batches_per_epoch=40,  # 20 optimizer steps an epoch at accumulation 2
    )
    summary = summarise_steps(config, [report])
    assert summary["steady_samples_per_s"] == pytest.approx(320.0)
    # 10 steps are half an epoch: a long run pays half a boundary per 10 steps
    assert summary["samples_per_s"] == pytest.approx(32 * 10 / (1.0 + 0.25))
    assert summary["steps_per_epoch"] == 20
    crossed = report.model_copy(update={"epochs_crossed": 1})  # already paid in the window
    assert summarise_steps(config, [crossed])["samples_per_s"] == pytest.approx(320.0)
