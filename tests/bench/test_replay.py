"""Search strategies replayed on a recorded landscape: nothing runs, results are looked up.

``tests/data/landscape.json`` is a grid ``scripts/bench_search_quality.py`` recorded on 2 CPU
ranks (every configuration of ``search_spaces/bench.yaml``; run messages dropped), with the
script's memory limit (the 75th percentile of the grid's peaks). Everything here is seeded.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from autotune.bench.heuristics import batch_size_finder, deepspeed_rule
from autotune.bench.landscape import Landscape
from autotune.bench.replay import (
    ReplayExecutor,
    make_replay_tuner,
    replay_measure,
    replay_random,
    replay_tuner,
    replayed_steps,
    trials_to_reach,
)
from autotune.config import TrainConfig
from autotune.runner.request import TrialOptions
from autotune.search import race

LANDSCAPE = Path(__file__).resolve().parent.parent / "data" / "landscape.json"
SEEDS = range(5)


@pytest.fixture(scope="module")
def landscape() -> Landscape:
    return Landscape.load(LANDSCAPE)


def test_the_optimum_is_the_fastest_configuration_that_fits(landscape: Landscape) -> None:
    assert len(landscape.points) == 96
    best = landscape.optimum()
    assert landscape.ratio(best.config) == 1.0
    infeasible = [p for p in landscape.points if not landscape.feasible(p)]
    assert infeasible, "the limit must rule some configurations out"
    assert all(landscape.ratio(p.config) == 0.0 for p in infeasible)
    feasible = [p for p in landscape.points if landscape.feasible(p)]
    assert all((p.value or 0) <= (best.value or 0) for p in feasible)


def test_the_tuner_reaches_98_percent_of_the_optimum_in_fewer_trials_than_random(
    landscape: Landscape,
) -> None:
    cap = len(landscape.points) // 2
    tuner, randomly = [], []
    for seed in SEEDS:
        measured = replay_tuner(landscape, seed, cap, finish=False).measured
        tuner.append(trials_to_reach(landscape, measured, 0.98) or cap + 1)
        measured = replay_random(landscape, seed, len(landscape.points)).measured
        randomly.append(trials_to_reach(landscape, measured, 0.98) or len(landscape.points) + 1)
    assert statistics.median(tuner) < statistics.median(randomly), (tuner, randomly)
    assert max(tuner) <= cap, f"the tuner missed 98% of the optimum in {cap} trials: {tuner}"


def test_the_budgeted_tuner_picks_better_than_random_search_with_as_many_runs(
    landscape: Landscape,
) -> None:
    # 14 search trials + 3 re-measurements + 1 verification = 18 runs, as in the live benchmark.
    tuned = [landscape.ratio(replay_tuner(landscape, seed, 14).pick) for seed in SEEDS]
    randomly = [landscape.ratio(replay_random(landscape, seed, 18).pick) for seed in SEEDS]
    assert min(tuned) > 0, "a pick that does not fit the memory limit"
    assert statistics.median(tuned) > statistics.median(randomly), (tuned, randomly)


def test_replay_is_deterministic_and_never_measures_a_configuration_twice(
    landscape: Landscape,
) -> None:
    first = replay_tuner(landscape, 3, 20, finish=False).measured
    assert first == replay_tuner(landscape, 3, 20, finish=False).measured
    keys = [c.model_dump_json() for c in first]
    assert len(keys) == len(set(keys)) == 20


def test_replayed_noise_follows_the_recorded_spread(landscape: Landscape) -> None:
    point = max(landscape.points, key=lambda p: p.spread)
    executor = ReplayExecutor(landscape, random.Random(0))
    draws = [executor.result(point.config).samples_per_s or 0.0 for _ in range(400)]
    assert len(set(draws)) > 1
    assert statistics.mean(draws) == pytest.approx(point.value, rel=0.02)
    steps = point.runs[0].measured_steps
    within = point.spread / 2.56 / steps**0.5
    assert landscape.run_noise > 0  # the landscape measured some configurations 3 times
    expected = (point.value or 0) * (within**2 + landscape.run_noise**2) ** 0.5
    assert statistics.stdev(draws) == pytest.approx(expected, rel=0.25)


def test_run_noise_leaves_out_the_first_run_the_repeats_were_chosen_on(
    landscape: Landscape,
) -> None:
    """The grid repeats the points whose first run was among the fastest; that run is biased
    upward, so only the repeats say how much one run moves."""
    point = next(p for p in landscape.points if p.status == "ok")
    run = point.runs[0]
    repeats = [run.model_copy(update={"samples_per_s": v}) for v in (950.0, 1050.0)]
    lucky = run.model_copy(update={"samples_per_s": 3000.0})
    points = [point.model_copy(update={"runs": [lucky, *repeats]})]
    fields = {name: getattr(landscape, name) for name in Landscape.model_fields}
    one = Landscape(**{**fields, "points": points})  # a new object: no cached noise
    assert one.run_noise == pytest.approx(statistics.stdev([950.0, 1050.0]) / 1000.0)


def test_replay_returns_the_recorded_data_wait_and_throughput_without_the_boundary(
    landscape: Landscape,
) -> None:
    """The climb reads both from a trial; a replay without them would judge another climb."""
    point = next(p for p in landscape.points if p.status == "ok")
    run = point.runs[0]
    recorded = [run.model_copy(update={"steady_samples_per_s": (run.samples_per_s or 0) * k,
                                       "data_wait_share": share})
                for k, share in ((1.2, 0.3), (1.1, 0.5), (1.3, 0.4))]  # fmt: skip
    fields = {name: getattr(landscape, name) for name in Landscape.model_fields}
    one = Landscape(**{**fields, "points": [point.model_copy(update={"runs": recorded})]})
    result = ReplayExecutor(one, random.Random(0)).result(point.config)
    assert result.data_wait_share == pytest.approx(0.4)  # the median over the runs
    assert result.steady_samples_per_s == pytest.approx((result.samples_per_s or 0) * 1.2)
    assert ReplayExecutor(landscape, random.Random(0)).result(point.config).data_wait_share is None


def test_a_shorter_window_is_replayed_with_proportionally_fewer_steps(
    landscape: Landscape,
) -> None:
    point = max(landscape.points, key=lambda p: p.runs[0].measured_s)
    run = point.runs[0]
    assert replayed_steps(point, None) == run.measured_steps
    assert replayed_steps(point, TrialOptions(max_measure_s=100.0)) == run.measured_steps
    half = TrialOptions(measured_steps=2, min_measure_s=run.measured_s / 2).floor()
    assert replayed_steps(point, half) == round(run.measured_steps / 2)
    fixed = TrialOptions(measured_steps=3, min_measure_s=0.0).floor()
    assert replayed_steps(point, fixed) == 3


def _base(landscape: Landscape) -> dict[str, object]:
    return {
        "global_batch_size": landscape.global_batch_size,
        "world_size": 2,
        "device": "cpu",
    }


def test_the_batch_size_finder_takes_the_largest_micro_batch_that_fits(
    landscape: Landscape,
) -> None:
    measure = replay_measure(landscape, random.Random(0))
    pick, trials = batch_size_finder(measure, _base(landscape), [1, 2], "bf16")
    assert pick is not None
    assert [t.config.grad_accum_steps for t in trials] == [2, 1][: len(trials)]
    assert all(t.config.parallel == "ddp" and t.config.amp == "bf16" for t in trials)
    fitting = [t for t in trials if t.fits]
    assert pick.config.micro_batch_size == max(t.config.micro_batch_size for t in fitting)


def test_the_deepspeed_rule_tries_stages_in_order_and_keeps_the_fastest(
    landscape: Landscape,
) -> None:
    measure = replay_measure(landscape, random.Random(0))
    pick, trials = deepspeed_rule(measure, _base(landscape), [1, 2], "bf16")
    assert pick is not None and pick.fits
    stages = [t.config.parallel for t in trials]
    assert stages == sorted(stages, key=["ddp", "fsdp"].index)  # DDP first, then FSDP
    assert all(t.config.num_workers == 0 and t.config.checkpoint_segments == 0 for t in trials)
    ddp_best = max((t for t in trials if t.config.parallel == "ddp" and t.fits),
                   key=lambda t: t.samples_per_s or 0.0)  # fmt: skip
    if pick.config.parallel == "fsdp":
        assert (pick.samples_per_s or 0) >= 1.05 * (ddp_best.samples_per_s or 0)
    else:
        assert pick == ddp_best


def test_a_configuration_outside_the_landscape_is_invalid_not_invented(
    landscape: Landscape,
) -> None:
    config = TrainConfig(global_batch_size=landscape.global_batch_size, num_workers=4)
    result = ReplayExecutor(landscape, random.Random(0)).result(config)
    assert result.status == "invalid" and result.samples_per_s is None


def test_the_memory_line_falls_in_the_widest_gap_not_inside_a_cluster() -> None:
    from autotune.bench.landscape import memory_line

    one_rank = [420, 424, 428, 430, 433]
    two_ranks = [820, 822, 825, 828, 831, 835, 840, 850, 860, 870]
    assert memory_line(one_rank + two_ranks) == (433 + 820) // 2
    # a gap that would leave under 20% (or over 90%) of the configurations fitting is not taken
    assert 820 <= memory_line([100, *two_ranks, 2000]) <= 870


def test_a_replayed_search_reports_its_finalists_and_whether_the_race_told_them_apart(
    landscape: Landscape,
) -> None:
    from autotune.search.evidence import runner_up_report

    verdicts = []
    for seed in SEEDS:
        tuner = make_replay_tuner(landscape, seed, 14)
        tuner.references()
        tuner.search()
        pick = tuner.verify(tuner.race())[0]
        replayed = replay_tuner(landscape, seed, 14)  # the same seed replays the same search
        assert replayed.pick == pick and pick in replayed.raced
        base = tuner.log.baseline()
        close = runner_up_report(tuner.log.records, pick, base.config if base else None)
        assert replayed.told_apart == (close.ruled_out if close else None)
        assert close is None or close.config in replayed.raced
        # the throughput the recommendation would report: the race mean, less the winner's luck
        runs = [r.samples_per_s or 0.0 for r in race.race_runs(tuner.log.records, pick).values()]
        assert replayed.estimate == pytest.approx(
            statistics.fmean(runs) * replayed.selection_factor
        )
        assert 0 < replayed.selection_factor <= 1
        verdicts.append(replayed.told_apart)
    assert any(v is not None for v in verdicts), "no seed raced a runner-up: nothing was checked"
