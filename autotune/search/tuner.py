"""The search: baseline, Optuna proposals run on Ray, re-measurement, verification.

Propose (Optuna ask + the space), decide (dedupe, memory pre-check), run (the executor), record
(tell + the stored TrialRecord) are separate steps; this module only sequences them.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.recommendation import Recommendation
from autotune.records import Role, TrialRecord
from autotune.result import Platform, TrialResult
from autotune.runner.request import TrialOptions, TrialRequest
from autotune.runner.workload import WorkloadSpec
from autotune.search.precheck import Observation, precheck
from autotune.search.progress import Reporter
from autotune.search.settings import SearchSettings
from autotune.search.space import SearchSpace
from autotune.search.study import ATTR_PREFIX, stored_records

MAX_UNPRODUCTIVE_PROPOSALS = 200
THROUGHPUT_TOLERANCE = 0.10  # verification confirms throughput within this, or the spread


def _readable(record: TrialRecord) -> dict[str, Any]:
    """User attributes of a trial: the full record, plus flat fields a dashboard shows well."""
    attrs: dict[str, Any] = {
        ATTR_PREFIX + "record": record.model_dump(mode="json"),
        "role": record.role,
        "status": record.status,
        "config": record.config.summary() if record.config else "",
    }
    if record.memory_used_bytes is not None:
        attrs["peak_memory_MiB"] = round(record.memory_used_bytes / 2**20, 1)
    if record.message:
        attrs["reason"] = record.message
    return attrs


def memory_used(result: TrialResult, device_type: str) -> int | None:
    """The memory a trial is judged by: the per-device peak on CUDA, all ranks' peaks together
    on CPU (the ranks share the host); None when the trial did not finish."""
    peaks = [r.peak_memory_bytes for r in result.ranks if r.status == "ok"]
    if not result.ok or not peaks:
        return None
    return max(peaks) if device_type == "cuda" else sum(peaks)


@dataclass
class SearchState:
    """What the search knows so far: every record, and which configs were measured."""

    records: list[TrialRecord] = field(default_factory=list)

    def measured(self) -> dict[str, TrialRecord]:
        return {
            r.config.key(): r
            for r in self.records
            if r.config is not None
            and r.role in ("baseline", "search")
            and r.status not in ("skipped", "duplicate", "invalid")
        }

    def observations(self) -> list[Observation]:
        return [
            Observation(r.config, r.memory_used_bytes if r.status == "ok" else None, r.number)
            for r in self.records
            if r.config is not None and r.status in ("ok", "oom")
        ]


class Tuner:
    """Runs one search over ``space`` for ``workload`` with ``settings``."""

    def __init__(
        self,
        *,
        study: Any,
        executor: Any,
        workload: WorkloadSpec,
        settings: SearchSettings,
        space: SearchSpace,
        platform: Platform,
        devices: int,
        reporter: Reporter,
    ) -> None:
        self.study, self.executor, self.workload = study, executor, workload
        self.settings, self.space, self.platform = settings, space, platform
        self.devices, self.reporter = devices, reporter
        self.budget_bytes = settings.memory_budget_bytes(platform.device_memory_bytes)
        self.limit_bytes = int(self.budget_bytes * (1 - settings.safety_margin))
        self.state = SearchState(stored_records(study))
        self.started = time.perf_counter()

    # -- recording ------------------------------------------------------------------------

    def memory_used(self, result: TrialResult) -> int | None:
        return memory_used(result, self.platform.device_type)

    def _record(self, number: int, role: Role, result: TrialResult) -> TrialRecord:
        used = self.memory_used(result)
        return TrialRecord(
            number=number,
            role=role,
            status=result.status,
            config=result.config,
            samples_per_s=result.samples_per_s,
            memory_used_bytes=used,
            feasible=(used <= self.limit_bytes)
            if used is not None
            else (False if result.status == "oom" else None),
            message=result.message,
            overhead_s=result.overhead_s,
            warmup_s=result.warmup_s,
            measured_s=result.measured_s,
        )

    def _violation(self, record: TrialRecord) -> float | None:
        """How far over the memory limit (> 0 infeasible); None when memory says nothing."""
        if record.status == "oom" or (record.feasible is False and not record.memory_used_bytes):
            return 1.0
        if record.memory_used_bytes is None:
            return None
        return record.memory_used_bytes / self.limit_bytes - 1

    def _tell(self, trial: Any, record: TrialRecord) -> None:
        """Store ``record`` on an asked trial and tell Optuna the outcome."""
        from optuna.trial import TrialState

        for key, value in _readable(record).items():
            trial.set_user_attr(key, value)
        violation = self._violation(record)
        if record.status in ("ok", "oom") or (
            record.status in ("skipped", "duplicate") and violation is not None
        ):
            # Out of memory is an infeasible measurement, not a failure: the sampler learns
            # the boundary from it. The value of an infeasible trial is never compared.
            trial.set_constraint("memory", violation if violation is not None else 1.0)
            self.study.tell(trial, record.samples_per_s or 0.0)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        self.state.records.append(record)

    def _tell_invalid(self, trial: Any, config: TrainConfig | None, reason: str) -> None:
        record = TrialRecord(
            number=trial.number, role="search", status="invalid", config=config, message=reason
        )
        self._tell(trial, record)

    def _add(self, record: TrialRecord) -> None:
        """Store a trial the sampler did not propose (baseline, re-measurement, verification)."""
        import optuna
        from optuna.trial import TrialState

        violation = self._violation(record)
        measured = record.status in ("ok", "oom")
        frozen = optuna.trial.create_trial(
            state=TrialState.COMPLETE if measured else TrialState.FAIL,
            value=(record.samples_per_s or 0.0) if measured else None,
            user_attrs=_readable(record),
            constraints={"memory": violation if violation is not None else 1.0}
            if measured
            else None,
        )
        self.study.add_trial(frozen)
        number = self.study.get_trials(deepcopy=False)[-1].number
        self.state.records.append(record.model_copy(update={"number": number}))

    # -- running ----------------------------------------------------------------------------

    def _request(self, config: TrainConfig, longer: int = 1) -> TrialRequest:
        s = self.settings
        options = TrialOptions(
            warmup_steps=s.warmup_steps,
            measured_steps=s.measured_steps * longer,
            timeout_s=s.trial_timeout_s * longer,
            seed=s.seed,
            memory_limit_bytes=self._enforced_limit(config),
        )
        return TrialRequest(config=config, workload=self.workload, options=options)

    def _enforced_limit(self, config: TrainConfig) -> int | None:
        if not self.settings.enforce_memory_budget:
            return None
        if self.platform.device_type == "cpu":  # the host budget is shared by the ranks
            return self.budget_bytes // config.processes
        return self.budget_bytes

    def _run_one(self, config: TrainConfig, role: Role, longer: int = 1) -> TrialResult:
        self.reporter.trial_started(role, config)
        try:
            self.executor.submit(self._request(config, longer))
        except RuntimeError as error:
            return TrialResult(config=config, status="invalid", message=str(error))
        results: list[tuple[int, TrialResult]] = []
        while not results:
            results = self.executor.wait()
        return results[0][1]

    def _out_of_budget(self) -> bool:
        s = self.settings
        measured = len(self.state.measured())
        if s.trials is not None and measured >= s.trials:
            return True
        elapsed = time.perf_counter() - self.started
        return s.time_budget_s is not None and elapsed >= s.time_budget_s

    # -- phases -----------------------------------------------------------------------------

    def baseline(self) -> TrialRecord:
        """Plain DDP (or one device), fp32, no hook, no checkpointing, no workers."""
        for record in self.state.records:
            if record.role == "baseline" and record.status == "ok":
                return record
        accum = 1
        while True:
            values = {
                "global_batch_size": self.settings.global_batch_size,
                "parallel": "ddp" if self.devices > 1 else "single",
                "world_size": self.devices,
                "device": self.platform.device_type,
                "grad_accum_steps": accum,
            }
            try:
                config = TrainConfig(**values)
            except ValueError as error:
                raise ConfigError(f"no baseline configuration is possible: {error}") from None
            result = self._run_one(config, "baseline")
            record = self._record(-1, "baseline", result)
            self._add(record)
            self.reporter.trial_finished(self.state.records[-1], self.best())
            fits = record.status == "ok" and record.feasible
            divisible = self.settings.global_batch_size % (self.devices * accum * 2) == 0
            if fits or record.status not in ("ok", "oom") or not divisible:
                return self.state.records[-1]
            accum *= 2  # accumulation only as far as needed to fit

    def propose(self, trial: Any) -> TrainConfig | None:
        """Sample a config for an asked trial; tell it at once if it is not worth running."""
        values: dict[str, Any] = {}
        for name, param in self.space.params.items():
            if param.active(values):
                values[name] = trial.suggest_categorical(name, list(param.choices))
        try:
            config = TrainConfig(
                **values,
                global_batch_size=self.settings.global_batch_size,
                device=self.platform.device_type,
            )
        except ValueError as error:
            self._tell_invalid(trial, None, str(error).splitlines()[-1].strip())
            return None
        seen = self.state.measured().get(config.key())
        if seen is not None:  # never measured twice: the sampler hears the earlier outcome
            self._tell(
                trial,
                TrialRecord(
                    number=trial.number,
                    role="search",
                    status="duplicate",
                    config=config,
                    samples_per_s=seen.samples_per_s,
                    memory_used_bytes=seen.memory_used_bytes,
                    feasible=seen.feasible,
                    message=f"same configuration as trial {seen.number} ({seen.status})",
                ),
            )
            return None
        verdict = precheck(config, self.state.observations(), self.limit_bytes)
        if verdict is not None:
            reason, violation = verdict
            record = TrialRecord(
                number=trial.number,
                role="search",
                status="skipped",
                config=config,
                feasible=False,
                message=reason,
                memory_used_bytes=int(self.limit_bytes * (1 + violation)),
            )
            self._tell(trial, record)
            self.reporter.trial_finished(record, self.best())
            return None
        return config

    def search(self) -> None:
        """Ask, decide, run and tell until a budget is spent."""
        running: dict[int, Any] = {}
        pending: tuple[Any, TrainConfig] | None = None
        limit = self.settings.concurrency or 1
        unproductive = 0
        while True:
            while len(running) < limit:
                if pending is None:
                    if self._out_of_budget() or unproductive >= MAX_UNPRODUCTIVE_PROPOSALS:
                        break
                    trial = self.study.ask()
                    config = self.propose(trial)
                    if config is None:
                        unproductive += 1
                        continue
                    unproductive = 0
                    pending = (trial, config)
                trial, config = pending
                request = self._request(config)
                if running and not self.executor.fits_now(request):
                    break  # wait for a running trial to free its devices
                pending = None
                self.reporter.trial_started("search", config)
                try:
                    running[self.executor.submit(request)] = trial
                except RuntimeError as error:  # the cluster cannot place it
                    self._tell_invalid(trial, config, str(error))
            if not running:
                return
            for ticket, result in self.executor.wait():
                trial = running.pop(ticket)
                record = self._record(trial.number, "search", result)
                self._tell(trial, record)
                self.reporter.trial_finished(record, self.best())

    def best(self) -> TrialRecord | None:
        feasible = [
            r
            for r in self.state.records
            if r.status == "ok" and r.feasible and r.role in ("baseline", "search")
        ]
        return max(feasible, key=lambda r: r.samples_per_s or 0.0, default=None)

    def _runs_of(self, config: TrainConfig) -> list[TrialRecord]:
        key = config.key()
        return [
            r
            for r in self.state.records
            if r.config is not None
            and r.config.key() == key
            and r.role in ("baseline", "search", "remeasure")
            and r.status == "ok"
        ]

    def finalists(self) -> list[TrainConfig]:
        ranked = sorted(
            self.state.measured().values(), key=lambda r: r.samples_per_s or 0.0, reverse=True
        )
        top = [r.config for r in ranked if r.status == "ok" and r.feasible and r.config]
        return top[: self.settings.top_k]

    def baseline_config(self) -> TrainConfig | None:
        return next(
            (r.config for r in self.state.records if r.role == "baseline" and r.status == "ok"),
            None,
        )

    def remeasure(self) -> None:
        """Measure the best few, and the baseline, again: noise then neither picks the winner
        nor inflates its speed-up."""
        self.reporter.phase(f"re-measuring the best {self.settings.top_k} and the baseline")
        configs = self.finalists()
        baseline = self.baseline_config()
        if baseline is not None and baseline not in configs:
            configs.append(baseline)
        for config in configs:
            while len(self._runs_of(config)) < 1 + self.settings.remeasure:
                record = self._record(-1, "remeasure", self._run_one(config, "remeasure"))
                self._add(record)
                self.reporter.trial_finished(self.state.records[-1], self.best())
                if record.status != "ok":
                    break

    def _score(self, config: TrainConfig) -> tuple[float, list[TrialRecord]]:
        runs = self._runs_of(config)
        if not runs or not all(r.feasible for r in runs):
            return 0.0, runs
        return statistics.median(r.samples_per_s or 0.0 for r in runs), runs

    def verify(self) -> tuple[TrainConfig, float, list[TrialRecord], TrialResult | None]:
        """Pick the winner on repeated measurements and confirm it in a longer run."""
        ranked = sorted(self.finalists(), key=lambda c: self._score(c)[0], reverse=True)
        if not ranked:
            raise ConfigError(
                "no configuration fits the memory budget of "
                f"{self.budget_bytes / 2**30:.2f} GiB (limit {self.limit_bytes / 2**30:.2f} GiB "
                "after the safety margin); raise --memory-budget or allow checkpointing and "
                "accumulation in the search space"
            )
        fallback: tuple[TrainConfig, float, list[TrialRecord], TrialResult | None] | None = None
        for config in ranked:
            score, runs = self._score(config)
            if score <= 0:
                continue
            self.reporter.phase(f"verifying in a {self.settings.verify_factor}x longer run")
            result = self._run_one(config, "verify", longer=self.settings.verify_factor)
            record = self._record(-1, "verify", result)
            self._add(record)
            self.reporter.trial_finished(self.state.records[-1], self.best())
            if record.status == "ok" and record.feasible:
                return config, score, runs, result
            fallback = fallback or (config, score, runs, result)
        assert fallback is not None
        return fallback

    def run(self) -> tuple[TrainConfig, float, list[TrialRecord], TrialResult | None]:
        self.baseline()
        self.search()
        self.remeasure()
        return self.verify()

    def recommendation(
        self,
        storage: str,
        study_name: str,
        exclusions: list[Any],
        outcome: tuple[TrainConfig, float, list[TrialRecord], TrialResult | None],
    ) -> Recommendation:
        config, score, runs, verification = outcome
        baseline = next(
            (r for r in self.state.records if r.role == "baseline" and r.status == "ok"), None
        )
        baseline_runs = self._runs_of(baseline.config) if baseline and baseline.config else []
        baseline_speed = (
            statistics.median(r.samples_per_s or 0.0 for r in baseline_runs)
            if baseline_runs
            else None
        )
        samples = [r.samples_per_s or 0.0 for r in runs]
        spread = (max(samples) - min(samples)) / score if score else 0.0
        error = None
        if verification is not None and verification.samples_per_s:
            error = verification.samples_per_s / score - 1
        fits = (
            verification is not None
            and verification.ok
            and ((self.memory_used(verification) or 0) <= self.limit_bytes)
        )
        tolerance = max(THROUGHPUT_TOLERANCE, spread)
        confirmed = error is not None and abs(error) <= tolerance
        used = max(r.memory_used_bytes or 0 for r in runs)
        if verification is not None and verification.ok:
            used = max(used, self.memory_used(verification) or 0)
        return Recommendation(
            config=config,
            samples_per_s=score,
            samples_per_s_runs=samples,
            spread=spread,
            memory_used_bytes=used,
            memory_budget_bytes=self.budget_bytes,
            memory_limit_bytes=self.limit_bytes,
            verification=verification,
            verified=fits and confirmed,
            memory_confirmed=fits,
            throughput_confirmed=confirmed,
            throughput_tolerance=tolerance,
            verification_error=error,
            baseline=baseline,
            baseline_samples_per_s=baseline_speed,
            speedup=score / baseline_speed if baseline_speed else None,
            exclusions=exclusions,
            trials=sorted(self.state.records, key=lambda r: r.number),
            platform=self.platform,
            storage=storage,
            study_name=study_name,
        )
