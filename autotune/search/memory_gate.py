"""What the search asks of the memory model: a configuration's predicted peak, said to the user
once where the model cannot be traced or was traced on an assumption, and whether a prediction
lets a trial run.

The model (``autotune.search.memory_model``) predicts; this gate decides with it, for the tuner:
a configuration predicted over the limit by more than the prediction's error is not run, the
baseline and the recipe start where the prediction itself fits, and every trial is recorded
beside what was predicted of it (for a model the fake tensors cannot trace, the measured trials'
own estimate).
"""

from __future__ import annotations

from collections.abc import Callable

from autotune.config import TrainConfig
from autotune.errors import MutatedKeptOutput
from autotune.records import PREDICTED_NOT_TO_FIT
from autotune.runner.fake_memory import MODEL_AT_FAULT, UNUSED_PARAMETERS
from autotune.search.log import StudyLog
from autotune.search.memory_model import MemoryModel, Prediction, config_kind
from autotune.search.precheck import measured_estimate
from autotune.search.proposer import Proposer
from autotune.search.step_traces import Kind, kind_of, kind_words

TRACE_SAID_S = 2.0
"""A trace that took this long has its successors said as they start: a pause the user sees."""


class MemoryGate:
    """The memory model (None: prediction is off) against ``limit_bytes``, calibrated on the
    trials of ``log``; ``say`` tells the user a line, once per news."""

    def __init__(
        self,
        model: MemoryModel | None,
        limit_bytes: int,
        log: StudyLog,
        proposer: Proposer,
        say: Callable[[str], None],
        devices: int,
    ) -> None:
        self.model, self.limit_bytes, self.log = model, limit_bytes, log
        self.proposer, self.say, self.devices = proposer, say, devices
        self.failing: dict[Kind, str] = {}  # kinds of step the model fails, and why
        if model is not None:
            model.tracing = self._tracing
        self.learn()  # a resumed study's trials, at once

    def learn(self) -> None:
        """Calibrate on every trial that ran to the end so far."""
        if self.model is not None:
            self.model.calibrate(self.log.records)

    def _tracing(self, step: str) -> None:
        """Say a step about to be traced where the wait shows: the first, and any after one
        that took ``TRACE_SAID_S`` or more (a model of many small ops, a recurrent layer
        unrolled step by step, traces for seconds while no trial runs)."""
        assert self.model is not None  # only a model calls it
        last = self.model.last_trace_s
        if last is None:
            self.say(f"memory: {step} (each distinct step once, on this machine's CPU)")
        elif last >= TRACE_SAID_S:
            self.say(f"memory: {step} (the last took {last:.0f} s)")

    def fails(self, config: TrainConfig) -> str | None:
        """Why a trial of ``config`` would fail, where its kind of step raised under fake tensors
        an error only such steps raise and every trial of them meets (a selectively checkpointed
        block writing into an output it keeps: ``MutatedKeptOutput``); else None."""
        error = self.failing.get(config_kind(config))
        if error is None or not error.startswith(MutatedKeptOutput.__name__):
            return None
        return error.removesuffix(MODEL_AT_FAULT)

    def predict(self, config: TrainConfig) -> Prediction | None:
        """``config``'s peak as the model predicts it now (None: the model defeats the fake
        tensors, said once)."""
        if self.model is None or config_kind(config) in self.failing:
            return None
        failed_before = self.model.trace_error is not None
        assumed_before = self.model.assumption is not None
        prediction = self.model.predict(config)
        error = self.model.trace_error
        if error is not None and not failed_before:
            if self._fails_alone(config, error):
                kind = config_kind(config)
                self.failing[kind] = error
                self.say(
                    f"memory: {kind_words(kind)} could not be traced under fake tensors: "
                    f"{error}; predicting those by a fit over measured trials, the rest traced"
                )
                return None
            self.say(
                f"memory: the model could not be traced under fake tensors: {error}; "
                "predicting by a fit over measured trials instead"
            )
        if self.model.assumption is not None and not assumed_before:
            self.say(f"memory: {self.model.assumption}")
        if self.model.needs_unused_parameters and not self.proposer.traced_unused:
            self.proposer.traced_unused = True
            if self.devices > 1:  # one device: no DDP trial to say it of
                self.say(f"{UNUSED_PARAMETERS}: DDP trials run with find_unused_parameters=True")
        return prediction

    def _fails_alone(self, config: TrainConfig, error: str) -> bool:
        """Whether ``config``'s step failing with ``error`` fails for its kind alone: an error
        of the model's own (not of fake tensors' limits), where the step of another kind (the
        other precision, nothing checkpointed) traces. Then the model is traced afresh for the
        other kinds (the traces this process made are not made again); else its failure is the
        model's, as before."""
        assert self.model is not None  # only a model's error is asked of
        if MODEL_AT_FAULT not in error:
            return False
        kind = config_kind(config)
        others = [a for a in ("off", "bf16") if kind_of(a, 0) not in (kind, *self.failing)]
        if not others:  # every kind without checkpointing failed: the model's failure
            return False
        try:
            probe = TrainConfig.model_validate(
                {**config.model_dump(), "amp": others[0], "fsdp_mixed_precision": "off",
                 "checkpoint_segments": 0, "checkpoint_policy": "full"}
            )  # fmt: skip
        except ValueError:  # no such configuration: the failure stays the model's
            return False
        model = self.model
        untraced = {*self.failing, kind}
        fresh = MemoryModel(
            model.workload, model.device_type, model.prior, model.calibration, untraced
        )
        fresh.tracing = self._tracing
        if fresh.predict(probe) is None:
            return False
        self.model = fresh
        return True

    def shown(self, config: TrainConfig) -> Prediction | None:
        """What a trial of ``config`` is recorded as predicted to hold: the model's prediction,
        else, for a model the fake tensors cannot trace, the measured trials' own estimate
        (``precheck.measured_estimate``), so that its error is shown too."""
        prediction = self.predict(config)
        untraced = self.model is not None and (
            self.model.trace_error is not None or config_kind(config) in self.failing
        )
        if prediction is None and untraced:
            found = measured_estimate(config, self.log.observations())
            if found is not None:
                prediction = Prediction(found[0], {}, found[1])
        return prediction

    def fits(self, prediction: Prediction | None) -> bool | None:
        """Whether the prediction itself lies within the limit, no margin (how the baseline and
        the recipe choose their starting point: an engineer takes what is expected to fit).
        None: nothing was predicted."""
        return None if prediction is None else prediction.peak_bytes <= self.limit_bytes

    def over(self, prediction: Prediction | None, config: TrainConfig) -> bool:
        """Predicted over the limit by more than the prediction's error (``margin_for``)."""
        if prediction is None or self.model is None:
            return False
        return prediction.peak_bytes * (1 - self.model.margin_for(config)) > self.limit_bytes

    def over_message(self, prediction: Prediction, config: TrainConfig) -> str:
        """Why a configuration ``over`` the limit is not run."""
        assert self.model is not None  # over() holds only with a model
        margin = self.model.margin_for(config)
        return (
            f"{PREDICTED_NOT_TO_FIT}: ~{prediction.peak_bytes / 2**20:,.0f} MiB predicted against "
            f"the limit {self.limit_bytes / 2**20:,.0f} MiB, beyond the prediction's error "
            f"({margin:.0%})"
        )

    @property
    def trace_error(self) -> str | None:
        return self.model.trace_error if self.model is not None else None

    def caveats(self, config: TrainConfig) -> list[str]:
        """What ``config``'s measured peak does not cover on this device (``MemoryModel``'s)."""
        return self.model.caveats(config) if self.model is not None else []
