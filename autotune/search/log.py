"""The stored trial format: one write path for every trial of a study, and the reads the search
makes of it.

Every trial, proposed by the sampler or not (baseline, race runs, verification), is written by
``StudyLog.write`` as soon as it ends; SQLite commits each write, so killing the driver loses
nothing that completed. What Optuna is told follows from the record (and, for a duplicate, the
trial it repeats): a measurement, out of memory included, is a completed trial whose memory
constraint the sampler learns from; a pruned trial (stopped early, clearly slower than the
incumbent) is told PRUNED with its partial samples/s, which TPE ranks below every completed
trial, and with its memory constraint when its peak was read (a trial ended mid-step has none,
and is not told it went over); a duplicate is told as the trial it repeats, a pre-check skip as
a completed trial over the limit; anything else failed.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from autotune.records import SEARCH_ROLES, Role, TrialRecord, last_baseline
from autotune.result import TrialResult
from autotune.search.precheck import Observation
from autotune.search.storage import OWNER_ATTR, claims, owner, running
from autotune.search.study import ATTR_PREFIX, ask_owned

ID_ATTR = ATTR_PREFIX + "id"
SETTLE_S = 1.0
"""How long a claim takes to be seen by another driver, at most (a trial is asked, its knobs
suggested and its owner written in separate writes)."""


def memory_used(result: TrialResult, device_type: str) -> int | None:
    """The memory a trial is judged by: the per-device peak on CUDA (what the caching allocator
    reserved: CUDA graph pools and fragmentation are memory the run takes too), all ranks' peaks
    together on CPU (the ranks share the host); None when the trial did not finish."""
    peaks = [
        max(r.peak_memory_bytes, r.peak_reserved_bytes or 0)
        for r in result.ranks
        if r.status == "ok"
    ]
    if result.status not in ("ok", "pruned") or not peaks:
        return None
    return max(peaks) if device_type == "cuda" else sum(peaks)


DIVERGES = "training diverges under this configuration"
"""The end of the reason of a trial that ran with a loss that was not finite: recorded as an
error, so that the search never takes it for a configuration that trains."""


def to_record(
    number: int,
    role: Role,
    result: TrialResult,
    device_type: str,
    limit_bytes: int,
    race_round: int | None = None,
    prediction: tuple[int, str] | None = None,
) -> TrialRecord:
    """The stored record of a trial that ran, with the peak predicted before it ran."""
    used = memory_used(result, device_type)
    feasible = (
        used <= limit_bytes if used is not None else (False if result.status == "oom" else None)
    )
    status, message = result.status, result.message
    if result.ok and (diverged := result.diverged):
        status, message = "error", f"{diverged}: {DIVERGES}"
    return TrialRecord(
        number=number,
        role=role,
        status=status,
        config=result.config,
        samples_per_s=result.samples_per_s,
        samples_per_s_low=result.samples_per_s_low,
        samples_per_s_high=result.samples_per_s_high,
        steady_samples_per_s=result.steady_samples_per_s,
        step_time_drift=result.step_time_drift,
        data_wait_share=result.data_wait_share,
        race_round=race_round,
        memory_used_bytes=used,
        allocated_bytes=max(r.peak_memory_bytes for r in result.ranks if r.status == "ok")
        if device_type == "cuda" and used is not None
        else None,
        feasible=feasible,
        message=message,
        overhead_s=result.overhead_s,
        warmup_s=result.warmup_s,
        measured_s=result.measured_s,
        compile_s=result.compile_s,
        compiled_before=result.compiled_before,
        predicted_memory_bytes=prediction[0] if prediction else None,
        predicted_memory_source=prediction[1] if prediction else "",
    )


def _attributes(record: TrialRecord) -> dict[str, Any]:
    """User attributes of a trial: the full record, plus flat fields a dashboard shows well.
    A predicted peak is labelled as a prediction, never as a measured one."""
    attrs: dict[str, Any] = {
        ATTR_PREFIX + "record": record.model_dump(mode="json"),
        "role": record.role,
        "status": record.status,
        "config": record.config.summary() if record.config else "",
    }
    if record.memory_used_bytes is not None:
        attrs["peak_memory_MiB"] = round(record.memory_used_bytes / 2**20, 1)
    if record.predicted_memory_bytes is not None:
        attrs["predicted_peak_memory_MiB"] = round(record.predicted_memory_bytes / 2**20, 1)
    if record.message:
        attrs["reason"] = record.message
    return attrs


def record_of(trial: Any) -> TrialRecord | None:
    """The TrialRecord stored on an Optuna trial, or None for trials that carry none."""
    raw = trial.user_attrs.get(ATTR_PREFIX + "record")
    if raw is None:
        return None
    return TrialRecord.model_validate({**raw, "number": trial.number})


def stored_records(study: Any) -> list[TrialRecord]:
    """Every finished trial's record, in trial order."""
    from optuna.trial import TrialState

    finished = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
    records = [record_of(t) for t in study.get_trials(deepcopy=False, states=finished)]
    return [r for r in records if r is not None]


