"""The search's phases with a scripted executor: what is run, skipped, stored and recommended."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import optuna
import pytest
import torch

from autotune.config import TrainConfig
from autotune.errors import DOUBLE_INPUTS, ConfigError, SearchError
from autotune.recommendation import Recommendation
from autotune.records import TrialRecord
from autotune.report import format_recommendation, format_study
from autotune.result import TrialResult
from autotune.runner.request import TrialOptions
from autotune.runner.workload import BUILDING, WorkloadSpec
from autotune.search import race
from autotune.search.finishing import ROOM_ATTR
from autotune.search.lessons import failing_values
from autotune.search.progress import Reporter
from autotune.search.proposer import Proposal
from autotune.search.settings import make_settings
from autotune.search.study import make_sampler
from tests.search.fakes import PLATFORM, FakeExecutor, MiB, Said, failed, make_tuner, ok

SPACE = {
    "parallel": ["ddp"],
    "world_size": [2],
    "grad_accum_steps": [1, 2, 4],
    "num_workers": [0, 1],
}


def speed(config: TrainConfig) -> float:
    """accum 1 is fastest; a DataLoader worker helps."""
    return {1: 1000.0, 2: 900.0, 4: 800.0}[config.grad_accum_steps] + 50 * config.num_workers


def memory(config: TrainConfig) -> float:
    """100 MiB per sample of micro-batch: 800, 400, 200 MiB."""
    return 100.0 * config.micro_batch_size


def steady(config: TrainConfig, before: int) -> TrialResult:
    return ok(config, speed(config), memory(config))


def test_the_baseline_accumulates_only_as_far_as_needed_to_fit() -> None:
    executor = FakeExecutor(steady)
    tuner = make_tuner(executor, SPACE, limit_mib=500)
    baseline = tuner.baseline()
    assert baseline.config is not None and baseline.config.grad_accum_steps == 2
    assert baseline.fits
    tried = [r.config.grad_accum_steps for r in tuner.log.records if r.config]
    assert tried == [1, 2]  # accum 1 ran over the limit, accum 4 was never needed
    assert tuner.baseline() == baseline  # settled: asking again runs nothing
    assert len(executor.runs) == 2


def test_a_baseline_over_the_limit_at_every_accumulation_is_said_to_be_so() -> None:
    # DDP's buckets and state hold the peak whatever the micro-batch (a user's T5 under a tight
    # budget): accumulation cuts nothing, and the search goes on without a baseline that fits.
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        return ok(config, speed(config), 600 if config.num_workers == 0 else 400)

    tuner = make_tuner(FakeExecutor(outcome), SPACE, limit_mib=500, trials=4, race_rounds=2)
    tuner.reporter = phases = Said()
    recommendation = tuner.run([], "s.db", "s")
    assert recommendation.baseline is not None and not recommendation.baseline.fits
    assert recommendation.baseline_over_limit and recommendation.config.num_workers == 1
    said = [line for line in phases.lines if line.startswith("baseline: over the limit")]
    assert said == [
        "baseline: over the limit at accumulation 2, the last tried; it stays the reference, a "
        "speed-up over it is over a configuration that does not fit, and the race leaves it out"
    ]
    assert "the baseline does not fit" in format_recommendation(recommendation)


def test_a_configuration_is_never_measured_twice_and_the_budget_counts_measurements() -> None:
    executor = FakeExecutor(steady)
    tuner = make_tuner(executor, SPACE, trials=6, climb=False)  # the sampler repeats itself
    tuner.baseline()
    tuner.search()
    keys = Counter(r.config.key() for r in executor.runs)
    assert max(keys.values()) == 1 and len(keys) == 6
    statuses = Counter(r.status for r in tuner.log.records)
    assert statuses["duplicate"] >= 1  # proposed again, answered from the earlier trial
    assert sum(r.counts_toward_budget for r in tuner.log.records) == 6


def test_a_skipped_trial_stores_its_memory_as_a_prediction_not_a_measurement(
    tmp_path: Path,
) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    executor = FakeExecutor(
        lambda c, n: (
            failed(c, "oom", "rank 0: OutOfMemoryError")
            if c.micro_batch_size == 8
            else steady(c, n)
        )
    )
    tuner = make_tuner(executor, SPACE, storage=storage)
    tuner.baseline()  # accum 1 runs out of memory, accum 2 fits
    study = tuner.proposer.study
    hungrier = TrainConfig(
        global_batch_size=16, parallel="ddp", world_size=2, device="cpu", num_workers=1
    )
    proposal = Proposal(study.ask(), hungrier)
    decided = tuner.decide(proposal)
    assert decided is not None and decided.status == "skipped"
    assert decided.memory_used_bytes is None  # nothing was measured
    assert decided.predicted_memory_bytes is not None
    stored = tuner.proposer.record(proposal, decided)
    attrs = study.trials[stored.number].user_attrs
    assert "peak_memory_MiB" not in attrs and "predicted_peak_memory_MiB" in attrs
    assert study.trials[stored.number].system_attrs["constraints:memory"] > 0
    rows = format_study(storage, None).splitlines()[2:]
    line = next(row for row in rows if " skipped " in row)
    assert "predicted" in line


@pytest.mark.timeout(60)
def test_a_cluster_that_places_nothing_ends_the_search_with_one_line() -> None:
    tuner = make_tuner(FakeExecutor(steady, refuse=True), SPACE, trials=5)
    with pytest.raises(SearchError, match="could place none of the last 3 trials") as raised:
        tuner.run([], "s.db", "s")
    assert "\n" not in str(raised.value)


def test_verification_falls_back_to_the_next_finalist() -> None:
    best = {"grad_accum_steps": 1, "num_workers": 1}

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        is_best = all(getattr(config, k) == v for k, v in best.items())
        if is_best and before == 4:  # search, three race rounds, then the verification run
            return failed(config, "crashed", "rank 1: killed by SIGABRT")
        return steady(config, before)

    executor = FakeExecutor(outcome)
    recommendation = make_tuner(executor, SPACE, trials=6).run([], "s.db", "s")
    assert recommendation.config.grad_accum_steps == 1 and recommendation.config.num_workers == 0
    crashed = [r for r in recommendation.trials if r.role == "verify" and r.status == "crashed"]
    assert crashed and crashed[0].config is not None and crashed[0].config.num_workers == 1
    assert recommendation.memory_confirmed


class _Racing(Said):
    """Knows once the race has begun."""

    racing = False

    def phase(self, text: str) -> None:
        super().phase(text)
        self.racing = self.racing or text.startswith("race round")


def test_every_finalist_failing_in_the_race_ends_clearly_keeping_every_trial() -> None:
    said = _Racing()

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        return ok(config, speed(config), 2000.0) if said.racing else steady(config, before)

    executor = FakeExecutor(outcome)
    tuner = make_tuner(executor, SPACE, trials=4)
    tuner.reporter = said
    with pytest.raises(SearchError, match="every finalist failed in the race") as raised:
        tuner.run([], "s.db", "s")
    # each went over in a later run, so each was raced again with room, and went over too
    assert "raced again where each was expected to leave room, none fit" in str(raised.value)
    study = tuner.proposer.study
    finished = [t for t in study.trials if t.state != optuna.trial.TrialState.RUNNING]
    assert len(finished) == len(study.trials) == len(tuner.log.records)
    assert sum(r.role == "race" for r in tuner.log.records) >= 2


def test_finalists_over_the_limit_in_the_race_race_again_at_more_accumulation() -> None:
    # A search of a model that barely fits: its fastest configurations fit in their search
    # trials and measure over the limit in the race. The search ended with no recommendation.
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        if config.grad_accum_steps == 1:
            return ok(config, speed(config), 800.0 if before == 0 else 1100.0)
        return steady(config, before)

    said = Said()
    study = optuna.create_study(direction="maximize", sampler=make_sampler(0))
    tuner = make_tuner(FakeExecutor(outcome), SPACE, trials=4, study=study)
    tuner.reporter = said
    recommendation = tuner.run([], "s.db", "s")
    assert recommendation.config.grad_accum_steps == 2
    assert recommendation.memory_confirmed
    assert "grad_accum_steps 1 -> 2" in recommendation.made_room
    assert "nothing predicted: the race shows it" in recommendation.made_room
    raced = race.race_runs(recommendation.trials, recommendation.config)
    assert raced and all(r.fits for r in raced.values())
    assert any("every finalist went over the memory limit" in line for line in said.lines)
    assert "moved to fit: every finalist went over the memory limit" in format_recommendation(
        recommendation
    )
    stored = tuner.log.study.user_attrs[ROOM_ATTR]  # a resumed search races the same
    assert recommendation.config.model_dump(mode="json") in [m["config"] for m in stored]
    executor = FakeExecutor(outcome)  # run again: the race, with room, is stored whole
    again = make_tuner(executor, SPACE, trials=4, study=study).run([], "s.db", "s")
    assert [r.config for r in executor.runs] == [recommendation.config]  # the verification
    assert again.config == recommendation.config and again.made_room == recommendation.made_room


def test_finalists_over_the_limit_with_no_room_in_the_space_say_what_would_make_some() -> None:
    said = _Racing()

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        return ok(config, speed(config), 2000.0) if said.racing else steady(config, before)

    tuner = make_tuner(FakeExecutor(outcome), {**SPACE, "grad_accum_steps": [1]}, trials=2)
    tuner.reporter = said
    with pytest.raises(SearchError, match="every finalist failed in the race") as raised:
        tuner.run([], "s.db", "s")
    text = str(raised.value)
    assert "no larger accumulation or checkpointing of the space (nor persistent" in text
    assert "workers or compiling off) is expected to fit" in text
    assert "(60.0%, 60.0%)" in text  # 800 MiB in the search, 2,000 in the race
    assert "raise --memory-budget, or allow larger values of grad_accum_steps" in text


def test_a_finalist_that_crashed_in_the_race_is_not_moved_to_make_room() -> None:
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        if before >= 1:
            return failed(config, "crashed", "rank 1: killed by SIGABRT")
        return steady(config, before)

    tuner = make_tuner(FakeExecutor(outcome), SPACE, trials=4)
    with pytest.raises(SearchError, match="every finalist failed in the race") as raised:
        tuner.run([], "s.db", "s")
    assert "leave room" not in str(raised.value)
    assert ROOM_ATTR not in tuner.log.study.user_attrs


def test_a_search_where_every_trial_failed_says_so_not_that_nothing_fits() -> None:
    # A model whose optimizer refuses its gradients failed every trial, and the search ended
    # with "no configuration fits the memory budget ...; raise --memory-budget".
    def outcome(config: TrainConfig, before: int) -> TrialResult:  # each its own error
        word = {1: "one", 2: "two", 4: "four"}[config.grad_accum_steps]
        return failed(config, "error", f"rank 0: RuntimeError: {word} bad")

    with pytest.raises(SearchError) as raised:
        make_tuner(FakeExecutor(outcome), SPACE, trials=3).run([], "s.db", "s")
    text = str(raised.value)
    assert text.startswith("no trial ran: all 3 failed (trial 0: rank 0: RuntimeError: one bad)")
    assert "memory" not in text and "autotune show" in text
    # a fix the ranks named is said whole, however long the error before it
    fix = f"{DOUBLE_INPUTS}, as numpy arrays and pandas give them: make them float32"
    long = f"rank 0: warm-up step 1: RuntimeError: {'x' * 300} ({fix})"
    with pytest.raises(SearchError) as raised:
        make_tuner(FakeExecutor(lambda c, n: failed(c, "error", long)), SPACE, trials=2).run(
            [], "s.db", "s"
        )
    assert str(raised.value).endswith(f"...; {fix}); every trial is stored: see `autotune show`")


@pytest.mark.parametrize("modes", [["ddp", "fsdp"], ["ddp"]])
def test_a_search_whose_trials_all_fail_alike_stops_after_three(modes: list[str]) -> None:
    # A step that fails whatever the configuration (a path the ranks cannot read) failed every
    # trial of the budget. Three alike, across the space's parallel modes, end the search.
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        if config.num_workers:  # the same error, as a DataLoader worker words it
            return failed(config, "error", "rank 0: OSError: Caught OSError in DataLoader worker")
        step = 1 + config.grad_accum_steps  # which rank and step it failed in do not matter
        return failed(config, "error", f"rank {step % 2}: warm-up step {step}: OSError: no data")

    space = {**SPACE, "parallel": modes}
    executor = FakeExecutor(outcome)
    with pytest.raises(SearchError, match="step fails whatever the configuration: 3 of") as e:
        make_tuner(executor, space, trials=12).run([], "s.db", "s")
    assert str(e.value).count("OSError: no data") == 1 and "Caught" not in str(e.value)
    assert {r.config.parallel for r in executor.runs} == set(modes)
    assert len(executor.runs) < 12


def test_a_baseline_whose_ranks_cannot_build_the_model_stops_the_search() -> None:
    # A factory that builds on the meta device failed as each rank built it: three trials and
    # the standard recipe ran before the search stopped, though no configuration was applied.
    why = "--model 'm:make' builds its tensors on the meta device (a.weight)"

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        return failed(config, "error", f"rank 0: {BUILDING}: {why}")

    executor = FakeExecutor(outcome)
    with pytest.raises(SearchError) as raised:
        make_tuner(executor, SPACE, trials=6).run([], "s.db", "s")
    assert str(raised.value).startswith(f"the model does not build in a trial's ranks: {why} (")
    assert len(executor.runs) == 1


def test_the_fix_the_ranks_named_is_said_whole_when_the_search_stops() -> None:
    # A forward making a CUDA tensor on a CPU machine: the stop cut the ranks' hint mid-word
    # ("... or register them as buffe...").
    from autotune.runner.hints import cuda_hint

    hint = cuda_hint(AssertionError("Torch not compiled with CUDA enabled"), torch.device("cpu"))
    assert hint is not None and hint.startswith("the model asks for CUDA, which this machine")
    assert cuda_hint(AssertionError("Torch not compiled with CUDA enabled"),
                     torch.device("cuda")) is None  # fmt: skip
    assert cuda_hint(RuntimeError("shapes differ"), torch.device("cpu")) is None
    error = "AssertionError: Torch not compiled with CUDA enabled " + "x" * 200

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        return failed(config, "error", f"rank 0: warm-up step 1: {error} ({hint})")

    with pytest.raises(SearchError, match="fails whatever the configuration") as raised:
        make_tuner(FakeExecutor(outcome), {**SPACE, "parallel": ["ddp"]}, trials=6).run(
            [], "s.db", "s"
        )
    assert f"xxx...; {hint}, and none ran" in str(raised.value)


def test_failures_of_one_parallel_mode_alone_do_not_stop_the_search() -> None:
    # DDP failing alike says nothing of single-device training, which the space also holds.
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        if config.parallel == "ddp":
            return failed(config, "error", "rank 1: warm-up step 1: RuntimeError: no NCCL")
        return steady(config, before)

    space = {**SPACE, "parallel": ["ddp", "single"], "world_size": [1, 2]}
    recommendation = make_tuner(FakeExecutor(outcome), space, trials=8).run([], "s.db", "s")
    assert recommendation.config.parallel == "single"


def test_a_baseline_failing_as_the_traced_step_did_ends_the_search_after_one_trial() -> None:
    # The step itself fails (AdamW refuses sparse gradients), whatever the configuration: the
    # trace raised it before any trial, the baseline confirms it, and nothing more runs.
    from autotune.runner.fake_memory import MODEL_AT_FAULT, TraceError, trace_step

    spec = WorkloadSpec(model="tests.fixtures.sparse:Lookups", optimizer="torch.optim:AdamW")
    with pytest.raises(TraceError) as traced:
        trace_step(spec, 8)
    assert str(traced.value).endswith(MODEL_AT_FAULT)
    cause = str(traced.value).removesuffix(MODEL_AT_FAULT)  # what a rank raises, as it says it
    rank_says = f"rank 0: warm-up step 1: {cause}"
    executor = FakeExecutor(lambda config, before: failed(config, "error", rank_says))
    space = {"parallel": ["ddp", "single"], "world_size": [1, 2], "amp": ["off", "bf16"]}
    tuner = make_tuner(executor, space, workload=spec, predict_memory=True, global_batch_size=16)
    with pytest.raises(SearchError, match="fails whatever the configuration") as raised:
        tuner.run([], "s.db", "s")
    assert len(executor.runs) == 1 and "sparse gradients" in str(raised.value)
    assert "\n" not in str(raised.value) and "--optimizer" in str(raised.value)


@pytest.mark.slow  # one message from a search
def test_a_search_stopped_by_a_batch_of_strings_says_a_collate_function_is_the_fix() -> None:
    from autotune.runner.fake_memory import MODEL_AT_FAULT, TraceError, trace_step
    from autotune.runner.hints import input_hint

    spec = WorkloadSpec(model="tests.fixtures.texts:Net")
    with pytest.raises(TraceError) as traced:
        trace_step(spec, 8)
    cause = str(traced.value).removesuffix(MODEL_AT_FAULT)
    rank_says = f"rank 0: warm-up step 1: {cause} ({input_hint((('a', 'b'),), {})})"
    executor = FakeExecutor(lambda config, before: failed(config, "error", rank_says))
    space = {"parallel": ["ddp", "single"], "world_size": [1, 2]}
    tuner = make_tuner(executor, space, workload=spec, predict_memory=True, global_batch_size=16)
    with pytest.raises(SearchError, match="fails whatever the configuration") as raised:
        tuner.run([], "s.db", "s")
    assert "; the model was given a tuple of 2 str as input 0, not a tensor: a collate " in str(
        raised.value
    )


def test_measurements_noisier_than_the_tolerance_are_not_called_verified() -> None:
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        noisy = speed(config) * (0.7 if before == 1 else 1.0)  # the first race round: 30% off
        return ok(config, noisy, memory(config))

    recommendation = make_tuner(FakeExecutor(outcome), SPACE, trials=6).run([], "s.db", "s")
    assert recommendation.spread > 0.10
    assert recommendation.throughput_tolerance == 0.10  # fixed, never the spread
    assert recommendation.throughput_verdict == "too noisy"
    assert not recommendation.verified and not recommendation.throughput_confirmed
    text = format_recommendation(recommendation)
    assert "too noisy" in text and "NOT verified" in text


def test_a_failed_baseline_is_reported_with_its_reason_not_as_1x() -> None:
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        if config.grad_accum_steps == 1 and config.num_workers == 0:
            return failed(config, "crashed", "rank 1: killed by SIGSEGV in measured step 2")
        return steady(config, before)

    recommendation = make_tuner(FakeExecutor(outcome), SPACE, trials=6).run([], "s.db", "s")
    assert recommendation.baseline is not None and recommendation.baseline.status == "crashed"
    assert recommendation.baseline_failed and recommendation.speedup is None
    text = format_recommendation(recommendation)
    assert "baseline crashed: rank 1: killed by SIGSEGV" in text
    assert "1.00x" not in text


def test_the_race_corrects_a_lucky_first_measurement_and_reports_intervals() -> None:
    rng = random.Random(0)

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        true = speed(config)
        lucky = config.grad_accum_steps == 2 and config.num_workers == 1 and before == 0
        return ok(config, 1500.0 if lucky else true * rng.gauss(1, 0.01), memory(config))

    tuner = make_tuner(FakeExecutor(outcome), SPACE, trials=6)
    recommendation = tuner.run([], "s.db", "s")
    # the search's best single sample was the lucky one; the race found the faster config
    assert (recommendation.config.grad_accum_steps, recommendation.config.num_workers) == (1, 1)
    assert recommendation.samples_per_s == pytest.approx(1050, rel=0.02)
    low, high = recommendation.samples_per_s_low, recommendation.samples_per_s_high
    assert low is not None and high is not None and low < recommendation.samples_per_s < high
    # the baseline (accum 1, no worker) ran in the same rounds: a paired speed-up with interval
    assert recommendation.speedup == pytest.approx(1050 / 1000, rel=0.02)
    assert recommendation.speedup_low is not None and recommendation.speedup_high is not None
    assert recommendation.speedup_low < recommendation.speedup < recommendation.speedup_high
    rounds = Counter(r.race_round for r in recommendation.trials if r.role == "race")
    assert rounds[1] == 3  # two finalists and the baseline, interleaved round by round


@pytest.mark.parametrize("lucky", [1, 0], ids=["a search trial", "the baseline"])
def test_the_race_mean_decides_not_the_search_s_lucky_sample(lucky: int) -> None:
    # The lucky configuration is truly 4% slower, measured 30% fast once in the search, and the
    # race's noise (3%) is too wide to call 4% with confidence in 4 rounds: the old rule (keep
    # the search's best unless beaten with confidence) kept the slower one.
    rng = random.Random(3)
    flat = {"parallel": ["ddp"], "world_size": [2], "num_workers": [0, 1]}

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        true = 960.0 if config.num_workers == lucky else 1000.0
        bump = 1.3 if config.num_workers == lucky and before == 0 else 1.0
        return ok(config, true * bump * rng.gauss(1, 0.03), 100.0)

    tuner = make_tuner(FakeExecutor(outcome), flat, trials=2, top_k=2, race_rounds=4)
    recommendation = tuner.run([], "s.db", "s")
    records = tuner.log.records
    raced = [r for r in records if r.role == "race"]
    assert len(raced) >= 2 * 2
    fastest, other = race.ranking(records, race.raced(records))
    assert fastest.num_workers == 1 - lucky  # the race's mean ranks the truly faster one first
    # the mean decided the ranking: a confident test would have left the question open
    assert race.compare(race.log_ratios(records, other, fastest)) == "open"
    # ... and between two the race cannot split, the one that moves fewer knobs is recommended
    assert recommendation.config.num_workers == 0
    assert bool(recommendation.simpler_choice) == (fastest.num_workers == 1)
    if recommendation.simpler_choice:
        assert "could not tell it from this one" in recommendation.simpler_choice


def test_race_and_verification_runs_measure_the_floor_and_the_search_measures_until_sure() -> None:
    executor = FakeExecutor(steady)
    tuner = make_tuner(executor, SPACE, trials=4, min_measure_s=1.5, max_measure_s=8.0)
    tuner.run([], "s.db", "s")
    roles = [r.role for r in tuner.log.records if r.status not in ("duplicate", "skipped")]
    assert len(roles) == len(executor.runs) and "race" in roles
    for role, request in zip(roles, executor.runs, strict=True):
        options = request.options
        if role == "race":  # the rounds are the evidence: each run measures the floor
            assert (options.min_measure_s, options.max_measure_s) == (1.5, 1.5)
        elif role == "verify":  # a fixed multiple of a race run: it checks their estimate
            factor = tuner.settings.finishing.verify_factor
            assert options.min_measure_s == options.max_measure_s == 1.5 * factor
        else:
            assert options.max_measure_s == 8.0 and options.target_interval > 0


def test_the_floor_of_a_window_without_a_minimum_time_is_its_fixed_steps() -> None:
    options = TrialOptions(measured_steps=7, min_measure_s=0.0, max_measure_s=5.0)
    assert options.floor().target_interval == 0  # exactly measured_steps
    assert TrialOptions(min_measure_s=2.0).floor().max_measure_s == 2.0


def test_search_trials_are_pruned_against_the_incumbent_and_the_sampler_hears_it() -> None:
    executor = FakeExecutor(steady)
    tuner = make_tuner(executor, SPACE, trials=4, prune_ratio=0.5)
    tuner.baseline()
    tuner.search()
    baseline, *search = executor.runs
    assert baseline.options.prune_below_samples_per_s is None  # nothing to compare with yet
    assert all(r.options.prune_below_samples_per_s for r in search)
    best = max(r.samples_per_s or 0 for r in tuner.log.records if r.fits)
    assert search[-1].options.prune_below_samples_per_s <= 0.5 * best  # type: ignore[operator]

    record = TrialRecord(
        number=-1, role="search", status="pruned", config=baseline.config, samples_per_s=10.0
    )
    stored = tuner.log.write(record)
    trial = tuner.proposer.study.trials[stored.number]
    assert trial.state == optuna.trial.TrialState.PRUNED and trial.intermediate_values == {0: 10.0}
    assert not stored.fits and stored.counts_toward_budget  # it ran, it cost, it never wins


def test_the_baseline_stops_accumulating_when_accumulation_does_not_cut_its_memory() -> None:
    # On CPU a rank's memory is mostly the process: accumulation cannot make DDP fit.
    executor = FakeExecutor(lambda c, n: ok(c, speed(c), 900))
    tuner = make_tuner(executor, SPACE, limit_mib=500)
    baseline = tuner.baseline()
    assert not baseline.fits
    assert [r.config.grad_accum_steps for r in executor.runs] == [1, 2]  # not 4 as well


def test_two_race_runs_far_apart_give_an_interval_that_stays_above_zero() -> None:
    from autotune.search.evidence import recommend

    config = TrainConfig(global_batch_size=16, device="cpu")
    runs = [
        TrialRecord(number=n, role="race", status="ok", config=config, samples_per_s=speed,
                    memory_used_bytes=100 * MiB, feasible=True, race_round=n + 1)
        for n, speed in enumerate((100.0, 10.0))
    ]  # fmt: skip
    r = recommend(runs, config, None, budget_bytes=1000 * MiB, limit_bytes=900 * MiB,
                  platform=PLATFORM, exclusions=[], storage="s", study_name="s")  # fmt: skip
    assert r.samples_per_s == 55.0
    assert r.samples_per_s_low == 0.0 and r.samples_per_s_high is not None


def test_a_winner_whose_step_time_kept_rising_is_recommended_with_a_caveat() -> None:
    from autotune.search.evidence import recommend

    config = TrainConfig(global_batch_size=16, device="cpu")

    def runs(drifts: tuple[float | None, ...]) -> list[TrialRecord]:
        return [
            TrialRecord(number=n, role="race", status="ok", config=config, samples_per_s=100.0,
                        memory_used_bytes=100 * MiB, feasible=True, race_round=n + 1,
                        step_time_drift=d)
            for n, d in enumerate(drifts)
        ]  # fmt: skip

    def caveats(drifts: tuple[float | None, ...]) -> list[str]:
        r = recommend(runs(drifts), config, None, budget_bytes=1000 * MiB,
                      limit_bytes=900 * MiB, platform=PLATFORM, exclusions=[], storage="s",
                      study_name="s")  # fmt: skip
        if r.throughput_caveats:
            assert f"throughput caveat: {r.throughput_caveats[0]}" in format_recommendation(r)
        return r.throughput_caveats

    assert caveats((None, None)) == []
    (said,) = caveats((1.4, None, 2.75))
    assert said.startswith("step time rose 2.8x over the measured steps")
    assert "in 2 of its 3 runs" in said and "raise --warmup-steps" in said
    (said,) = caveats((0.5, None))
    assert said.startswith("step time fell to 0.50x") and "in 1 of its 2 runs" in said


def test_the_recommendation_says_whether_the_race_could_tell_the_runner_up_apart() -> None:
    # The fastest is accum 1 with a worker (1050); the baseline, accum 1 without, is 1000; the
    # other finalist 900 or 950. At 1% noise the race rules the runner-up out; at 8% noise four
    # rounds cannot, and the report says so rather than implying a clear winner.
    space = {**SPACE, "grad_accum_steps": [1, 2]}

    def make(noise: float) -> Recommendation:
        rng = random.Random(1)

        def outcome(config: TrainConfig, before: int) -> TrialResult:
            return ok(config, speed(config) * rng.gauss(1, noise), memory(config))

        tuner = make_tuner(FakeExecutor(outcome), space, trials=4, top_k=3, race_rounds=4)
        return tuner.run([], "s.db", "s")

    quiet = make(0.01)
    assert quiet.runner_up is not None
    assert (quiet.runner_up.config.grad_accum_steps, quiet.runner_up.config.num_workers) == (2, 1)
    assert quiet.runner_up.ruled_out and quiet.runner_up.rounds >= 2
    low, high = quiet.runner_up.ratio_low, quiet.runner_up.ratio_high
    assert low is not None and high is not None and low < quiet.runner_up.ratio < high < 1  # type: ignore[operator]
    assert quiet.runner_up.ratio == pytest.approx(950 / 1050, rel=0.02)
    assert "slower with confidence" in format_recommendation(quiet)

    noisy = make(0.08)
    assert noisy.runner_up is not None and not noisy.runner_up.ruled_out
    assert noisy.runner_up.ratio_high is not None and noisy.runner_up.ratio_high > 1
    assert noisy.runner_up.config != noisy.baseline.config  # type: ignore[union-attr]
    assert "too close to call" in format_recommendation(noisy)
    assert noisy.runner_up.rounds_to_split is not None
    assert f"--race-rounds {noisy.runner_up.rounds_to_split}" in format_recommendation(noisy)


def test_a_search_run_again_with_more_rounds_goes_on_with_its_race() -> None:
    # At 8% noise four rounds cannot split the finalists (above); the same study run again
    # with eight keeps its four stored rounds, runs only rounds 5-8, and nothing else again.
    space = {**SPACE, "grad_accum_steps": [1, 2]}
    rng = random.Random(1)

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        return ok(config, speed(config) * rng.gauss(1, 0.08), memory(config))

    study = optuna.create_study(direction="maximize", sampler=make_sampler(0))
    first = make_tuner(FakeExecutor(outcome), space, study=study, trials=4, top_k=3, race_rounds=4)
    close = first.run([], "s", "s").runner_up
    assert close is not None and not close.ruled_out and close.rounds >= 3
    assert close.rounds_to_split is not None and close.rounds_to_split > 4  # a projection
    stored = {r.number for r in first.log.records}

    executor = FakeExecutor(outcome)
    again = make_tuner(executor, space, study=study, trials=4, top_k=3, race_rounds=8)
    after = again.run([], "s", "s")
    new = [r for r in again.log.records if r.number not in stored]
    assert {r.role for r in new} == {"race", "verify"}
    assert min(r.race_round or 0 for r in new if r.role == "race") == 5
    assert len(executor.runs) == len(new)
    assert after.runner_up is not None and after.runner_up.rounds > 4

    # Run a third time with the same rounds: the race is stored whole, nothing of it runs.
    executor = FakeExecutor(outcome)
    make_tuner(executor, space, study=study, trials=4, top_k=3, race_rounds=8).run([], "s", "s")
    assert [r.options.max_measure_s for r in executor.runs] == [
        again.settings.finishing.verify_factor * again.settings.measurement.min_measure_s
    ]


def test_the_baseline_is_never_the_runner_up() -> None:
    flat = {"parallel": ["ddp"], "world_size": [2], "num_workers": [0, 1]}

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        return ok(config, 1000.0 + 100 * config.num_workers, 100.0)

    recommendation = make_tuner(FakeExecutor(outcome), flat, trials=2, top_k=2).run([], "s", "s")
    assert recommendation.config.num_workers == 1
    assert recommendation.runner_up is None  # the only other finalist is the baseline
    assert "runner-up" not in format_recommendation(recommendation)


def test_a_configuration_another_driver_claimed_first_is_not_measured_again() -> None:
    import time

    from autotune.search.storage import OWNER_ATTR

    executor = FakeExecutor(lambda c, n: ok(c, speed(c), 100))
    tuner = make_tuner(executor, SPACE)
    earlier = tuner.proposer.study.ask()  # another driver's trial, asked first
    proposal = tuner.proposer.propose()
    assert proposal.config is not None
    held = {"driver": "other-host:1:1", "key": proposal.config.key(), "expires": time.time() + 60}
    earlier.set_user_attr(OWNER_ATTR, held)
    decided = tuner.decide(proposal)
    assert decided is not None and decided.status == "duplicate"
    assert f"another driver's trial {earlier.number}" in decided.message
    # a later claim is the other driver's to give up: this one runs it
    later = tuner.proposer.study.ask()
    earlier.set_user_attr(OWNER_ATTR, {**held, "key": "none"})
    later.set_user_attr(OWNER_ATTR, {**held})
    assert tuner.decide(proposal) is None


@pytest.mark.timeout(60)
def test_a_baseline_another_driver_measured_in_another_role_ends_the_baseline() -> None:
    # Another driver's baseline at accumulation 1 did not fit, and its search then measured
    # the configuration the baseline would try next: this driver takes that measurement
    # instead of asking for it again and again.
    executor = FakeExecutor(steady)
    tuner = make_tuner(executor, SPACE, limit_mib=500)
    base = {"global_batch_size": 16, "parallel": "ddp", "world_size": 2, "device": "cpu"}
    tuner._run_one(TrainConfig(**base, grad_accum_steps=1), "baseline")  # 800 MiB: over
    measured = tuner._run_one(TrainConfig(**base, grad_accum_steps=2), "search")[0]  # 400 MiB
    runs = len(executor.runs)
    record = tuner.baseline()
    assert record.number == measured.number and record.fits
    assert len(executor.runs) == runs  # nothing measured twice
    duplicates = [r for r in tuner.log.records if r.status == "duplicate"]
    assert len(duplicates) <= 1


LSTM_BF16 = (
    "rank 0: warm-up step 1: RuntimeError: could not create a primitive descriptor for the LSTM "
    "forward propagation primitive"
)


def test_a_value_that_fails_where_its_one_knob_neighbour_ran_is_not_run_again() -> None:
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        if config.amp == "bf16":
            return failed(config, "error", LSTM_BF16)
        return ok(config, speed(config), memory(config))

    executor = FakeExecutor(outcome)
    space = {**SPACE, "amp": ["off", "bf16"]}
    tuner = make_tuner(executor, space, trials=12, climb=True)
    recommendation = tuner.run([], "s.db", "s")
    assert executor.ran(amp="bf16") == 1  # every later bf16 proposal is decided, not run
    skipped = [
        t
        for t in recommendation.trials
        if t.config and t.config.amp == "bf16" and t.status == "skipped"
    ]
    assert skipped, "the search proposed bf16 again and was told why not"
    assert all("amp=bf16 failed in trial" in t.message for t in skipped)
    assert "could not create a primitive descriptor" in skipped[0].message
    learnt = [e for e in recommendation.exclusions if e.knob == "amp"]
    assert [e.value for e in learnt] == ["bf16"]
    assert "otherwise the same, ran" in learnt[0].reason


def test_a_failure_is_pinned_on_a_knob_only_by_a_neighbour_one_knob_away_that_ran() -> None:
    base = TrainConfig(global_batch_size=16, parallel="ddp", world_size=2)
    bf16 = base.model_copy(update={"amp": "bf16", "num_workers": 1})
    records = [
        TrialRecord(number=0, role="baseline", status="ok", config=base, samples_per_s=10.0),
        TrialRecord(number=1, role="search", status="error", config=bf16, message=LSTM_BF16),
    ]
    assert failing_values(records) == []  # two knobs apart: either may be the cause
    alone = bf16.model_copy(update={"num_workers": 0})
    echo = "rank 1: RuntimeError: Connection closed by peer"
    assert (
        failing_values(
            [records[0], records[1].model_copy(update={"config": alone, "message": echo})]
        )
        == []
    )
    found = failing_values([records[0], records[1].model_copy(update={"config": alone})])
    assert [(f.knob, f.value, f.failed.number, f.ran.number) for f in found] == [
        ("amp", "bf16", 1, 0)
    ]
    assert found[0].matches(bf16) and not found[0].matches(base)
    elsewhere = TrialRecord(number=2, role="search", status="ok", config=bf16, samples_per_s=9.0)
    assert (
        failing_values([records[0], records[1].model_copy(update={"config": alone}), elsewhere])
        == []
    )


FUSED_SGD_UNDER_FSDP = (
    "rank 0: compiling (first step): NotImplementedError: Operator aten._fused_sgd_.default "
    "does not have a sharding strategy registered."
)


def test_a_failure_whose_error_names_a_fused_kernel_is_pinned_on_the_pair() -> None:
    # A user's ViT trained with SGD: FSDP with the fused implementation failed where DDP with it
    # ran, and the lesson skipped FSDP altogether, which runs with SGD's default implementation.
    ddp = TrainConfig(global_batch_size=16, parallel="ddp", world_size=2, optimizer_impl="fused")
    fsdp = ddp.model_copy(update={"parallel": "fsdp"})
    records = [
        TrialRecord(number=0, role="search", status="ok", config=ddp, samples_per_s=10.0),
        TrialRecord(
            number=1, role="search", status="error", config=fsdp, message=FUSED_SGD_UNDER_FSDP
        ),
    ]
    (found,) = failing_values(records)
    assert (found.knob, found.value, found.company) == (
        "parallel",
        "fsdp",
        (("optimizer_impl", "fused"),),
    )
    assert found.label == "parallel=fsdp with optimizer_impl=fused"
    assert found.matches(fsdp) and not found.matches(
        fsdp.model_copy(update={"optimizer_impl": "default"})
    )
    assert found.exclusion().reason.startswith("with optimizer_impl=fused: failed in trial 1")
    # the same failure without a fused kernel in its words stays the knob's alone
    plain = records[1].model_copy(update={"message": "rank 0: RuntimeError: gloo refused"})
    (alone,) = failing_values([records[0], plain])
    assert alone.company == () and alone.label == "parallel=fsdp"


def test_a_resumed_search_says_which_values_its_stored_trials_showed_to_fail(
    tmp_path: Path,
) -> None:
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        if config.amp == "bf16":
            return failed(config, "error", LSTM_BF16)
        return ok(config, speed(config), memory(config))

    storage = f"sqlite:///{tmp_path / 's.db'}"
    space = {**SPACE, "amp": ["off", "bf16"]}
    first = optuna.create_study(
        storage=storage, study_name="s", direction="maximize", sampler=make_sampler(0)
    )
    killed = make_tuner(FakeExecutor(outcome), space, study=first, trials=5, climb=True)
    killed.references()
    killed.search()  # the race never ran: the driver was killed here
    assert failing_values(killed.log.records)

    again = optuna.load_study(study_name="s", storage=storage, sampler=make_sampler(1))
    executor = FakeExecutor(outcome)
    resumed = make_tuner(executor, space, study=again, trials=7, climb=True)
    resumed.reporter = said = Said()
    resumed.run([], storage, "s")
    assert executor.ran(amp="bf16") == 0
    told = [line for line in said.lines if line.startswith("amp=bf16 failed in trial")]
    assert len(told) == 1 and told[0].endswith("configurations with it are skipped from now on")


def test_the_baseline_column_shows_the_largest_peak_of_its_runs_as_the_recommended_does() -> None:
    def growing(config: TrainConfig, before: int) -> TrialResult:
        # the baseline is the fastest; every run of it measures a little more than the last
        faster = 2000.0 if config.grad_accum_steps == 1 and config.num_workers == 0 else 0.0
        return ok(config, speed(config) + faster, memory(config) + 10 * before)

    recommendation = make_tuner(FakeExecutor(growing), SPACE, trials=4).run([], "s.db", "s")
    assert recommendation.baseline is not None
    assert recommendation.config == recommendation.baseline.config
    peaks = [
        t.memory_used_bytes
        for t in recommendation.trials
        if t.config == recommendation.config and t.memory_used_bytes
    ]
    assert recommendation.baseline.memory_used_bytes == min(peaks)  # its first run
    assert recommendation.baseline_memory_used_bytes == max(peaks)
    row = next(line for line in format_recommendation(recommendation).splitlines()
               if line.startswith("peak memory"))  # fmt: skip
    assert row.split()[2:4] == row.split()[4:6]  # recommended and baseline: one figure


def test_a_baseline_that_cannot_be_built_is_one_line_naming_the_value() -> None:
    tuner = make_tuner(FakeExecutor(steady), SPACE, global_batch_size=7)  # 2 ranks
    with pytest.raises(ConfigError) as raised:
        tuner.baseline()
    message = str(raised.value)
    assert "global_batch_size=7 is not divisible by world_size * grad_accum_steps" in message
    assert "\n" not in message and "pydantic" not in message


def test_a_resumed_search_counts_the_time_its_stored_trials_took_against_the_time_budget(
    tmp_path: Path,
) -> None:
    # A search cut by its caller's time limit and run again went back to proposing for its
    # whole --time-budget, when its race was what remained (on a lent GPU: four more
    # proposals, and the race still unfinished when the call's time ran out).
    import time

    def slow(config: TrainConfig, before: int) -> TrialResult:
        time.sleep(0.3)
        return ok(config, speed(config), memory(config))

    # 24 configurations: neither run runs out of them before its time budget does.
    space = {**SPACE, "num_workers": list(range(8))}
    storage = f"sqlite:///{tmp_path / 's.db'}"
    first = optuna.create_study(
        storage=storage, study_name="s", direction="maximize", sampler=make_sampler(0)
    )
    cut = make_tuner(FakeExecutor(slow), space, study=first, trials=None, time_budget_s=4.0)
    cut.references()
    cut.search()  # cut here: the race never ran
    proposed = sum(r.role in ("baseline", "search") for r in cut.log.records)
    # 4 s of 0.3-s trials: 5 fit in 2 s on an idle 2-core box, 2 under a loaded suite's
    # run on a slow one; 4 s leaves room for at least 3 there.
    assert proposed >= 3
    ran = sum(r.role in ("baseline", "search") and r.status == "ok" for r in cut.log.records)
    assert cut.log.proposing_s() >= 0.3 * ran  # duplicates, stored without running, take none

    again = optuna.load_study(study_name="s", storage=storage, sampler=make_sampler(1))
    resumed = make_tuner(FakeExecutor(slow), space, study=again, trials=None, time_budget_s=4.0)
    resumed.reporter = said = Said()
    resumed.run([], storage, "s")
    # Counted afresh, the budget held 15 more proposals (measured); the stored spans leave only
    # the moments between the cut run's trials (sampling, storing) to propose in: one or two.
    assert sum(r.role in ("baseline", "search") for r in resumed.log.records) <= proposed + 2
    assert any(r.role == "race" for r in resumed.log.records)
    assert any(line.startswith("time budget: ") for line in said.lines)


def test_one_error_is_one_error_whichever_step_phase_raised_it() -> None:
    from autotune.search.lessons import failing_alike

    phases = [
        "rank 0: warm-up step 1",
        "rank 1: measured step 3",
        "rank 0: compiled warm-up step 2 (compiling again: up to 40.0 s)",
    ]
    records = [
        TrialRecord(
            number=i, role="baseline" if i == 0 else "search", status="error",
            config=TrainConfig(global_batch_size=16, parallel=mode, world_size=size),
            message=f"{phase}: OSError: no data",
        )
        for i, (phase, (mode, size)) in enumerate(
            zip(phases, [("ddp", 2), ("fsdp", 2), ("single", 1)], strict=True)
        )
    ]  # fmt: skip
    assert failing_alike(records, 3) == ("OSError: no data", 3)


def test_one_error_is_one_error_whatever_numbers_the_configuration_put_in_it() -> None:
    # An in-place edit of a buffer that backward needs (a contrastive model's queue): "at
    # version 3" under DDP, "at version 2" on one device and under FSDP.
    from autotune.search.lessons import failing_alike

    error = "RuntimeError: one of the variables ... [torch.FloatTensor [128, 8192]] is at version"
    records = [
        TrialRecord(
            number=i, role="baseline" if i == 0 else "search", status="error",
            config=TrainConfig(global_batch_size=16, parallel=mode, world_size=size),
            message=f"rank 0: warm-up step 1: {error} {version}; expected version 0",
        )
        for i, (mode, size, version) in enumerate([("ddp", 2, 3), ("single", 1, 2), ("fsdp", 2, 2)])
    ]  # fmt: skip
    assert failing_alike(records, 3) == (f"{error} 3; expected version 0", 3)
    other = records[2].model_copy(update={"message": "rank 0: warm-up step 1: OSError: no data"})
    assert failing_alike([*records[:2], other], 3) is None


class _Finished(Said):
    """Keeps the trials a search reports as finished, skipped ones included."""

    def __init__(self) -> None:
        super().__init__()
        self.finished: list[TrialRecord] = []

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        self.finished.append(record)


def test_a_search_where_nothing_fits_says_each_skip_once_and_what_would_hold_the_least(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A LoRA stack under a 400 MiB budget: every configuration was predicted not to fit, the
    # same ones proposed over and over (200 lines), and the error advised allowing checkpointing
    # and accumulation, which its space already had.
    import autotune.search.tuner as tuner_module

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        return ok(config, 100.0, memory(config))  # 100 MiB a sample of micro-batch

    def predicted_over(proposal: Proposal) -> TrialRecord:
        assert proposal.config is not None
        return TrialRecord(
            number=proposal.number, role="search", status="skipped", config=proposal.config,
            feasible=False, message="predicted not to fit", predicted_memory_bytes=300 * MiB,
        )  # fmt: skip

    monkeypatch.setattr(tuner_module, "MAX_UNPRODUCTIVE_PROPOSALS", 30)
    tuner = make_tuner(FakeExecutor(outcome), SPACE, limit_mib=90, trials=20)
    monkeypatch.setattr(tuner, "decide", predicted_over)
    monkeypatch.setattr(tuner.proposer, "every_config", lambda: None)  # as a large space's
    tuner.reporter = said = _Finished()
    with pytest.raises(SearchError) as raised:
        tuner.run([], "s.db", "s")
    skipped = [r.config.key() for r in said.finished if r.status == "skipped" and r.config]
    stored = sum(r.status == "skipped" for r in tuner.log.records)
    assert len(skipped) == len(set(skipped)) < stored == 30  # each said once, all stored
    assert len(skipped) <= 5 + 1  # a line each for five in a row (the baseline's run between)
    summed = [line for line in said.lines if "more configurations decided without running" in line]
    assert summed and all("`autotune show` lists each" in line for line in summed)
    text = str(raised.value)
    assert text.startswith("no configuration fits the memory budget of 90 MiB (limit 90 MiB")
    # the baseline accumulated to micro-batch 1, beyond the space's accumulations
    assert ": the least was 100 MiB, measured (ddpx2 " in text and "accum=8 mbs=1" in text
    assert "a budget of at least 100 MiB would hold it" in text
    assert text.endswith(", or allow checkpoint_segments in the search space")  # not accum
    assert "grad_accum_steps" not in text and "\n" not in text


@pytest.mark.parametrize(("limit_mib", "measured"), [(1000, 6), (300, 4)])
def test_a_search_stops_once_every_configuration_of_a_small_space_is_known(
    limit_mib: float, measured: int
) -> None:
    # Six configurations and a budget of twenty trials: once each is measured, or skipped as
    # over the limit by what the measured ones showed, every further proposal is a repeat;
    # these were proposed 200 more times, stored as duplicates, about 15 s.
    tuner = make_tuner(FakeExecutor(steady), SPACE, limit_mib=limit_mib, trials=20)
    tuner.reporter = phases = Said()
    tuner.baseline()
    tuner.search()
    records = tuner.log.records
    assert sum(r.counts_toward_budget for r in records) == measured
    keys = [r.config.key() for r in records if r.config]
    whole = next(i for i in range(len(keys)) if len(set(keys[: i + 1])) == 6)
    assert len(records) - whole <= 2  # at most one repeat once every configuration is known
    said = [line for line in phases.lines if "exhausted" in line]
    known = {
        6: "all 6 of its configurations are measured (or being measured)",
        4: "of its 6 configurations, 4 are measured (or being measured) and 2 decided without "
        "running (the skipped trials say why)",
    }[measured]
    assert said == [f"the search space is exhausted: {known}; the search stops proposing"]


def test_a_large_space_is_not_counted_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.search.proposer as proposer_module
    from autotune.search.space import load_space, space_points

    assert space_points(load_space("default"), proposer_module.SMALL_SPACE) is None  # billions
    every = make_tuner(FakeExecutor(steady), SPACE).proposer.every_config()
    assert every is not None and len(every) == 6
    monkeypatch.setattr(proposer_module, "SMALL_SPACE", 5)
    tuner = make_tuner(FakeExecutor(steady), SPACE, trials=20)
    assert tuner.proposer.every_config() is None
    tuner.baseline()
    tuner.search()  # proposes on until MAX_UNPRODUCTIVE_PROPOSALS, as before
    assert sum(r.status == "duplicate" for r in tuner.log.records) >= 100


@pytest.mark.usefixtures("probe_cache")
def test_the_baseline_is_one_device_where_the_model_rules_ddp_out_here(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A DLRM's four sparse lookups on a CPU: the search left DDP out (gloo corrupts a rank now
    # and then), and then ran its baseline as DDP x2 all the same.
    from autotune.search import driver

    executor = FakeExecutor(lambda config, before: ok(config, 100.0 * config.world_size, 100))
    monkeypatch.setattr(driver, "_executor", lambda *args, **kwargs: executor)
    values = {
        "global_batch_size": 32, "trials": 3, "devices": 2, "device": "cpu", "space": "quick",
        "predict_memory": False, "storage": str(tmp_path / "s.db"),
    }  # fmt: skip
    for model, parallel in [("Lookups", "single"), ("OneLookup", "ddp")]:
        spec = WorkloadSpec(model=f"tests.fixtures.sparse:{model}")
        executor.runs.clear()
        driver.run_search(spec, make_settings(values), Reporter())
        baseline = executor.runs[0].config
        assert (baseline.parallel, baseline.world_size) == (parallel, 2 if parallel == "ddp" else 1)


def test_a_selective_step_the_trace_saw_write_into_a_kept_output_is_not_run() -> None:
    # the trace raised what every trial of it would: a block writing into its linear layer's
    # kept output; the selective configuration is skipped with that line, the rest run
    spec = WorkloadSpec(model="tests.fixtures.in_place:ResidualNet")
    executor = FakeExecutor(
        lambda config, before: ok(config, 100 + config.checkpoint_segments, 200)
    )
    space = {
        "checkpoint_segments": [0, 3],
        "checkpoint_policy": {
            "choices": ["full", "selective"],
            "when_not": {"checkpoint_segments": [0]},
        },
    }
    tuner = make_tuner(executor, space, workload=spec, predict_memory=True, trials=4)
    tuner.run([], "s.db", "s")
    assert executor.ran(checkpoint_policy="selective") == 0
    assert executor.ran(checkpoint_segments=3, checkpoint_policy="full") >= 1
    skipped = [r for r in tuner.log.records if r.status == "skipped"]
    assert skipped and all(r.config.checkpoint_policy == "selective" for r in skipped)
    assert "aten.add_.Tensor writes in place into the output of aten.addmm" in skipped[0].message
    assert skipped[0].message.endswith("(its step, traced under fake tensors, raised it)")
