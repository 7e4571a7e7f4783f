"""The evidence behind a ``Recommendation`` (``autotune.recommendation``, the value a search
returns), from a study's records: pure functions, no I/O, no executor.

The winner is chosen by the race (``autotune.search.race``): its throughput is the mean of its
race runs with a 95% interval, less what being chosen among close finalists flattered it by
(``race.selection_factor``), its speed-up the paired ratio to the baseline over the rounds
both ran, with an interval too and the same correction. The verification run either confirms
the estimate within a fixed tolerance or says why it cannot: a tolerance as wide as the noise
would be a check that cannot fail.
"""

from __future__ import annotations

import statistics

from autotune.config import TrainConfig
from autotune.recommendation import ROUNDS_IN_REACH, Recommendation, RunnerUp, ThroughputVerdict
from autotune.records import Exclusion, TrialRecord, last_baseline
from autotune.result import Platform, TrialResult, drift_words
from autotune.search import race
from autotune.search.recipe import Coupling, knobs_moved, numerics_changes
from autotune.stats import drift_size, mean_interval, pairs_to_decide, ratio_interval

THROUGHPUT_TOLERANCE = 0.10
"""Verification confirms throughput within this share of the estimate; never wider."""


def runs_of(records: list[TrialRecord], config: TrainConfig) -> list[TrialRecord]:
    """The ok measurements of ``config`` that estimate its throughput (not verification)."""
    key = config.key()
    return [
        r
        for r in records
        if r.config is not None
        and r.config.key() == key
        and r.role in ("baseline", "search", "race", "remeasure")
        and r.status == "ok"
    ]


def finalists(records: list[TrialRecord], top_k: int) -> list[TrainConfig]:
    """The ``top_k`` fastest configurations whose first measurement fitted."""
    first = [r for r in records if r.counts_toward_budget and r.fits and r.config is not None]
    ranked = sorted(first, key=lambda r: r.samples_per_s or 0.0, reverse=True)
    unique: dict[str, TrainConfig] = {}
    for r in ranked:
        assert r.config is not None
        unique.setdefault(r.config.key(), r.config)
    return list(unique.values())[:top_k]


def _evidence(records: list[TrialRecord], config: TrainConfig) -> list[TrialRecord]:
    """The runs a configuration's throughput is estimated from: its race runs that fitted,
    else (a study without a race) every earlier measurement."""
    raced = [r for r in race.race_runs(records, config).values() if r.fits]
    return raced or runs_of(records, config)


def throughput_caveats(
    records: list[TrialRecord], winner: TrainConfig, verification: TrialResult | None
) -> list[str]:
    """Where ``winner``'s step time rose or fell steadily within its runs (``stats.drift``):
    then its samples/s is a matter of how many steps a run measured, not of the configuration
    alone. The largest drift is said, with how many runs showed one."""
    drifts = [r.step_time_drift for r in runs_of(records, winner)]
    if verification is not None and verification.ok:
        drifts.append(verification.step_time_drift)
    found = [d for d in drifts if d is not None]
    if not found:
        return []
    worst = max(found, key=drift_size)
    return [
        f"{drift_words(worst)}, in {len(found)} of its {len(drifts)} runs: its samples/s "
        "depends on how many steps a run measures (the race's runs measure fewer than the "
        "search's and the verification's); raise --warmup-steps until it holds level"
    ]


def selection_luck(records: list[TrialRecord], winner: TrainConfig) -> float:
    """``race.selection_factor`` of ``winner``, the last baseline left out of the field."""
    baseline = last_baseline(records)
    return race.selection_factor(records, winner, baseline.config if baseline else None)


def estimate(records: list[TrialRecord], winner: TrainConfig) -> tuple[float, float] | None:
    """The throughput a recommendation of ``winner`` reports (``recommend``'s samples/s, from
    the same runs), the mean of its evidence times its ``selection_luck``, and that factor;
    None without a measurement."""
    runs = _evidence(records, winner)
    if not runs:
        return None
    luck = selection_luck(records, winner)
    return statistics.fmean(r.samples_per_s or 0.0 for r in runs) * luck, luck


def verdict(spread: float, error: float | None) -> ThroughputVerdict:
    if error is None:
        return "not measured"
    if spread > THROUGHPUT_TOLERANCE:
        return "too noisy"
    return "confirmed" if abs(error) <= THROUGHPUT_TOLERANCE else "not confirmed"


