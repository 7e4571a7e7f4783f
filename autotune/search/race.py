"""The race of the finalists: who wins is decided on paired, interleaved evidence.

After the search, the best few configurations (and the baseline) are run in rounds, as irace
and SMAC's intensification do: every round runs each candidate still in once, in an order that
rotates from round to round (A B C, B C A, C A B), so that drift on a shared machine hits them
all. Rounds pair the runs: the evidence that B is faster than A is the mean log ratio of their
runs round by round, with a Student's t interval. A candidate leaves the race once it is
slower than the leader with confidence (one-sided 95%), or when one of its runs fails or does
not fit; the baseline stays at least ``BASELINE_ROUNDS`` rounds so that the speed-up has an
interval. The winner is the candidate still in at the end with the best mean over its race
runs, as in SMAC's intensification (a challenger beats the incumbent on the same runs): the
search's single samples, lucky or not, never decide, and neither does a mean over rounds the
others did not run. Leaving the race needs confidence; winning it needs the better mean of the
paired runs. Between two candidates the noise cannot split, either is as good as the evidence
can tell, and the recommendation's interval says how sure that is.

Being chosen flatters the winner: among finalists the noise cannot split, the one with the
best mean is, more often than not, one whose runs were lucky (the winner's curse).
``selection_factor`` takes that luck out of its throughput by empirical-Bayes shrinkage of its
mean towards the finalists' (James-Stein): by how much depends on how far apart the finalists
are against the run-to-run noise, so a winner that left the others behind keeps its mean.

Everything here is a pure function of the stored records, so a resumed study decides the same.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Literal

from autotune.config import TrainConfig
from autotune.records import TrialRecord
from autotune.search.recipe import Coupling, simplicity
from autotune.stats import mean_interval, ratio_interval

DECIDE_CONFIDENCE = 0.90
"""Two-sided level of the interval a decision needs: its one end is a one-sided 95% test."""
MIN_ROUNDS = 2
BASELINE_ROUNDS = 3

Verdict = Literal["faster", "slower", "open"]


def race_runs(records: Sequence[TrialRecord], config: TrainConfig) -> dict[int, TrialRecord]:
    """The race runs of ``config``, by round."""
    key = config.key()
    return {
        r.race_round: r
        for r in records
        if r.role == "race" and r.race_round is not None and r.config and r.config.key() == key
    }


def out_of_race(records: Sequence[TrialRecord], config: TrainConfig) -> bool:
    """One of its race runs failed, was pruned or went over the memory limit."""
    return any(not r.fits for r in race_runs(records, config).values())


def log_ratios(
    records: Sequence[TrialRecord], base: TrainConfig, other: TrainConfig
) -> list[float]:
    """log(other / base) samples/s, one per round in which both ran and fitted."""
    a, b = race_runs(records, base), race_runs(records, other)
    return [
        math.log(b[n].samples_per_s / a[n].samples_per_s)  # type: ignore[operator]
        for n in sorted(set(a) & set(b))
        if a[n].fits and b[n].fits and a[n].samples_per_s and b[n].samples_per_s
    ]


def compare(ratios: Sequence[float], confidence: float = DECIDE_CONFIDENCE) -> Verdict:
    """Whether the other configuration is faster, slower, or not yet known to be either."""
    if len(ratios) < MIN_ROUNDS:
        return "open"
    interval = mean_interval(ratios, confidence)
    if interval.low > 0:
        return "faster"
    return "slower" if interval.high < 0 else "open"


def mean_log_speed(records: Sequence[TrialRecord], config: TrainConfig) -> float:
    runs = [r.samples_per_s for r in race_runs(records, config).values() if r.samples_per_s]
    return sum(math.log(s) for s in runs) / len(runs) if runs else -math.inf


def rotated(candidates: Sequence[TrainConfig], round_number: int) -> list[TrainConfig]:
    """The running order of a round: shifted by one each round."""
    if not candidates:
        return []
    shift = (round_number - 1) % len(candidates)
    return list(candidates[shift:]) + list(candidates[:shift])


def still_in(
    records: Sequence[TrialRecord],
    candidates: Sequence[TrainConfig],
    references: Sequence[TrainConfig | None],
    round_number: int,
) -> list[TrainConfig]:
    """The candidates that stay in the race after ``round_number``; ``references`` (the
    baseline, the standard recipe) stay ``BASELINE_ROUNDS`` at least, for their speed-ups."""
    alive = [c for c in candidates if not out_of_race(records, c)]
    if round_number < MIN_ROUNDS or not alive:
        return alive
    leader = max(alive, key=lambda c: mean_log_speed(records, c))
    kept = []
    for config in alive:
        slower = config != leader and compare(log_ratios(records, leader, config)) == "slower"
        if config in references and round_number < BASELINE_ROUNDS:
            slower = False  # the speed-up needs its rounds
        if not slower:
            kept.append(config)
    return kept


def decided(
    alive: Sequence[TrainConfig], references: Sequence[TrainConfig | None], round_number: int
) -> bool:
    """Nothing is left to decide: one candidate is left, and the references have had their
    rounds. A reference (the baseline, the recipe) still in contends like the others: a pick
    the race cannot tell from a simpler configuration gives way to it (``prefer_simpler``)."""
    waiting = any(r in alive for r in references if r is not None)
    return len(alive) <= 1 and (not waiting or round_number >= BASELINE_ROUNDS)


def ranking(records: Sequence[TrialRecord], candidates: Sequence[TrainConfig]) -> list[TrainConfig]:
    """The candidates that never failed a race run, best first: those that stayed in the race
    longer first, and among those that left it after the same round (the ones still in at the
    end ran every round), by the mean log speed of their race runs; a tie keeps the search's
    order. Means over different rounds are not compared: a candidate that left the race
    before a slow stretch of the machine would otherwise outrank the one that beat it with
    confidence and ran on through that stretch."""
    fit = [c for c in candidates if not out_of_race(records, c) and race_runs(records, c)]
    return sorted(fit, key=lambda c: (-last_round(records, c), -mean_log_speed(records, c)))


def last_round(records: Sequence[TrialRecord], config: TrainConfig) -> int:
    """The last race round ``config`` ran in (0: none)."""
    return max(race_runs(records, config), default=0)


def raced(records: Sequence[TrialRecord]) -> list[TrainConfig]:
    """The configurations that ran in the race, in the order of their first race run."""
    found = {r.config.key(): r.config for r in records if r.role == "race" and r.config}
    return list(found.values())


def second_fastest(
    records: Sequence[TrialRecord], winner: TrainConfig, baseline: TrainConfig | None
) -> TrainConfig | None:
    """The fastest other finalist by its race runs (never the baseline, whose comparison is the
    speed-up); None when no other finalist finished the race."""
    others = [c for c in ranking(records, raced(records)) if c != winner and c != baseline]
    return others[0] if others else None


def selection_factor(
    records: Sequence[TrialRecord], winner: TrainConfig, baseline: TrainConfig | None
) -> float:
    """The share of the winner's mean race speed that is not the luck of having been chosen
    (1.0: none to take out, or too little evidence to say).

    The finalists' mean log speeds (the baseline's left out: it is no finalist) spread by their
    true differences plus noise; the noise of one run is the paired spread of the per-round
    ratios to the winner, so the drift a round shares with all of them does not count. What
    spread is left is the finalists' own (tau^2); the winner's mean is shrunk towards the
    finalists' by the noise's share of its variance, and never raised.
    """
    field = [c for c in ranking(records, raced(records)) if c != baseline]
    if winner not in field or len(field) < 2:
        return 1.0
    means = [mean_log_speed(records, c) for c in field]
    counts = [len([r for r in race_runs(records, c).values() if r.fits]) for c in field]
    paired = [log_ratios(records, winner, c) for c in field if c != winner]
    dof = sum(len(p) - 1 for p in paired if len(p) > 1)
    if dof < 1:
        return 1.0
    # var(log b - log a) is twice one run's variance when the two are independent
    run_variance = sum(statistics.variance(p) * (len(p) - 1) for p in paired if len(p) > 1)
    run_variance /= 2 * dof
    centre = statistics.fmean(means)
    noise = statistics.fmean(run_variance / n for n in counts)
    spread = max(0.0, statistics.variance(means) - noise)
    own_noise = run_variance / counts[field.index(winner)]
    if spread + own_noise <= 0:
        return 1.0
    luck = own_noise / (spread + own_noise) * (means[field.index(winner)] - centre)
    return math.exp(-max(0.0, luck))


def speedup(
    records: Sequence[TrialRecord], config: TrainConfig, baseline: TrainConfig
) -> tuple[float, float, float] | None:
    """Speed-up of ``config`` over ``baseline`` from their paired rounds: (estimate, low,
    high) at 95%; None without two paired rounds."""
    return ratio_interval(log_ratios(records, baseline, config))


def prefer_simpler(
    records: list[TrialRecord],
    ranked: list[TrainConfig],
    baseline: TrainConfig | None,
    coupling: Coupling | None = None,
    recipe: TrainConfig | None = None,
) -> list[TrainConfig]:
    """``ranked`` (the race's order) with the configuration that changes least first, among
    those the race could not show slower than the fastest: fewer numerics changes, then fewer
    knobs moved from the baseline (``search.recipe.simplicity``). A pick the race cannot tell
    from a simpler configuration changes no more than that one.

    The race decides at one-sided 95%, the speed-ups it reports are two-sided 95% intervals:
    a pick that changes more numerics than the baseline (then the recipe) whose reported
    speed-up over it reaches 1.0 gives way to it, so that no recommendation changes numerics
    for a gain its own interval does not show (a bf16 model's amp=bf16 at 1.02x [0.99, 1.05]
    the baseline)."""
    if len(ranked) < 2:
        return ranked
    fastest = ranked[0]
    tied = [
        c for c in ranked if c == fastest or compare(log_ratios(records, c, fastest)) != "faster"
    ]
    simplest = min(tied, key=lambda c: (simplicity(c, baseline, coupling), ranked.index(c)))
    numerics = simplicity(simplest, baseline, coupling)[0]
    for reference in (baseline, recipe):
        if reference is None or reference not in ranked or reference == simplest:
            continue
        if simplicity(reference, baseline, coupling)[0] >= numerics:
            continue
        gain = speedup(records, simplest, reference)
        if gain is not None and gain[1] <= 1.0:
            simplest = reference
            break
    return [simplest, *[c for c in ranked if c != simplest]]
