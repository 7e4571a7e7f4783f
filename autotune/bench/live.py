"""Live benchmark runs: every method of the search-quality benchmark on real trials, each on a
fresh Ray executor and timed from its start (``scripts/bench_search_quality.py`` is the command).

  grid       every valid configuration of the space measured once (the oracle); the top few
             feasible ones are then measured again so the optimum is not a lucky draw;
  autotune   the real search (probe, baseline, recipe, proposals pruned against the incumbent,
             the race, verification), all its runs counted;
  random     configurations drawn uniformly without repeats until it used the tuner's wall time;
  bs-finder, deepspeed, recipe: the rules of ``autotune.bench.heuristics``.

Each pick is judged by the grid's measurement of the same configuration; the fidelity run and
the paired judge (``autotune.bench.referee``) check the estimate and the picks against longer
and interleaved runs.

Import cost: ``Live`` imports Ray when it starts an executor.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.bench.grid_record import GridState
from autotune.bench.heuristics import (
    amp_where_available,
    batch_size_finder,
    deepspeed_rule,
    standard_recipe,
)
from autotune.bench.landscape import (
    Landscape,
    Measured,
    Run,
    fastest_fitting,
    within_limit,
)
from autotune.config import TrainConfig
from autotune.records import TrialRecord
from autotune.result import Platform
from autotune.runner.executor import run_to_end
from autotune.runner.launch import LocalExecutor
from autotune.runner.platform import native_autocast, usable_cpus
from autotune.runner.request import TrialOptions, TrialRequest
from autotune.runner.workload import WorkloadSpec
from autotune.search.driver import run_search
from autotune.search.log import memory_used
from autotune.search.progress import Reporter
from autotune.search.settings import make_settings

WORKLOADS = {
    "cpu": {
        "mlp": ("workloads.mlp:mlp_loading_bound", 32),
        "convnet": ("workloads.convnet:resnet_tiny", 32),
        "gpt": ("workloads.gpt:gpt_tiny", 32),
    },
    "cuda": {
        "mlp": ("workloads.mlp:mlp_large", 512),
        "convnet": ("workloads.convnet:resnet18", 256),
        "gpt": ("workloads.gpt:gpt2_124m", 32),
    },
}


TARGET_RATIO, TARGET_WALL_SHARE, TARGET_ERROR = 0.97, 0.15, 0.05


SPLIT_PARTS = ("measured", "warm-up", "overhead", "pruned", "race", "verify", "driver")
"""Where the tuner's wall time goes: search trials' measured steps, warm-up and overhead
(launch, start-up, build), whole pruned trials, the race, the verification, the driver."""


TOP_K, RACE_ROUNDS, VERIFY_FACTOR = 3, 4, 2  # finishing: the tool's race, a 2x verification


@dataclass
class Method:
    """One method's run on one workload."""

    name: str
    trials: list[Measured] = field(default_factory=list)
    pick: TrainConfig | None = None
    pick_samples_per_s: float | None = None  # the method's own measurement of its pick
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Live:
    """Runs trials on a fresh executor; every time is measured from its creation."""

    def __init__(
        self,
        platform: Platform,
        spec: WorkloadSpec,
        args: Any,
        limit: int | None,
        local: bool = False,
    ):
        """``local``: rank processes of this machine (``LocalExecutor``), where Ray is missing
        (a lent GPU machine); else a fresh local Ray instance, the benchmark's executor."""
        self.started = time.perf_counter()
        self.platform, self.spec, self.args, self.limit = platform, spec, args, limit
        if local:
            self.executor: Any = LocalExecutor()
        else:
            from autotune.runner.ray_executor import RayExecutor  # imports ray

            cpus = max(8, os.cpu_count() or 1)
            self.executor = RayExecutor(platform, cpus_per_rank=2, num_cpus=cpus)
        self.trials: list[Measured] = []

    def run(
        self, config: TrainConfig, longer: int = 1, floor: bool = False, options: Any = None
    ) -> tuple[Measured, Run]:
        """One trial with the protocol's options (``longer``, ``floor``), or with ``options``
        (``TrialOptions``) for a script that measures windows of its own."""

        if options is None:
            options = TrialOptions(
                warmup_steps=self.args.warmup_steps,
                measured_steps=self.args.measured_steps,
                target_interval=self.args.target_interval,
                max_measure_s=self.args.max_measure_s,
                timeout_s=120.0,
                seed=self.args.seed,
            ).longer(longer)
            if floor:
                options = options.floor()
        request = TrialRequest(config=config, workload=self.spec, options=options)
        result = run_to_end(self.executor, request)
        used = memory_used(result, self.platform.device_type)
        fits = within_limit(result.status, used, self.limit)
        measured = Measured(
            config,
            result.status,
            result.samples_per_s,
            used,
            fits,
            measured_s=result.measured_s,
            elapsed_s=time.perf_counter() - self.started,
        )
        self.trials.append(measured)
        return measured, Run.of(result, used)

    def measure(self, config: TrainConfig) -> Measured:
        return self.run(config)[0]

    def close(self) -> float:
        self.executor.shutdown()
        return time.perf_counter() - self.started


