"""Replay search strategies on a recorded landscape: nothing runs, each trial is looked up.

A replayed measurement is the point's median samples/s with Gaussian noise of two kinds: the
size its recorded step-time spread implies for a mean over the trial's steps (spread = (p90 -
p10) / median of one step, and p90 - p10 is 2.56 standard deviations of a normal distribution;
a request with a shorter window than the recorded run's gets proportionally fewer steps),
and the landscape's run-to-run noise (from the configurations it measured more than once), so
strategies meet the noise the live search met. A request with a pruning threshold is answered
"pruned" when the drawn value is below it, as a live trial stops early. The tuner is the real
``Tuner`` (its sampler, baseline, duplicate and memory pre-checks, pruning, race) with a
``ReplayExecutor`` in place of Ray.
"""

from __future__ import annotations

import math
import random
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.bench.heuristics import standard_recipe
from autotune.bench.landscape import Landscape, Measure, Measured, Point, fastest_fitting
from autotune.config import TrainConfig
from autotune.result import RankReport, TrialResult
from autotune.runner.request import TrialOptions, TrialRequest
from autotune.runner.workload import WorkloadSpec
from autotune.search import race
from autotune.search.evidence import estimate, runner_up_report
from autotune.search.progress import Reporter
from autotune.search.settings import make_settings
from autotune.search.study import make_sampler
from autotune.search.tuner import Tuner

P10_P90_SIGMAS = 2.56


def replayed_steps(point: Point, options: TrialOptions | None) -> int:
    """The steps a request would measure: the recorded run's, fewer for a shorter window (a
    race run measures the floor) in proportion to the time."""
    run = point.runs[0]
    if options is None:
        return max(1, run.measured_steps)
    if options.target_interval == 0:
        return options.measured_steps
    share = min(1.0, options.max_measure_s / run.measured_s) if run.measured_s > 0 else 1.0
    return max(1, options.measured_steps, round(run.measured_steps * share))


def noisy_value(
    point: Point, rng: random.Random, run_noise: float, steps: int, noise: float | None = None
) -> float:
    """A draw of ``point``'s throughput over ``steps`` steps (``replayed_steps``); ``noise``:
    a run-to-run coefficient of variation to draw at instead of the recorded ones (2% is what
    an H100's race runs showed)."""
    value = point.value or 0.0
    if noise is not None:
        return max(0.0, value * (1 + rng.gauss(0.0, noise)))
    within = point.spread / P10_P90_SIGMAS / math.sqrt(steps)
    sigma = math.hypot(within, run_noise)
    return max(0.0, value * (1 + rng.gauss(0.0, sigma)))


class ReplayExecutor:
    """Answers trial requests from a landscape: the ``Executor`` where nothing runs."""

    rank_imports: tuple[str, ...] = ()

    def __init__(
        self, landscape: Landscape, rng: random.Random, noise: float | None = None
    ) -> None:
        self.landscape, self.rng, self.noise = landscape, rng, noise
        """``noise``: the coefficient of variation to draw at (None: the landscape's own)."""
        self._done: list[tuple[int, TrialResult]] = []
        self._next = 0

    def result(self, config: TrainConfig, options: TrialOptions | None = None) -> TrialResult:
        point = self.landscape.lookup(config)
        if point is None:
            return TrialResult(config=config, status="invalid", message="not in the landscape")
        if point.status != "ok":  # replayed as recorded, reason included
            run = point.runs[0]
            return TrialResult(config=config, status=run.status, message=run.message)
        # One report carrying the judged memory: the sum on CPU and the max on CUDA agree.
        report = RankReport(rank=0, status="ok", peak_memory_bytes=point.memory_used_bytes or 0)
        steps = replayed_steps(point, options)
        value = noisy_value(point, self.rng, self.landscape.run_noise, steps, self.noise)
        prune_below = options.prune_below_samples_per_s if options is not None else None
        pruned = prune_below is not None and value < prune_below
        steady = point.steady_ratio
        return TrialResult(
            config=config,
            status="pruned" if pruned else "ok",
            message="below the pruning line (replayed)" if pruned else "",
            samples_per_s=value,
            steady_samples_per_s=value * steady if steady else None,
            data_wait_share=point.data_wait_share,
            peak_memory_bytes=point.memory_used_bytes,
            measured_steps=steps,
            ranks=[report],
        )

    def fits_now(self, request: TrialRequest) -> bool:
        return True

    def submit(self, request: TrialRequest) -> int:
        self._next += 1
        self._done.append((self._next, self.result(request.config, request.options)))
        return self._next

    def wait(self, timeout_s: float | None = None) -> list[tuple[int, TrialResult]]:
        done, self._done = self._done, []
        return done

    def shutdown(self) -> None:
        pass


def replay_measure(landscape: Landscape, rng: random.Random, noise: float | None = None) -> Measure:
    executor = ReplayExecutor(landscape, rng, noise)

    def measure(config: TrainConfig) -> Measured:
        result = executor.result(config)
        point = landscape.lookup(config)
        fits = point is not None and landscape.feasible(point)
        used = point.memory_used_bytes if point is not None else None
        return Measured(config, result.status, result.samples_per_s, used, fits)

    return measure


