"""The search's sequence: baseline, the standard recipe (``search.recipe``), proposals run
until a budget is spent (each stopped early once it is clearly slower than the incumbent), then
the finishing phase (``search.finishing``): a race of the best few with the baseline and the
recipe, verification of the winner.

Propose (``Proposer``), decide (duplicates, the memory pre-check), run (the ``Executor``),
record (``StudyLog``) and recommend (``recommend``) are separate; this module only sequences
them.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from autotune.config import TrainConfig
from autotune.errors import (
    ConfigError,
    SearchError,
    describe_validation_error,
    rank_hint,
    shortened,
    shortened_keeping_hint,
)
from autotune.recommendation import Recommendation
from autotune.records import Exclusion, Role, TrialRecord
from autotune.result import Platform, TrialResult
from autotune.runner.executor import Executor, PlacementError, run_to_end
from autotune.runner.fake_memory import MODEL_AT_FAULT
from autotune.runner.platform import AUTOCASTS, usable_cpus
from autotune.runner.request import TrialRequest
from autotune.runner.workload import BUILDING, WorkloadSpec
from autotune.search.calibration import prior_for
from autotune.search.evidence import recommend
from autotune.search.finishing import Finishing, nothing_fits
from autotune.search.lessons import (
    accumulation_cut_memory,
    failing_alike,
    failing_values,
    needs_unused_parameters,
)
from autotune.search.log import DIVERGES, StudyLog, to_record
from autotune.search.memory_gate import MemoryGate
from autotune.search.memory_model import MemoryModel, Prediction
from autotune.search.precheck import precheck
from autotune.search.progress import Reporter, SkipLines
from autotune.search.proposer import Proposal, Proposer
from autotune.search.recipe import (
    Coupling,
    recipe_candidates,
    recipe_fallback,
    recipe_values,
)
from autotune.search.settings import SearchSettings
from autotune.search.space import SearchSpace
from autotune.units import format_budget

MAX_UNPRODUCTIVE_PROPOSALS = 200
RECIPE_ATTR = "autotune:recipe"
"""The study's standard recipe, as first settled (a resumed search races the same one)."""
CLAIM_POLL_S = 2.0
"""How often a driver waiting for another driver's run of the same configuration looks."""
MAX_PLACEMENT_FAILURES = 3
"""Trials the cluster refused in a row, with nothing running, before the search gives up."""


BARE_RANK_NOISE = 0.05
"""How far below its first measurement a rank without its tensors may measure again (its
resident peak moves by a few MiB from run to run): a budget that close is still tried."""