class Recording(Reporter):
    """Keeps every finished trial of the tuner with the time it ended."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.records: list[tuple[float, TrialRecord]] = []

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        self.records.append((time.perf_counter() - self.started, record))


def progress(text: str) -> None:
    """A progress line on standard error (the table goes to standard output)."""
    print(f"  {text}", file=sys.stderr, flush=True)


def run_grid(
    platform: Platform, spec: WorkloadSpec, args: Any, space: Any, configs: list[TrainConfig]
) -> tuple[Landscape, Method]:
    live = Live(platform, spec, args, None)
    state = GridState.start(
        configs,
        workload=spec.model,
        platform=platform,
        devices=args.devices_used,
        space=space,
        global_batch_size=configs[0].global_batch_size,
        warmup_steps=args.warmup_steps,
        measured_steps=args.measured_steps,
        native_amp=native_autocast(platform.device_type)[0],
    )
    first_pass_s = 0.0
    # Every configuration once, then the best few again, in rounds (GridState.next_run): the
    # optimum is decided on repeated measurements, as the tuner's is.
    while (i := state.next_run()) is not None:
        state = state.with_run(i, live.run(configs[i])[1])
        if not first_pass_s:
            status = state.runs[i][0].status
            progress(f"grid {i + 1}/{len(configs)} {configs[i].summary()}: {status}")
            if state.first_pass_done:
                first_pass_s = time.perf_counter() - live.started
    method = Method("grid", trials=list(live.trials[: len(configs)]), wall_s=first_pass_s)
    method.extra["oracle_remeasure_s"] = live.close() - first_pass_s
    landscape = state.landscape()
    limit = landscape.memory_limit_bytes
    best = landscape.optimum()
    method.pick, method.pick_samples_per_s = best.config, best.value
    method.trials = [  # judged now that the limit is known
        dataclasses.replace(m, feasible=within_limit(m.status, m.memory_used_bytes, limit))
        for m in method.trials
    ]
    return landscape, method


def run_autotune(spec: WorkloadSpec, args: Any, landscape: Landscape, budget: int) -> Method:

    trials = args.tuner_trials
    workdir = Path(tempfile.mkdtemp(prefix="autotune-bench-"))
    settings = make_settings(
        dict(
            global_batch_size=landscape.global_batch_size,
            memory_budget=landscape.memory_limit_bytes,
            safety_margin=0.0,  # the limit is the landscape's, for every method alike
            trials=trials,
            space=args.space,
            devices=args.devices_used,
            device=landscape.platform.device_type,
            storage=str(workdir / "study.db"),
            warmup_steps=args.warmup_steps,
            measured_steps=args.measured_steps,
            target_interval=args.target_interval,
            max_measure_s=args.max_measure_s,
            top_k=TOP_K,
            race_rounds=RACE_ROUNDS,
            verify_factor=VERIFY_FACTOR,
            seed=args.seed,
        )
    )
    reporter = Recording()
    recommendation = run_search(spec, settings, reporter)
    method = Method("autotune", wall_s=time.perf_counter() - reporter.started)
    limit = landscape.memory_limit_bytes
    for elapsed, r in reporter.records:
        if not r.is_measurement or r.config is None:
            continue
        used = r.memory_used_bytes
        fits = within_limit(r.status, used, limit)
        method.trials.append(
            Measured(r.config, r.status, r.samples_per_s, used, fits, r.measured_s, elapsed)
        )
    method.pick, method.pick_samples_per_s = recommendation.config, recommendation.samples_per_s
    verification = recommendation.verification
    method.extra = {
        "search_trials": trials,
        "skipped_by_precheck": sum(r.status == "skipped" for _, r in reporter.records),
        "verified": recommendation.verified,
        "verification_error": recommendation.verification_error,
        "verification_status": verification.status if verification else None,
        "speedup_vs_baseline": recommendation.speedup,
        "estimate_interval": (
            [recommendation.samples_per_s_low, recommendation.samples_per_s_high]
            if recommendation.samples_per_s_low is not None
            else None
        ),
        "time_split": time_split(recommendation.trials, method.wall_s),
        # what the recommendation said of its runner-up: ratio, 90% interval, told apart or not
        "runner_up": (
            recommendation.runner_up.model_dump(mode="json", exclude={"config"})
            | {"config": recommendation.runner_up.config.summary()}
            if recommendation.runner_up is not None
            else None
        ),
    }
    return method


def time_split(records: list[TrialRecord], wall_s: float) -> dict[str, float]:
    """Where the tuner's wall time went: the parts of its search trials, its pruned trials,
    the race, the verification, and the rest (probe, sampler, start of the executor)."""
    split = dict.fromkeys(SPLIT_PARTS, 0.0)
    for r in records:
        if not r.is_measurement:
            continue
        total = r.overhead_s + r.warmup_s + r.measured_s
        if r.role in ("race", "verify"):
            split[r.role] += total
        elif r.status == "pruned":
            split["pruned"] += total
        else:
            split["measured"] += r.measured_s
            split["warm-up"] += r.warmup_s
            split["overhead"] += r.overhead_s
    split["driver"] = wall_s - sum(split.values())
    return split


def run_random(platform: Platform, spec: WorkloadSpec, args: Any, landscape: Landscape,
               wall_s: float) -> Method:  # fmt: skip
    """Random search without repeats, given the same wall time as the tuner took."""
    live = Live(platform, spec, args, landscape.memory_limit_bytes)
    configs = [p.config for p in landscape.points]
    for config in random.Random(args.seed).sample(configs, len(configs)):
        if time.perf_counter() - live.started >= wall_s:
            break
        live.measure(config)
    return _finish(Method("random"), live)


def run_heuristic(name: str, platform: Platform, spec: WorkloadSpec, args: Any,
                  landscape: Landscape) -> Method:  # fmt: skip

    space = landscape.space.params
    base = {
        "global_batch_size": landscape.global_batch_size,
        "world_size": args.devices_used,
        "device": platform.device_type,
    }
    # A knob the space does not list keeps its TrainConfig default.
    accum_choices = space["grad_accum_steps"].choices if "grad_accum_steps" in space else (1,)
    accum = [c for c in accum_choices if isinstance(c, int)]
    amp = amp_where_available(space["amp"].choices if "amp" in space else ())
    live = Live(platform, spec, args, landscape.memory_limit_bytes)
    if name == "recipe":
        cores = max(1, usable_cpus() // max(1, args.devices_used))
        native, _ = native_autocast(platform.device_type)
        chosen, _ = standard_recipe(live.measure, base, landscape.space, cores, native)
        return _finish(Method(name), live, chosen)
    rule = batch_size_finder if name == "bs-finder" else deepspeed_rule
    chosen, _ = rule(live.measure, base, accum, amp)
    return _finish(Method(name), live, chosen)


def _finish(method: Method, live: Live, chosen: Measured | None = None) -> Method:
    """Close the method's executor; its pick is ``chosen``, else its fastest fitting trial."""
    method.wall_s = live.close()
    method.trials = live.trials
    if chosen is None:
        chosen = fastest_fitting(live.trials)
    if chosen is not None:
        method.pick, method.pick_samples_per_s = chosen.config, chosen.samples_per_s
    return method
