"""The searcher: proposes configurations from the space and learns from their outcomes.

Shaped like a Ray Tune searcher: ``propose`` asks Optuna's sampler for the next point,
``record`` reports the outcome of a proposed point, ``add`` an evaluated point the proposer did
not propose (the baseline). Deciding whether a proposal is worth running, and running it, are
not its business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.config import TrainConfig
from autotune.records import TrialRecord
from autotune.search.log import StudyLog
from autotune.search.space import SearchSpace


@dataclass(frozen=True)
class Proposal:
    """One proposed point: the asked trial, and its configuration (None: not a valid one)."""

    trial: Any
    config: TrainConfig | None
    invalid_reason: str = ""

    @property
    def number(self) -> int:
        return int(self.trial.number)


class Proposer:
    """Optuna's sampler over ``space``; ``fixed`` fields (global batch, device) are given."""

    def __init__(
        self, study: Any, log: StudyLog, space: SearchSpace, fixed: dict[str, Any]
    ) -> None:
        self.study, self.log, self.space, self.fixed = study, log, space, fixed

    def propose(self) -> Proposal:
        """Ask for a trial and sample every knob whose condition holds."""
        trial = self.study.ask()
        values: dict[str, Any] = {}
        for name, param in self.space.params.items():
            if param.active(values):
                values[name] = trial.suggest_categorical(name, list(param.choices))
        try:
            return Proposal(trial, TrainConfig(**values, **self.fixed))
        except ValueError as error:
            return Proposal(trial, None, str(error).splitlines()[-1].strip())

    def record(self, proposal: Proposal, record: TrialRecord) -> TrialRecord:
        """The outcome of ``proposal`` (measured, or decided without running)."""
        return self.log.write(record.model_copy(update={"number": proposal.number}), proposal.trial)

    def add(self, record: TrialRecord) -> TrialRecord:
        """An evaluated point the sampler did not propose: it learns from it all the same."""
        return self.log.write(record)