class Tuner:
    """Runs one search over ``space`` for ``workload`` with ``settings``."""

    def __init__(
        self,
        *,
        study: Any,
        executor: Executor,
        workload: WorkloadSpec,
        settings: SearchSettings,
        space: SearchSpace,
        platform: Platform,
        devices: int,
        reporter: Reporter,
        native_amp: tuple[tuple[str, ...], str] = (AUTOCASTS, "as the space offers"),
        coupling: Coupling | None = None,
        ddp_refused: bool = False,
    ) -> None:
        self.executor, self.workload, self.settings = executor, workload, settings
        self.native_amp = native_amp
        """The autocasts the device computes natively, and how that was told (the recipe's)."""
        self.coupling = coupling
        """What makes the model's forward follow the micro-batch: its batch norms' statistics,
        a loss over the micro-batch together (None: nothing)."""
        self.platform, self.devices, self.reporter = platform, devices, reporter
        self.baseline_devices = 1 if ddp_refused else devices
        """The baseline's devices: one where the model rules DDP out here (``refusals``), since
        a baseline that cannot train measures nothing."""
        self.space = space
        self.budget_bytes = settings.memory.memory_budget_bytes(platform.device_memory_bytes)
        self.limit_bytes = int(self.budget_bytes * (1 - settings.memory.safety_margin))
        self.log = StudyLog(study, self.limit_bytes)
        if settings.global_batch_size is None:
            raise ConfigError("the search needs a global batch size; settle it first")
        self.global_batch_size = settings.global_batch_size
        clip = settings.max_grad_norm  # the user's, in every configuration the search runs
        fixed = {
            "global_batch_size": self.global_batch_size,
            "device": platform.device_type,
            **({"max_grad_norm": clip} if clip is not None else {}),
        }
        climb = settings.budget.climb
        # a claim outlives the longest run: another driver leaves the configuration alone
        self.hold_s = 2 * settings.measurement.trial_timeout_s + 300
        self.proposer = Proposer(
            study, self.log, space, fixed, climb, settings.measurement.prune_ratio, self.hold_s
        )
        model = None
        if settings.memory.predict_memory:
            prior = prior_for(
                platform.device_type, workload, executor.rank_imports, space.compiles()
            )
            model = MemoryModel(workload, platform.device_type, prior)
        self.gate = MemoryGate(model, self.limit_bytes, self.log, self.proposer, self._say, devices)
        self.started = time.perf_counter()
        self.recipe_config: TrainConfig | None = None
        """The standard recipe as measured (None: not measured, or it fits nowhere)."""
        self._finishing: Finishing | None = None
        self._failing: set[str] = set()  # the failing values said, by label

    # -- running ----------------------------------------------------------------------------

    def _request(
        self, config: TrainConfig, longer: int = 1, prune: bool = False, floor: bool = False
    ) -> TrialRequest:
        s, m = self.settings, self.settings.measurement
        limit = None
        if s.memory.enforce_memory_budget:  # on CPU the host budget is shared by the ranks
            cpu = self.platform.device_type == "cpu"
            limit = self.budget_bytes // config.processes if cpu else self.budget_bytes
        incumbent = self.log.best() if prune and m.prune_ratio > 0 else None
        prune_below = (
            incumbent.samples_per_s * m.prune_ratio
            if incumbent and incumbent.samples_per_s
            else None
        )
        options = m.options(limit, prune_below).longer(longer)
        if floor:
            options = options.floor()
        return TrialRequest(config=config, workload=self.workload, options=options)

    def _record(
        self,
        role: Role,
        result: TrialResult,
        race_round: int | None = None,
        prediction: Prediction | None = None,
    ) -> TrialRecord:
        device = self.platform.device_type
        predicted = (prediction.peak_bytes, prediction.source) if prediction else None
        return to_record(-1, role, result, device, self.limit_bytes, race_round, predicted)

    def _say(self, line: str) -> None:
        self.reporter.phase(line)

    @property
    def memory(self) -> MemoryModel | None:
        """The memory model (None: prediction is off)."""
        return self.gate.model

    def _run_one(
        self,
        config: TrainConfig,
        role: Role,
        longer: int = 1,
        race_round: int | None = None,
        trial: Any = None,
    ) -> tuple[TrialRecord, TrialResult]:
        """Run one trial to its end and store it (the sampler learns from it too), on the
        claimed ``trial`` where one was asked for it."""
        self.reporter.trial_started(role, config)
        prediction = self.gate.shown(config)
        try:
            # The race's rounds are the evidence, and the verification checks their estimate:
            # both measure a race run's floor (verification ``verify_factor`` times over), as
            # one run's own interval cannot see the run-to-run noise it would wait out.
            request = self._request(config, longer, floor=role in ("race", "verify"))
            result = run_to_end(self.executor, request)
        except PlacementError as error:
            result = TrialResult(config=config, status="invalid", message=str(error))
        record = self.log.write(self._record(role, result, race_round, prediction), trial)
        self.gate.learn()
        self.reporter.trial_finished(record, self.log.best())
        self._learn_failing_values(record)
        return record, result

    def _resume_time_budget(self) -> None:
        """A resumed study's stored trials have spent part of the time budget, as they count
        toward the trial budget: a search cut by its caller's time limit and run again goes on
        to its race instead of proposing for the whole budget again."""
        budget = self.settings.budget.time_budget_s
        spent = self.log.proposing_s()
        if budget is None or spent <= 0:
            return
        self.started -= spent
        left = budget - spent
        self.reporter.phase(
            f"time budget: {spent:.0f} s of {budget:.0f} s spent by the stored trials; "
            + (f"{left:.0f} s left to propose" if left > 0 else "no new search trials")
        )

    def _out_of_budget(self) -> bool:
        s = self.settings
        if s.budget.trials is not None and len(self.log.measured()) >= s.budget.trials:
            return True
        elapsed = time.perf_counter() - self.started
        return s.budget.time_budget_s is not None and elapsed >= s.budget.time_budget_s

    # -- phases -----------------------------------------------------------------------------

    def baseline(self) -> TrialRecord:
        """Plain DDP (or one device, where there is one or the model rules DDP out), fp32, no
        hook, no checkpointing, no workers; accumulation only as far as needed to fit."""
        self.log.refresh()  # another driver of the study may have measured it
        record = self.log.baseline()
        accum = (self._predicted_accumulation() or 1) if record is None else 1
        while True:
            if record is not None:
                assert record.config is not None
                accum = record.config.grad_accum_steps * 2
                divisible = self.global_batch_size % (self.baseline_devices * accum) == 0
                if record.fits or record.status not in ("ok", "oom") or not divisible:
                    return record
                if not accumulation_cut_memory(self.log.records, record):
                    return record
                if self.memory is not None:  # the prediction, calibrated by what just ran
                    predicted = self._predicted_accumulation(accum)
                    if predicted is None:
                        return record
                    accum = predicted
            try:
                config = TrainConfig(**self.proposer.completer()(self._baseline_values(accum)))
            except ValidationError as error:
                reason = describe_validation_error(error, "baseline configuration", TrainConfig)
                raise ConfigError(f"no baseline configuration is possible: {reason}") from None
            trial = self._claim(config)
            if trial is None:  # another driver measured it meanwhile
                done = self.log.measured().get(config.key())
                if done is not None and done.role != "baseline":
                    return done  # in another role (its search): asking again would loop
                record = self.log.baseline()
                continue
            record, _ = self._run_one(config, "baseline", trial=trial)
            self._stop_if_the_step_fails(record)
            if self._learn_unused_parameters(record):
                record = None  # the same baseline again, with find_unused_parameters

    def _stop_if_nothing_can_fit(self) -> None:
        """Stop before any trial where the limit lies below what the fewest ranks the space runs
        hold before any tensor of the model: on CPU the memory model's first guess measures it
        (``prior_for``: a rank with its imports, the model's module and dataset, no
        parameters), and every trial's resident peak holds it. A 1 KiB budget ran its baseline
        and turned 200 proposals down one by one, a minute, before it said what this says."""
        model = self.memory
        if model is None or self.platform.device_type != "cpu" or not model.prior.offset_bytes:
            return
        ranks = self.space.fewest_ranks()
        floor = ranks * model.prior.offset_bytes
        if floor * (1 - BARE_RANK_NOISE) <= self.limit_bytes:
            return
        margin = self.settings.memory.safety_margin
        raise nothing_fits(
            self.budget_bytes,
            self.limit_bytes,
            f": the fewest ranks the space runs ({ranks}) hold {floor / 2**20:,.0f} MiB on this "
            "machine before any of the model's tensors (measured, a rank without them); a budget "
            f"over {format_budget(floor / (1 - margin))} is needed before those (`autotune plan` "
            "predicts them), and no trial was run",
        )

    def _stop_if_the_step_fails(self, baseline: TrialRecord) -> None:
        """Stop the search when the baseline diverged (a loss not finite: every comparison with
        it would be void), failed as its ranks built the model (before any configuration was
        applied), or failed with the error the traced step raised before any trial (one device,
        fp32): the step itself fails (the optimizer refuses the model's sparse gradients, say),
        not a configuration, and every trial would too."""
        if baseline.status == "error" and baseline.message.endswith(DIVERGES):
            cause = baseline.message.removesuffix(f": {DIVERGES}")
            raise SearchError(
                f"the model does not train as given: the baseline (trial {baseline.number}, "
                f"nothing tuned yet) diverged, {cause}; fix the model, data or loss (--loss) "
                "and search again"
            )
        if baseline.status == "error" and f"{BUILDING}: " in baseline.message:
            cause = baseline.message.split(f"{BUILDING}: ", 1)[1]
            raise SearchError(
                f"the model does not build in a trial's ranks: {cause} (the baseline, trial "
                f"{baseline.number}, before any configuration was applied); fix it and search "
                "again"
            )
        traced = self.gate.trace_error
        if baseline.status != "error" or not traced or not baseline.message:
            return
        cause = traced.split(MODEL_AT_FAULT)[0].strip()
        if cause and cause in baseline.message:
            hint = rank_hint(baseline.message)
            raise SearchError(
                f"the training step fails whatever the configuration: {cause} (the baseline, "
                f"trial {baseline.number}, and the memory trace before it, on one device in "
                f"fp32){'; ' + hint if hint else ''}; fix the model, data, loss or optimizer "
                "(--optimizer) and search again"
            )

    def _stop_if_every_trial_fails_alike(self) -> None:
        """Stop the search when nothing has run and the baseline's error failed three trials
        across parallel modes (``lessons.failing_alike``): the trials left would fail alike."""
        modes = self.proposer.space.choices().get("parallel", ("single",))
        found = failing_alike(self.log.records, len(modes))
        if found is not None:
            error, alike = found
            ran = sum(r.counts_toward_budget for r in self.log.records)
            raise SearchError(
                f"the training step fails whatever the configuration: {alike} of {ran} trials, "
                "the baseline's among them and across parallel modes, failed with "
                f"{shortened_keeping_hint(error)}, and none ran; fix it and search again "
                "(every trial is stored: see `autotune show`)"
            )

    def _claim(self, config: TrainConfig) -> Any:
        """A trial claimed for running ``config``, or None after waiting out another driver
        of the study that claimed it first."""
        key = config.key()
        trial = self.log.ask_claimed(key, self.hold_s)
        other = self.log.claimed(settle=True).get(key)
        self.log.refresh()
        done = self.log.measured().get(key)  # another driver finished it a moment ago
        if done is None and (other is None or other > trial.number):
            return trial
        number = other if done is None else done.number
        self.log.write(
            TrialRecord(
                number=trial.number,
                role="search",
                status="duplicate",
                config=config,
                message=f"measured by another driver's trial {number}",
            ),
            trial,
        )
        self.reporter.phase(f"{config.summary()}: another driver measures it (trial {number})")
        while key in self.log.claimed():
            time.sleep(CLAIM_POLL_S)
        self.log.refresh()
        return None

    def references(self) -> None:
        """Measure what the pick is compared with: the baseline, then the standard recipe."""
        base = self.baseline()
        if base.status == "ok" and not base.fits and base.config is not None:
            self.reporter.phase(
                f"baseline: over the limit at accumulation {base.config.grad_accum_steps}, the "
                "last tried; it stays the reference, a speed-up over it is over a configuration "
                "that does not fit, and the race leaves it out"
            )
        self.recipe_config = self.recipe(baseline_ran=base.status in ("ok", "oom"))

    def recipe(self, baseline_ran: bool = True) -> TrainConfig | None:
        """Measure the standard recipe (``search.recipe``) as one of the search's trials: its
        knobs from what the space offers after the probe, its micro-batch the largest that is
        predicted to fit and does (a run that does not fit tries the next smaller one). None:
        no form of it fits or runs; the race then has the baseline alone to compare with.
        ``baseline_ran``: the baseline ran (fitting or not); where it failed too, the recipe's
        failure is not its knobs', and it gives none of them up."""
        stored = self.log.study.user_attrs.get(RECIPE_ATTR)
        if stored is not None:
            return TrainConfig.model_validate(stored) if stored else None
        choices = self.proposer.space.choices()
        cores = max(1, usable_cpus() // max(1, self.devices))
        native, told = self.native_amp
        values = recipe_values(choices, self.platform.device_type, self.devices, cores, native)
        emulated = [a for a in AUTOCASTS if a in choices.get("amp", ()) and a not in native]
        if emulated:
            device = "GPU" if self.platform.device_type == "cuda" else "CPU"
            self.reporter.phase(
                f"standard recipe: autocast {values['amp']}, {' and '.join(emulated)} would be "
                f"emulated on this {device}, not computed natively ({told})"
            )
        found, failed = self._recipe_at(values)
        while (
            baseline_ran
            and found is None
            and failed is not None
            and (fallback := recipe_fallback(values))
        ):
            given_up, values = fallback
            self.reporter.phase(
                f"standard recipe: failed with {given_up} ({shortened(failed.message)}); "
                f"tried without it, as an engineer who saw the error would"
            )
            found, failed = self._recipe_at(values)
        self.log.study.set_user_attr(RECIPE_ATTR, found.model_dump(mode="json") if found else {})
        if failed is not None:
            self.reporter.phase(
                f"the standard recipe failed ({shortened(failed.message)}): the race compares "
                "with the baseline alone"
            )
        elif found is None:
            self.reporter.phase("the standard recipe fits at no micro-batch the space offers")
        return found

    def _recipe_at(self, values: dict[str, Any]) -> tuple[TrainConfig | None, TrialRecord | None]:
        """(the recipe of ``values`` at the largest micro-batch predicted to fit that does, the
        record of a trial of it that failed for another reason than memory): a smaller batch
        would fail that way too, so the search stops there."""
        for config in recipe_candidates(values, self.proposer.space, self.proposer.completer()):
            # Largest first: the first predicted to fit is the one tried.
            if self.gate.fits(self.gate.predict(config)) is False:
                continue
            self.log.refresh()
            record = self.log.measured().get(config.key())
            if record is None:
                trial = self._claim(config)
                if trial is None:
                    record = self.log.measured().get(config.key())
                else:
                    record, _ = self._run_one(config, "search", trial=trial)
            if record is not None and record.fits:
                return config, None
            if record is not None and record.status == "pruned" and record.feasible:
                return config, None  # it runs and fits, slowly (another driver's search trial)
            if record is not None and record.status not in ("ok", "oom", "pruned"):
                return None, record
        return None, None

    def _baseline_values(self, accum: int) -> dict[str, object]:
        return {
            "global_batch_size": self.global_batch_size,
            "parallel": "ddp" if self.baseline_devices > 1 else "single",
            "world_size": self.baseline_devices,
            "device": self.platform.device_type,
            "grad_accum_steps": accum,
        }

    def _predicted_accumulation(self, start: int = 1) -> int | None:
        """The least accumulation (``start``, twice that, ...) at which the baseline is predicted
        to fit (a starting point, not a skip: the prediction itself, no margin). Before any
        trial, 1 when nothing is predicted to fit; after a baseline that did not fit (``start``
        above 1), None when no accumulation is predicted to fit: one trial over the limit is the
        lesson, not one per accumulation. ``start`` itself when nothing is predicted."""
        accum, largest = start, None
        while self.global_batch_size % (self.baseline_devices * accum) == 0:
            try:
                config = TrainConfig(**self.proposer.completer()(self._baseline_values(accum)))
            except ValueError:
                break
            prediction = self.gate.predict(config)
            if prediction is None:
                return start
            if self.gate.fits(prediction):
                if accum > 1:
                    self.reporter.phase(
                        f"baseline: accumulation {accum}, the least predicted to fit "
                        f"(~{prediction.peak_bytes / 2**20:,.0f} MiB predicted)"
                    )
                return accum
            largest = (accum, prediction)
            accum *= 2
        if start == 1:
            return 1
        if largest is not None:
            self.reporter.phase(
                f"baseline: predicted not to fit at any accumulation (~"
                f"{largest[1].peak_bytes / 2**20:,.0f} MiB predicted at accumulation "
                f"{largest[0]}, {self.limit_bytes / 2**20:,.0f} MiB allowed)"
            )
        return None

    def _learn_unused_parameters(self, record: TrialRecord) -> bool:
        """Whether ``record`` is the first DDP failure for parameters a step did not use; from
        then on every DDP configuration runs with ``find_unused_parameters=True``
        (``Proposer.find_unused_parameters`` reads it from the log)."""
        failures = [r for r in self.log.records if needs_unused_parameters(r)]
        if failures != [record]:
            return False
        self.reporter.phase(
            "the model leaves some parameters without a gradient in a step (an unused head or a "
            "conditional branch): DDP trials now run with find_unused_parameters=True"
        )
        return True

    def _learn_failing_values(self, record: TrialRecord | None) -> None:
        """Say so when ``record`` (None: any stored trial of a resumed study) showed a knob's
        value to fail (``lessons.failing_values``): from then on ``decide`` skips every
        configuration with it."""
        for failing in failing_values(self.log.records):
            known = failing.label
            shown_by = record is None or record in (failing.failed, failing.ran)
            if shown_by and known not in self._failing:
                self._failing.add(known)
                self.reporter.phase(
                    f"{known} {failing.reason()}: configurations with it are skipped from now on"
                )

    def decide(self, proposal: Proposal) -> TrialRecord | None:
        """The outcome of a proposal decided without running it, or None to run it."""
        config = proposal.config
        base = {"number": proposal.number, "role": "search", "config": config}
        if config is None:
            return TrialRecord(**base, status="invalid", message=proposal.invalid_reason)
        other = self.log.claimed(settle=True).get(config.key())
        if other is not None and other < proposal.number:  # the earlier claim runs it
            return TrialRecord(
                **base,
                status="duplicate",
                message=f"being measured by another driver's trial {other}",
            )
        self.log.refresh()  # what another driver finished since: no longer running, measured
        seen = self.log.measured().get(config.key())
        if seen is not None:  # never measured twice: the sampler hears the earlier outcome
            return TrialRecord(
                **base,
                status="duplicate",
                samples_per_s=seen.samples_per_s,
                memory_used_bytes=seen.memory_used_bytes,
                feasible=seen.feasible,
                message=f"same configuration as trial {seen.number} ({seen.status})",
            )
        return self._decided(config, base)

    def _decided(self, config: TrainConfig, base: dict[str, Any]) -> TrialRecord | None:
        """``config``'s outcome without running it, for what is known of it now (a knob's value
        that fails, memory measured or predicted over the limit), or None to run it."""
        failing = next((f for f in failing_values(self.log.records) if f.matches(config)), None)
        if failing is not None:
            message = f"{failing.label} {failing.reason()}"
            return TrialRecord(**base, status="skipped", message=message)
        prediction = self.gate.predict(config)
        fails = self.gate.fails(config)
        if fails is not None:
            message = f"{fails} (its step, traced under fake tensors, raised it)"
            return TrialRecord(**base, status="skipped", message=message)
        verdict = precheck(
            config, self.log.observations(), self.limit_bytes, trend=prediction is None
        )
        if verdict is not None:
            reason, violation = verdict
            return TrialRecord(
                **base,
                status="skipped",
                feasible=False,
                message=reason,
                predicted_memory_bytes=int(self.limit_bytes * (1 + violation)),
                predicted_memory_source="measured trials: " + reason.partition(" exceeds")[0],
            )
        if prediction is not None and self.gate.over(prediction, config):
            return TrialRecord(
                **base,
                status="skipped",
                feasible=False,
                message=self.gate.over_message(prediction, config),
                predicted_memory_bytes=prediction.peak_bytes,
                predicted_memory_source=prediction.source,
            )
        return None

    def search(self) -> None:
        """Propose, decide, run and record until a budget is spent."""
        running: dict[int, tuple[Proposal, Prediction | None]] = {}
        pending: Proposal | None = None
        limit = self.settings.cluster.concurrency or 1
        unproductive = refused = 0
        skips = SkipLines(self.reporter)
        exhausted = False
        while True:
            while len(running) < limit:
                if pending is None:
                    self.log.refresh()  # other drivers' trials count, and are not repeated
                    if (
                        exhausted
                        or self._out_of_budget()
                        or unproductive >= MAX_UNPRODUCTIVE_PROPOSALS
                    ):
                        break
                    proposal = self.proposer.propose()
                    decided = self.decide(proposal)
                    if decided is not None:
                        unproductive += 1
                        stored = self.proposer.record(proposal, decided)
                        if stored.status == "skipped":
                            skips.skipped(stored, self.log.best())
                        exhausted = self._space_exhausted([p.config for p, _ in running.values()])
                        continue
                    unproductive = 0
                    pending = proposal
                assert pending.config is not None
                request = self._request(pending.config, prune=True)
                if running and not self.executor.fits_now(request):
                    break  # wait for a running trial to free its devices
                proposal, pending = pending, None
                skips.trial_runs()
                self.reporter.trial_started("search", request.config)
                try:
                    prediction = self.gate.shown(request.config)
                    running[self.executor.submit(request)] = (proposal, prediction)
                    refused = 0
                except PlacementError as error:
                    refused += 1
                    record = TrialRecord(
                        number=proposal.number,
                        role="search",
                        status="invalid",
                        config=request.config,
                        message=str(error),
                    )
                    self.proposer.record(proposal, record)
                    if refused >= MAX_PLACEMENT_FAILURES and not running:
                        raise SearchError(
                            f"the cluster could place none of the last {refused} trials: "
                            f"{error}; lower --devices or give the cluster more resources"
                        ) from None
            if not running:
                skips.flush()
                return
            for ticket, result in self.executor.wait():
                proposal, prediction = running.pop(ticket)
                ran = self._record("search", result, prediction=prediction)
                record = self.proposer.record(proposal, ran)
                self.gate.learn()
                self.reporter.trial_finished(record, self.log.best())
                self._learn_unused_parameters(record)
                self._learn_failing_values(record)
                self._stop_if_every_trial_fails_alike()

    def _space_exhausted(self, running: list[TrainConfig | None]) -> bool:
        """Whether a small space has nothing left to measure: each of its configurations is
        measured, running (here or for another driver) or, asked again now, decided without
        running; said once, when it becomes so."""
        every = self.proposer.every_config()
        if every is None:
            return False
        taken = set(self.log.measured()) | set(self.log.claimed())
        taken |= {c.key() for c in running if c is not None}
        skipped = {r.config.key() for r in self.log.records if r.status == "skipped" and r.config}
        left = [c for c in every if c.key() not in taken]
        if any(c.key() not in skipped for c in left):  # never decided: not worth predicting now
            return False
        base = {"number": 0, "role": "search"}
        if any(self._decided(c, {**base, "config": c}) is None for c in left):
            return False  # what was learned since would run it now
        known = f"all {len(every)} of its configurations are measured (or being measured)"
        if left:
            known = (
                f"of its {len(every)} configurations, {len(every) - len(left)} are measured (or "
                f"being measured) and {len(left)} decided without running (the skipped trials "
                "say why)"
            )
        self.reporter.phase(f"the search space is exhausted: {known}; the search stops proposing")
        return True

    # -- finishing ----------------------------------------------------------------------------

    def finishing(self) -> Finishing:
        """The race, room and verification (``autotune.search.finishing``), over what the search
        settled: made once, after the references and the search."""
        if self._finishing is None:
            self._finishing = Finishing(
                log=self.log,
                settings=self.settings,
                reporter=self.reporter,
                run_one=self._run_one,
                gate=self.gate,
                choices=self.proposer.space.choices(),
                recipe=self.recipe_config,
                coupling=self.coupling,
                budget_bytes=self.budget_bytes,
            )
        return self._finishing

    def race(self) -> list[TrainConfig]:
        """The finalists raced, best first (``Finishing.race``)."""
        return self.finishing().race()

    def verify(self, ranked: list[TrainConfig]) -> tuple[TrainConfig, TrialResult]:
        """The race's winner confirmed (``Finishing.verify``)."""
        return self.finishing().verify(ranked)

    def run(self, exclusions: list[Exclusion], storage: str, study_name: str) -> Recommendation:
        """The whole search, and its recommendation."""
        if stored := len(self.log.measured()):
            self.reporter.resumed(stored)
            self._learn_failing_values(None)  # said again: the resumed search skips them
            self._resume_time_budget()
        self._stop_if_nothing_can_fit()
        self.references()
        self.search()
        finishing = self.finishing()
        winner, verification = finishing.verify(finishing.race() or finishing.race_with_room())
        return recommend(
            self.log.records,
            winner,
            verification,
            budget_bytes=self.budget_bytes,
            limit_bytes=self.limit_bytes,
            platform=self.platform,
            exclusions=exclusions + [f.exclusion() for f in failing_values(self.log.records)],
            storage=storage,
            study_name=study_name,
            recipe=self.recipe_config,
            memory_caveats=self.gate.caveats(winner),
            coupling=self.coupling,
            made_room=next((said for c, said in finishing.rooms if c == winner), ""),
        )
