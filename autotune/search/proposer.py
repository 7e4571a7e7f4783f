"""The searcher: proposes configurations from the space and learns from their outcomes.

Shaped like a Ray Tune searcher: ``propose`` asks Optuna's sampler for the next point,
``record`` reports the outcome of a proposed point (points it did not propose, such as the
baseline, go to the log directly: the sampler learns from every stored trial). Deciding whether
a proposal is worth running, and running it, are not its business.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from autotune.config import TrainConfig
from autotune.records import TrialRecord
from autotune.search.climb import Complete, Seen, next_move
from autotune.search.lessons import needs_unused_parameters
from autotune.search.log import StudyLog
from autotune.search.space import SearchSpace, space_points, valid_configs
from autotune.search.storage import UNCLAIMED_S, owner
from autotune.search.study import ask_fixed, ask_owned

SMALL_SPACE = 4096
"""A space of at most this many combinations is known whole: the search stops once each of its
configurations is measured or decided (``Proposer.every_config``), not after
``MAX_UNPRODUCTIVE_PROPOSALS`` proposals of nothing new."""


@dataclass(frozen=True)
class Proposal:
    """One proposed point: the asked trial, and its configuration (None: not a valid one)."""

    trial: Any
    config: TrainConfig | None
    invalid_reason: str = ""

    @property
    def number(self) -> int:
        return int(self.trial.number)


def _seen(record: TrialRecord) -> Seen:
    """What the climb reads of a measured trial (one with a configuration)."""
    assert record.config is not None
    return Seen(
        record.config,
        record.samples_per_s or 0.0,
        record.memory_used_bytes,
        record.steady_samples_per_s,
        record.data_wait_share,
    )


class Proposer:
    """Optuna's sampler over ``space``; ``fixed`` fields (global batch, device) are given."""

    def __init__(
        self,
        study: Any,
        log: StudyLog,
        space: SearchSpace,
        fixed: dict[str, Any],
        climb: bool = False,
        climb_floor: float = 0.5,
        hold_s: float = UNCLAIMED_S,
    ) -> None:
        self.study, self.log, self.space, self.fixed = study, log, space, fixed
        self.climb, self.climb_floor = climb, climb_floor
        self.hold_s = hold_s
        """How long a proposal is claimed for (another driver of the study leaves it alone)."""
        self._proposed: set[str] = set()
        self._every: dict[bool, list[TrainConfig]] = {}  # by find_unused_parameters
        self.traced_unused = False
        """Set when the memory trace showed a step to leave parameters without a gradient."""

    def _next_move(self) -> dict[str, Any] | None:
        """The climb's next point (``autotune.search.climb``), or None to let the sampler
        choose."""
        fastest = [_seen(r) for r in self.log.fastest() if r.config is not None]
        start = self.log.baseline()
        if not fastest and start is not None and start.config is not None:  # nothing fits yet
            fastest = [_seen(start)]
        measured = [
            _seen(r)
            for r in self.log.measured().values()
            if r.config is not None and r.samples_per_s
        ]
        floor = fastest[0].samples_per_s * self.climb_floor if fastest else 0.0
        tried = set(self.log.measured()) | self._proposed
        limit = self.log.limit_bytes
        return next_move(self.space, self.completer(), fastest, measured, tried, floor, limit)

    @property
    def find_unused_parameters(self) -> bool:
        """Whether DDP needs ``find_unused_parameters``: the memory trace showed it before any
        trial (``traced_unused``), or a DDP run without it failed because a step left
        parameters without a gradient (read from the log, so a resumed search knows)."""
        return self.traced_unused or any(needs_unused_parameters(r) for r in self.log.records)

    def completer(self) -> Complete:
        """Knob values -> with the fields the search sets: ``fixed``, and DDP's
        ``find_unused_parameters`` once the model is known to need it. The log is read once,
        here: the climb completes every neighbour of every measured configuration."""
        unused = {"find_unused_parameters": True} if self.find_unused_parameters else {}

        def complete(values: dict[str, Any]) -> dict[str, Any]:
            ddp = values.get("parallel") == "ddp"
            return {**values, **self.fixed, **(unused if ddp else {})}

        return complete

    @functools.cached_property
    def _points(self) -> list[dict[str, Any]] | None:
        """The space's combinations, counted once; None for more than ``SMALL_SPACE``."""
        return space_points(self.space, SMALL_SPACE)

    def every_config(self) -> list[TrainConfig] | None:
        """Every valid configuration ``propose`` could return, completed as it completes them;
        None for a space of more than ``SMALL_SPACE`` combinations."""
        if self._points is None:
            return None
        unused = self.find_unused_parameters
        if unused not in self._every:
            complete = self.completer()
            made = valid_configs(self._points, lambda values: TrainConfig(**complete(values)))
            self._every[unused] = made
        return self._every[unused]

    def propose(self) -> Proposal:
        """Ask for a trial and sample every knob whose condition holds: first a trial a killed
        driver left running, queued again when the study was resumed (``requeue_abandoned``;
        Optuna's ``ask`` takes it), then the climb's next move, then the sampler's."""
        move = self._next_move() if self.climb and not self._requeued() else None
        held = owner(None, self.hold_s)  # owned as it is made: sampling may take a while
        trial = (
            ask_fixed(self.study, move, held) if move is not None else ask_owned(self.study, held)
        )
        values: dict[str, Any] = {}
        for name, param in self.space.params.items():
            if param.active(values):
                values[name] = trial.suggest_categorical(name, list(param.choices))
        try:
            config = TrainConfig(**self.completer()(values))
        except ValueError as error:
            return Proposal(trial, None, str(error).splitlines()[-1].strip())
        self._proposed.add(config.key())
        self.log.claim(trial, config.key(), self.hold_s)
        return Proposal(trial, config)

    def _requeued(self) -> bool:
        """Whether the study holds trials queued again on resume, for whichever driver asks."""
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def record(self, proposal: Proposal, record: TrialRecord) -> TrialRecord:
        """The outcome of ``proposal`` (measured, or decided without running)."""
        return self.log.write(record.model_copy(update={"number": proposal.number}), proposal.trial)
