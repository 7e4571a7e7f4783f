"""The race's order: who is still in at the end outranks who left it, whatever their means."""

from __future__ import annotations

import math

from autotune.config import TrainConfig
from autotune.records import TrialRecord
from autotune.report import format_recommendation
from autotune.result import TrialResult
from autotune.search import race
from autotune.search.evidence import runner_up_report, simpler_choice
from tests.search.fakes import FakeExecutor, MiB, make_tuner, ok

BASELINE = TrainConfig(global_batch_size=32, device="cpu", parallel="ddp", world_size=2)
HOOK = BASELINE.model_copy(update={"comm_hook": "fp16"})
WORKER = BASELINE.model_copy(update={"num_workers": 1})


def runs(speeds: dict[TrainConfig, list[float | None]]) -> list[TrialRecord]:
    """Race records, round by round in the order given; None: not in that round."""
    records: list[TrialRecord] = []
    for n in range(max(len(s) for s in speeds.values())):
        for config, series in speeds.items():
            if n < len(series) and series[n] is not None:
                records.append(
                    TrialRecord(
                        number=len(records), role="race", status="ok", config=config,
                        samples_per_s=series[n], memory_used_bytes=100 * MiB, feasible=True,
                        race_round=n + 1,
                    )
                )  # fmt: skip
    return records


# A search of a user's translation model on a 2-core box: the compressing hook beat the
# baseline in each of three rounds (2% with confidence) and the baseline left the race; in
# round 4 the machine slowed down for the two still in. By their own means the baseline
# (three good rounds) outran the hook (three good and one slow), and was recommended.
SEEN = {
    BASELINE: [57.6, 57.6, 57.7],
    HOOK: [58.6, 58.4, 59.1, 41.4],
    WORKER: [42.8, 60.8, 45.3, 29.1],
}


def test_a_configuration_the_race_ruled_slower_never_outranks_one_still_in() -> None:
    records = runs(SEEN)
    assert race.compare(race.log_ratios(records, HOOK, BASELINE)) == "slower"
    assert race.mean_log_speed(records, BASELINE) > race.mean_log_speed(records, HOOK)
    ranked = race.ranking(records, [BASELINE, HOOK, WORKER])
    assert ranked[0] == HOOK
    assert ranked[-1] == BASELINE  # it left first


def test_the_still_in_are_ranked_by_their_means_over_the_same_rounds() -> None:
    records = runs({BASELINE: [50.0, 51.0, 50.0], HOOK: [60.0, 61.0, 60.0, 55.0],
                    WORKER: [62.0, 60.0, 61.0, 58.0]})  # fmt: skip
    assert race.ranking(records, [BASELINE, HOOK, WORKER]) == [WORKER, HOOK, BASELINE]


def test_the_runner_up_of_the_race_s_winner_is_never_reported_faster_than_it() -> None:
    # Before, the baseline won and its runner-up, the hook, read "1.02x [90%: 1.01-1.03] ...
    # too close to call".
    records = runs(SEEN)
    winner = race.ranking(records, race.raced(records))[0]
    report = runner_up_report(records, winner, BASELINE)
    assert report is not None and report.config == WORKER
    assert report.ratio is not None and report.ratio < 1 and report.ruled_out


def test_a_search_whose_machine_slows_after_the_baseline_left_recommends_the_race_s_winner() -> (
    None
):
    # The hook is 3% faster than the baseline at 0.4% noise; the hook with a worker is as fast
    # but swings by 10-20% a run, so the race never splits it from the hook. After round 3
    # (the 16th run) the machine runs at 70%: the baseline has left the race by then.
    space = {"parallel": ["ddp"], "world_size": [2], "comm_hook": ["none", "fp16"],
             "num_workers": [0, 1]}  # fmt: skip
    speeds = {("none", 0): 1000.0, ("fp16", 0): 1030.0, ("none", 1): 700.0, ("fp16", 1): 1030.0}
    swing = [1.0, 1.08, 0.85, 1.08, 0.8, 1.0]

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        true = speeds[(config.comm_hook, config.num_workers)]
        if (config.comm_hook, config.num_workers) == ("fp16", 1):
            true *= swing[before]
        slow = 0.7 if len(executor.runs) > 16 else 1.0
        return ok(config, true * slow * (1 + 0.004 * (before % 3)), 100.0)

    executor = FakeExecutor(outcome)
    tuner = make_tuner(executor, space, trials=4, top_k=2, race_rounds=4)
    recommendation = tuner.run([], "s.db", "s")
    records = tuner.log.records
    base = TrainConfig.model_validate({**recommendation.config.model_dump(), "comm_hook": "none"})
    assert race.last_round(records, base) == 3 < race.last_round(records, recommendation.config)
    assert (recommendation.config.comm_hook, recommendation.config.num_workers) == ("fp16", 0)
    assert recommendation.speedup is not None and recommendation.speedup > 1.02
    text = format_recommendation(recommendation)
    assert "numerics changed: comm_hook=fp16" in text
    # the baseline's mean (its three rounds before the slow stretch) reads above the pick's,
    # whose speed-up pairs those rounds: its cell says how many runs it rests on
    assert "(4 race runs, spread" in text and "(3 race runs)" in text