class StudyLog:
    """A study's records, read when it opens, appended to by every write, and refreshed with
    what other drivers of the study stored (``refresh``)."""

    def __init__(self, study: Any, limit_bytes: int) -> None:
        self.study, self.limit_bytes = study, limit_bytes
        self.records: list[TrialRecord] = stored_records(study)

    def refresh(self) -> list[TrialRecord]:
        """Add the records other drivers stored since the last read; return them."""
        known = {r.number for r in self.records}
        new = [r for r in stored_records(self.study) if r.number not in known]
        if new:
            self.records = sorted([*self.records, *new], key=lambda r: r.number)
        return new

    def proposing_s(self) -> float:
        """Wall time the stored baseline and search trials took, overlaps counted once: what a
        resumed search's time budget has already spent (as its trial budget counts the stored
        trials). Trials stored without running (skipped, duplicates) take none."""
        roles = {r.number: r.role for r in self.records}
        spans = sorted(
            (t.datetime_start, t.datetime_complete)
            for t in self.study.get_trials(deepcopy=False)
            if roles.get(t.number) in SEARCH_ROLES
            and t.datetime_start is not None
            and t.datetime_complete is not None
        )
        total, end = 0.0, None
        for start, stop in spans:
            begin = start if end is None else max(start, end)
            total += max(0.0, (stop - begin).total_seconds())
            end = stop if end is None else max(end, stop)
        return total

    def claimed(self, settle: bool = False) -> dict[str, int]:
        """Configurations another driver of the study is measuring now: key -> trial.
        ``settle``: while another driver is at work, look again ``SETTLE_S`` later, so that a
        claim it was writing at this moment is seen too (the lower trial number then runs the
        configuration, the other leaves it)."""
        found, others = running(self.study)
        if settle and others:
            time.sleep(SETTLE_S)
            found = claims(self.study)
        return found

    def claim(self, trial: Any, key: str | None, hold_s: float) -> None:
        """Mark ``trial`` as this driver's, measuring the configuration ``key``, for at most
        ``hold_s`` seconds (then another driver may take it for abandoned)."""
        trial.set_user_attr(OWNER_ATTR, owner(key, hold_s))

    def ask_claimed(self, key: str, hold_s: float) -> Any:
        """A new trial, claimed for ``key``, for a run the sampler did not propose."""
        return ask_owned(self.study, owner(key, hold_s))

    def violation(self, record: TrialRecord) -> float | None:
        """How far over the memory limit (> 0: infeasible), from the measured peak or else the
        predicted one; None when memory says nothing."""
        used = record.memory_used_bytes
        if used is None and not record.is_measurement:  # what ran is judged by what it did
            used = record.predicted_memory_bytes
        if used:
            return used / self.limit_bytes - 1
        if record.status == "oom" or record.feasible is False:
            return 1.0
        return None

    def _constraint(self, record: TrialRecord) -> float | None:
        """The memory constraint ``record`` is told with as a completed trial; None: it failed."""
        violation = self.violation(record)
        if record.status == "pruned" and record.memory_used_bytes is None:
            return violation  # ended mid-step from outside: its memory was never read
        if record.status in ("ok", "oom", "pruned"):
            # Out of memory is an infeasible measurement, not a failure: the sampler learns
            # the boundary from it. The value of an infeasible trial is never compared.
            return violation if violation is not None else 1.0
        if record.status in ("skipped", "duplicate"):
            return violation  # known from the earlier trial, or predicted
        return None

    def _pruned(self, record: TrialRecord) -> bool:
        """Told PRUNED: a pruned trial, or a duplicate of one (it hears the earlier outcome)."""
        if record.status == "duplicate" and record.config is not None:
            earlier = self.measured().get(record.config.key())
            return earlier is not None and earlier.status == "pruned"
        return record.status == "pruned"

    def write(self, record: TrialRecord, trial: Any = None) -> TrialRecord:
        """Store ``record``: tell the asked ``trial``, or add a trial the sampler did not
        propose. Returns the record as stored (numbered like its Optuna trial)."""
        import optuna
        from optuna.trial import TrialState

        constraint = self._constraint(record)
        value = record.samples_per_s or 0.0
        pruned = self._pruned(record)
        if trial is not None:
            try:
                for key, attr in _attributes(record).items():
                    trial.set_user_attr(key, attr)
                if constraint is not None:
                    trial.set_constraint("memory", constraint)
                if pruned:  # TPE ranks it below complete trials, by value
                    trial.report(value, step=0)
                    self.study.tell(trial, state=TrialState.PRUNED)
                elif constraint is None:
                    self.study.tell(trial, state=TrialState.FAIL)
                else:
                    self.study.tell(trial, value)
                stored = record.model_copy(update={"number": trial.number})
                self.records.append(stored)
                return stored
            except (RuntimeError, ValueError):
                # another driver took it for abandoned and failed it: stored anew below
                if not self.study.get_trials(deepcopy=False)[trial.number].state.is_finished():
                    raise
        state = TrialState.PRUNED if pruned else TrialState.COMPLETE
        ident = uuid.uuid4().hex
        self.study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.FAIL if constraint is None and not pruned else state,
                value=None if constraint is None or pruned else value,
                intermediate_values={0: value} if pruned else None,
                user_attrs={**_attributes(record), ID_ATTR: ident},
                constraints=None if constraint is None else {"memory": constraint},
            )
        )
        # other drivers may add trials at the same time: find this one by its id
        trials = self.study.get_trials(deepcopy=False)
        number = next(t.number for t in reversed(trials) if t.user_attrs.get(ID_ATTR) == ident)
        stored = record.model_copy(update={"number": number})
        self.records.append(stored)
        return stored

    # -- reads ------------------------------------------------------------------------------

    def measured(self) -> dict[str, TrialRecord]:
        """The measurements the trial budget counts, by configuration key."""
        return {r.config.key(): r for r in self.records if r.counts_toward_budget and r.config}

    def observations(self) -> list[Observation]:
        """What earlier trials showed about memory, for the pre-check."""
        return [
            Observation(r.config, r.memory_used_bytes if r.status == "ok" else None, r.number)
            for r in self.records
            if r.config is not None and r.status in ("ok", "oom")
        ]

    def best(self) -> TrialRecord | None:
        """The fastest measurement that fits, of the baseline and the search."""
        return next(iter(self.fastest()), None)

    def fastest(self) -> list[TrialRecord]:
        """The measurements that fit, of the baseline and the search, fastest first."""
        fitting = [r for r in self.records if r.fits and r.role in SEARCH_ROLES]
        return sorted(fitting, key=lambda r: -(r.samples_per_s or 0.0))

    def baseline(self) -> TrialRecord | None:
        """The last baseline attempt, whatever its outcome (None before any)."""
        return last_baseline(self.records)