def runner_up_report(
    records: list[TrialRecord], winner: TrainConfig, baseline: TrainConfig | None
) -> RunnerUp | None:
    """How the race's next-fastest finalist compares with ``winner``, at the race's own
    decision level, so a pick the noise could not separate from the next is reported so."""
    other = race.second_fastest(records, winner, baseline)
    if other is None:
        return None
    ratios = race.log_ratios(records, winner, other)
    interval = ratio_interval(ratios, race.DECIDE_CONFIDENCE)
    decided = race.compare(ratios)
    ruled_out = decided == "slower"
    return RunnerUp(
        config=other,
        ratio=interval[0] if interval else None,
        ratio_low=interval[1] if interval else None,
        ratio_high=interval[2] if interval else None,
        rounds=len(ratios),
        ruled_out=ruled_out,
        faster=decided == "faster",
        rounds_to_split=None
        if decided != "open"
        else pairs_to_decide(ratios, race.DECIDE_CONFIDENCE, ROUNDS_IN_REACH),
    )


def simpler_choice(
    records: list[TrialRecord],
    winner: TrainConfig,
    reference: TrainConfig | None,
    coupling: Coupling | None = None,
) -> str:
    """Why ``winner`` was recommended over a faster-measured finalist of the race ("" when it
    is the fastest): the race could not tell them apart, and the winner changes less than it
    from ``reference`` (the baseline that fitted, else the defaults), as ``prefer_simpler``
    ordered them: numerics first, then knobs moved. Names what the faster one changes beyond
    the winner, not what both change."""
    ranked = race.ranking(records, race.raced(records))
    if not ranked or ranked[0] == winner or winner not in ranked:
        return ""
    fastest = ranked[0]
    ratio = race.speedup(records, fastest, winner)
    measured = f" ({ratio[0]:.3f}x [{ratio[1]:.2f}, {ratio[2]:.2f}])" if ratio else ""
    faster_numerics = numerics_changes(fastest, coupling, reference)
    winner_numerics = numerics_changes(winner, coupling, reference)
    if len(faster_numerics) > len(winner_numerics):
        beyond = [n for n in faster_numerics if n not in winner_numerics]
        what = f"its numerics: {', '.join(beyond)}"
    else:
        mine, theirs = winner.model_dump(), fastest.model_dump()
        differs = ", ".join(f"{k}={v}" for k, v in theirs.items() if v != mine[k])
        source = "the baseline" if reference is not None else "the defaults"
        what = (
            f"{knobs_moved(fastest, reference)} knobs moved from {source} against "
            f"{knobs_moved(winner, reference)}; it sets {differs}"
        )
    if race.compare(race.log_ratios(records, winner, fastest)) == "faster":
        # told apart at the race's one-sided 95%, not by the interval shown (prefer_simpler)
        why = "but its 95% interval over this one reaches 1.0"
    else:
        why = "but the race could not tell it from this one beyond the noise"
    return (
        f"{fastest.summary()} measured faster{measured}, {why}, and it changes more ({what}): "
        "the one that changes less is recommended"
    )


def simplicity_reference(records: list[TrialRecord]) -> TrainConfig | None:
    """What a configuration's changes are counted from (``recipe.simplicity``): the last
    baseline where it fitted, else None (the defaults)."""
    base = last_baseline(records)
    return base.config if base is not None and base.fits else None