@dataclass(frozen=True)
class Replay:
    """What one strategy did on a landscape: its measurements in order, and its pick; for the
    tuner, the configurations its race ran, whether it told the pick from the runner-up with
    confidence (None: no runner-up finished the race, or no race), and the throughput it
    would report for the pick, which the landscape's value of the pick can check."""

    measured: list[TrainConfig]
    pick: TrainConfig | None
    told_apart: bool | None = None
    raced: tuple[TrainConfig, ...] = ()
    estimate: float | None = None
    """The samples/s the recommendation would report for the pick."""
    selection_factor: float = 1.0
    """The share of the pick's race mean that ``estimate`` kept (the winner's curse)."""
    recipe: TrainConfig | None = None
    """The standard recipe the tuner measured beside the baseline."""
    finishing_runs: int = 0
    """What the race and the verification cost, in trial runs."""


def make_replay_tuner(
    landscape: Landscape,
    seed: int,
    trials: int,
    *,
    climb: bool = True,
    sampler: Any = None,
    noise: float | None = None,
    **settings: Any,
) -> Tuner:
    """The real Tuner over a replaying executor, with the landscape's budget and window;
    ``settings`` adds search settings (e.g. ``top_k``)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    sampler = sampler if sampler is not None else make_sampler(seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    checked = make_settings(
        dict(
            global_batch_size=landscape.global_batch_size,
            memory_budget=landscape.memory_limit_bytes,
            safety_margin=0.0,
            trials=trials,
            seed=seed,
            warmup_steps=landscape.warmup_steps,
            measured_steps=landscape.measured_steps,
            climb=climb,
            # The landscape's recorded peaks are the truth here; the model's own prediction
            # would need traces of it on this machine and would judge it by another's memory.
            **{"predict_memory": False, **settings},
        )
    )
    return Tuner(
        study=study,
        executor=ReplayExecutor(landscape, random.Random(seed), noise),
        workload=WorkloadSpec(model=landscape.workload),
        settings=checked,
        space=landscape.space,
        platform=landscape.platform,
        devices=landscape.devices,
        reporter=Reporter(),
        native_amp=(landscape.recipe_native_amp(), "as the landscape's device computed them"),
    )


def replay_tuner(
    landscape: Landscape,
    seed: int,
    trials: int,
    *,
    finish: bool = True,
    climb: bool = True,
    sampler: Any = None,
    noise: float | None = None,
) -> Replay:
    """The tuner's search (baseline first) with ``trials`` measured trials; with ``finish``
    its race and verification pick the winner, as in a live search. ``climb`` and ``sampler``
    (default: the tool's) let set-ups be compared; ``noise`` replaces the recorded noise."""
    tuner = make_replay_tuner(landscape, seed, trials, climb=climb, sampler=sampler, noise=noise)
    tuner.references()
    tuner.search()
    # Each configuration is measured at most once, so this is in the order they were run.
    measured = [r.config for r in tuner.log.measured().values() if r.config is not None]
    if not finish:
        return Replay(measured, None)
    pick = tuner.verify(tuner.race())[0]
    base = tuner.log.baseline()
    records = tuner.log.records
    close = runner_up_report(records, pick, base.config if base is not None else None)
    told = close.ruled_out if close is not None else None
    reported, luck = estimate(records, pick) or (None, 1.0)
    finishing = sum(r.role in ("race", "verify") for r in records)
    return Replay(
        measured, pick, told, tuple(race.raced(records)), reported, luck, tuner.recipe_config,
        finishing,
    )  # fmt: skip


def replay_random(
    landscape: Landscape, seed: int, trials: int, noise: float | None = None
) -> Replay:
    """Random search without repeats: configurations drawn uniformly from the grid."""
    rng = random.Random(seed)
    configs = [p.config for p in landscape.points]
    chosen = rng.sample(configs, min(trials, len(configs)))
    measure = replay_measure(landscape, rng, noise)
    best = fastest_fitting([measure(c) for c in chosen])
    return Replay(chosen, best.config if best else None)


def replay_recipe(
    landscape: Landscape, seed: int, cores_per_rank: int = 1, noise: float | None = None
) -> Replay:
    """The standard recipe by hand on ``landscape`` (``heuristics.standard_recipe``)."""

    measure = replay_measure(landscape, random.Random(seed), noise)
    base = {
        "global_batch_size": landscape.global_batch_size,
        "world_size": landscape.devices,
        "device": landscape.platform.device_type,
    }
    native = landscape.recipe_native_amp()
    picked, trials = standard_recipe(measure, base, landscape.space, cores_per_rank, native)
    return Replay([m.config for m in trials], picked.config if picked else None)


def trials_to_reach(
    landscape: Landscape, measured: Sequence[TrainConfig], share: float
) -> int | None:
    """How many measurements until one of a configuration within ``share`` of the optimum
    (that fits); None if none of them is."""
    for i, config in enumerate(measured, start=1):
        if landscape.ratio(config) >= share:
            return i
    return None


def reach_summary(values: Sequence[int | None], cap: int) -> dict[str, Any]:
    """Trials to reach (``trials_to_reach``) over seeds: the median, a seed that never reached
    counted as ``cap + 1``; the worst (None if a seed never reached); how many never did."""
    reached = [v for v in values if v is not None]
    filled = [v if v is not None else cap + 1 for v in values]
    return {
        "median": statistics.median(filled),
        "worst": max(reached) if len(reached) == len(values) else None,
        "not_reached": len(values) - len(reached),
    }


def reach_cell(summary: dict[str, Any]) -> str:
    """``reach_summary`` as a table cell: median / worst ('-': a seed never reached)."""
    worst = summary["worst"] if summary["worst"] is not None else "-"
    return f"{summary['median']:g} / {worst}"