def test_a_simpler_pick_names_what_the_faster_finalist_changes_beyond_it() -> None:
    # Seen on a user's T5 (the baseline over the limit): both finalists ran bf16, the faster
    # accumulated 2 micro-steps; the output said the faster "changes more (amp=bf16)", which
    # the recommended changed as well.
    single = TrainConfig(global_batch_size=32, device="cpu", amp="bf16", num_workers=1)
    accumulating = single.model_copy(update={"grad_accum_steps": 2})
    records = runs({accumulating: [39.3, 38.8, 36.9, 38.3], single: [38.3, 39.8, 36.1, 36.3]})
    assert race.compare(race.log_ratios(records, single, accumulating)) != "faster"
    assert (
        race.prefer_simpler(records, race.ranking(records, race.raced(records)), None)[0] == single
    )
    said = simpler_choice(records, single, None)
    assert said.endswith(
        "changes more (3 knobs moved from the defaults against 2; it sets grad_accum_steps=2): "
        "the one that changes less is recommended"
    )
    # Where the faster one changes the arithmetic and the pick does not, that is what is named.
    fp32 = single.model_copy(update={"amp": "off"})
    records = runs({single: [40.0, 39.0, 41.0], fp32: [39.5, 39.2, 40.1]})
    assert "changes more (its numerics: amp=bf16)" in simpler_choice(records, fp32, None)


def test_a_numerics_change_whose_reported_speed_up_reaches_one_gives_way_to_the_baseline() -> None:
    # A bf16-built GPT-2's search recommended amp=bf16 at "1.02x [95%: 0.99-1.05]" the
    # baseline, with "numerics changed: amp=bf16": the race decides at one-sided 95% and saw it
    # faster, but the interval the output reports does not show the gain.
    bf16 = BASELINE.model_copy(update={"amp": "bf16"})
    gains = [0.005, 0.04, 0.015, 0.03]  # log-ratios: faster one-sided at 95%, not two-sided
    records = runs({BASELINE: [1000.0] * 4, bf16: [1000.0 * math.exp(g) for g in gains]})
    ranked = race.ranking(records, race.raced(records))
    assert ranked[0] == bf16
    assert race.compare(race.log_ratios(records, BASELINE, bf16)) == "faster"
    gain = race.speedup(records, bf16, BASELINE)
    assert gain is not None and gain[1] < 1.0 < gain[2]
    assert race.prefer_simpler(records, ranked, BASELINE)[0] == BASELINE
    assert race.prefer_simpler(records, ranked, None)[0] == bf16  # no baseline to give way to
    said = simpler_choice(records, BASELINE, BASELINE)
    assert said.startswith("ddpx2 amp=bf16") and "its numerics: amp=bf16" in said
    assert "but its 95% interval over this one reaches 1.0, and it changes more" in said
    other = runner_up_report(records, BASELINE, BASELINE)
    assert other is not None and other.config == bf16 and other.faster
    assert other.rounds_to_split is None  # the race has told them apart: no projection
    clearer = runs({BASELINE: [1000.0] * 4, bf16: [1030.0, 1031.0, 1029.0, 1030.5]})
    ranked = race.ranking(clearer, race.raced(clearer))
    assert race.prefer_simpler(clearer, ranked, BASELINE)[0] == bf16  # a gain its interval shows