def recommend(
    records: list[TrialRecord],
    winner: TrainConfig,
    verification: TrialResult | None,
    *,
    budget_bytes: int,
    limit_bytes: int,
    platform: Platform,
    exclusions: list[Exclusion],
    storage: str,
    study_name: str,
    model: str = "",
    block_class: str | None = None,
    recipe: TrainConfig | None = None,
    memory_caveats: list[str] | None = None,
    coupling: Coupling | None = None,
    made_room: str = "",
) -> Recommendation:
    """The recommendation of ``winner``, from the records alone (and the verification run)."""
    reference = simplicity_reference(records)  # what its numerics and changes are counted from
    runs = _evidence(records, winner)
    if not runs or not all(r.feasible for r in runs):
        raise ValueError(f"the winner {winner.summary()} has no fitting measurement")
    samples = [r.samples_per_s or 0.0 for r in runs]
    interval = mean_interval(samples)
    spread = (max(samples) - min(samples)) / interval.mean if interval.mean else 0.0
    luck = selection_luck(records, winner)
    expected = interval.mean * luck
    verified_runs = [
        r for r in records if r.role == "verify" and r.config and r.config.key() == winner.key()
    ]
    check = verified_runs[-1] if verified_runs else None
    error = None
    if check is not None and check.status == "ok" and check.samples_per_s and expected:
        error = check.samples_per_s / expected - 1
    memory_confirmed = check is not None and check.fits
    throughput = verdict(spread, error)
    used = max(r.memory_used_bytes or 0 for r in runs)
    if check is not None and check.memory_used_bytes is not None:
        used = max(used, check.memory_used_bytes)
    baseline = last_baseline(records)
    baseline_speed, baseline_used, paired = None, None, None
    if baseline is not None and baseline.status == "ok" and baseline.config is not None:
        base_runs = _evidence(records, baseline.config)
        baseline_speed = statistics.fmean(r.samples_per_s or 0.0 for r in base_runs)
        key = baseline.config.key()
        peaks = [
            r.memory_used_bytes
            for r in records
            if r.status == "ok" and r.config and r.config.key() == key and r.memory_used_bytes
        ]
        baseline_used = max(peaks, default=None)  # every run of it, as the recommended's
        if baseline.config.key() != winner.key():
            found = race.speedup(records, winner, baseline.config)
            if found is not None:
                paired = (found[0] * luck, found[1] * luck, found[2] * luck)
    over_recipe: tuple[float, float | None, float | None] | None = None
    recipe_speed = None
    if recipe is not None:
        recipe_runs = _evidence(records, recipe)
        if recipe_runs:
            recipe_speed = statistics.fmean(r.samples_per_s or 0.0 for r in recipe_runs)
        if recipe.key() == winner.key():
            over_recipe = (1.0, 1.0, 1.0)
        elif (found := race.speedup(records, winner, recipe)) is not None:
            over_recipe = (found[0] * luck, found[1] * luck, found[2] * luck)
        elif recipe_speed:
            over_recipe = (expected / recipe_speed, None, None)
    return Recommendation(
        config=winner,
        samples_per_s=expected,
        # t at 1 degree of freedom is 12.7: two runs can put the low end below zero
        samples_per_s_low=max(0.0, interval.low * luck) if interval.n > 1 else None,
        samples_per_s_high=interval.high * luck if interval.n > 1 else None,
        samples_per_s_runs=samples,
        selection_factor=luck,
        spread=spread,
        memory_used_bytes=used,
        memory_budget_bytes=budget_bytes,
        memory_limit_bytes=limit_bytes,
        verification=verification,
        verified=memory_confirmed and throughput == "confirmed",
        memory_confirmed=memory_confirmed,
        throughput_confirmed=throughput == "confirmed",
        throughput_verdict=throughput,
        throughput_tolerance=THROUGHPUT_TOLERANCE,
        verification_error=error,
        baseline=baseline,
        baseline_samples_per_s=baseline_speed,
        baseline_memory_used_bytes=baseline_used,
        speedup=paired[0] if paired else (expected / baseline_speed if baseline_speed else None),
        speedup_low=paired[1] if paired else None,
        speedup_high=paired[2] if paired else None,
        recipe=recipe,
        recipe_samples_per_s=recipe_speed,
        speedup_over_recipe=over_recipe[0] if over_recipe else None,
        speedup_over_recipe_low=over_recipe[1] if over_recipe else None,
        speedup_over_recipe_high=over_recipe[2] if over_recipe else None,
        numerics_changes=numerics_changes(winner, coupling, reference),
        memory_caveats=memory_caveats or [],
        throughput_caveats=throughput_caveats(records, winner, verification),
        simpler_choice=simpler_choice(records, winner, reference, coupling),
        made_room=made_room,
        runner_up=runner_up_report(records, winner, baseline.config if baseline else None),
        exclusions=exclusions,
        trials=sorted(records, key=lambda r: r.number),
        platform=platform,
        model=model,
        block_class=block_class,
        storage=storage,
        study_name=study_name,
    )
