"""The search's finishing phase: the race of the finalists with the baseline and the standard
recipe, room for finalists that all went over the memory limit in it, and the verification of
the winner in a longer run.

``Tuner`` hands it what the search settled (its study log, the recipe, the memory gate) and how
to run one trial; the rules each step follows are ``race``'s, ``room``'s and ``evidence``'s.
"""

from __future__ import annotations

from typing import Any, Protocol

from autotune.config import TrainConfig
from autotune.errors import SearchError, shortened_keeping_hint
from autotune.records import Role, TrialRecord
from autotune.result import TrialResult
from autotune.search import race, room
from autotune.search.evidence import finalists, simplicity_reference
from autotune.search.log import StudyLog
from autotune.search.memory_gate import MemoryGate
from autotune.search.model_facts import EVERY_BLOCK_AT_ONE, every_block_at_one
from autotune.search.progress import Reporter
from autotune.search.recipe import Coupling
from autotune.search.settings import SearchSettings
from autotune.units import format_budget

ROOM_ATTR = "autotune:room"
"""The configurations raced where every finalist went over the memory limit (``race_with_room``),
as first settled (a resumed search races the same)."""


class RunOne(Protocol):
    """Runs one trial of ``config`` to its end and stores it (``Tuner._run_one``)."""

    def __call__(
        self, config: TrainConfig, role: Role, longer: int = 1, race_round: int | None = None
    ) -> tuple[TrialRecord, TrialResult]: ...


def nothing_fits(budget_bytes: int, limit_bytes: int, why: str) -> SearchError:
    """The search's end where no configuration fits the budget, ``why`` after the limit."""
    return SearchError(
        f"no configuration fits the memory budget of {format_budget(budget_bytes)} "
        f"(limit {format_budget(limit_bytes)} after the safety margin){why}"
    )


class Finishing:
    """The race, room and verification of one search, over what ``log`` holds."""

    def __init__(
        self,
        *,
        log: StudyLog,
        settings: SearchSettings,
        reporter: Reporter,
        run_one: RunOne,
        gate: MemoryGate,
        choices: dict[str, list[Any]],
        recipe: TrainConfig | None,
        coupling: Coupling | None,
        budget_bytes: int,
    ) -> None:
        self.log, self.settings, self.reporter, self.run_one = log, settings, reporter, run_one
        self.gate, self.choices, self.recipe, self.coupling = gate, choices, recipe, coupling
        self.budget_bytes, self.limit_bytes = budget_bytes, gate.limit_bytes
        self.rooms: list[tuple[TrainConfig, str]] = []
        """Where every finalist went over the limit in the race: the configurations raced in
        their place, each with what it moved (``race_with_room``)."""

    def race(self) -> list[TrainConfig]:
        """Race the best few, the baseline and the standard recipe in interleaved rounds until
        the winner is decided (see ``race``); return the candidates, best first, except that
        the one that changes least among those the race could not tell from the fastest comes
        first (``prefer_simpler``). Rounds already stored (a resumed study) are not run
        again."""
        candidates = finalists(self.log.records, self.settings.finishing.top_k)
        baseline = simplicity_reference(self.log.records)  # the baseline, where it fitted
        references = [baseline, self.recipe]
        for reference in references:
            if reference is not None and reference not in candidates:
                candidates.append(reference)
        return self._race(candidates, references)

    def _race(
        self, candidates: list[TrainConfig], references: list[TrainConfig | None]
    ) -> list[TrainConfig]:
        """The race's rounds among ``candidates`` (``references`` among them stay their
        rounds), and its ranking (``race``'s docstring)."""
        alive = list(candidates)
        for number in range(1, self.settings.finishing.race_rounds + 1):
            # A resumed study keeps its stored rounds and runs only what they lack, so a
            # search run again with more --race-rounds goes on where its race stopped; so do
            # the rounds another driver of the study ran.
            self.log.refresh()
            todo = [
                c
                for c in race.rotated(alive, number)
                if number not in race.race_runs(self.log.records, c)
            ]
            if todo:
                self.reporter.phase(
                    f"race round {number}: {len(alive)} configurations, interleaved"
                    if len(alive) > 1
                    else f"race round {number}: 1 configuration"
                )
            for config in todo:
                self.run_one(config, "race", race_round=number)
            alive = race.still_in(self.log.records, alive, references, number)
            if race.decided(alive, references, number):
                break
        ranked = race.ranking(self.log.records, candidates)  # the search's order: best first
        baseline = simplicity_reference(self.log.records)
        return race.prefer_simpler(self.log.records, ranked, baseline, self.coupling, self.recipe)

    def race_with_room(self) -> list[TrainConfig]:
        """Where every finalist left the race for memory alone (measured over the limit in a
        run after its search trial fitted): race each with persistent workers, else at the
        least larger accumulation, else checkpointing, else compiling off, expected to leave
        room (``autotune.search.room``) instead, once; the ranking as ``race``'s (empty: no
        finalist could be moved, or none of them fits)."""
        dropped = finalists(self.log.records, self.settings.finishing.top_k)
        if not dropped or not all(room.over_in_race(self.log.records, c) for c in dropped):
            return []
        stored = self.log.study.user_attrs.get(ROOM_ATTR)
        if stored is None:  # chosen once: a resumed search races the same
            moves = self._rooms(dropped)
            stored = [
                {"config": m.config.model_dump(mode="json"), "said": m.describe()} for m in moves
            ]
            self.log.study.set_user_attr(ROOM_ATTR, stored)
            if moves:
                self.reporter.phase(
                    f"every finalist went over the memory limit "
                    f"{self.limit_bytes / 2**20:,.0f} MiB in the race; racing each where it is "
                    "expected to leave room instead: " + "; ".join(m.describe() for m in moves)
                )
        self.rooms = [(TrainConfig.model_validate(m["config"]), str(m["said"])) for m in stored]
        configs = list(dict.fromkeys(c for c, _ in self.rooms))
        return self._race(configs, []) if configs else []

    def _rooms(self, dropped: list[TrainConfig]) -> list[room.Room]:
        """Each of ``dropped`` where it is expected to leave room (``room.make_room``)."""

        def predict(config: TrainConfig) -> int | None:
            found = self.gate.predict(config)
            return found.peak_bytes if found is not None else None

        choices = self.choices
        found = [
            room.make_room(c, self.log.records, choices, predict, self.limit_bytes) for c in dropped
        ]
        return [m for m in found if m is not None]

    def verify(self, ranked: list[TrainConfig]) -> tuple[TrainConfig, TrialResult]:
        """Confirm the race's winner in a longer run; a finalist whose longer run fails or
        does not fit gives way to the next."""
        if not ranked:
            candidates = finalists(self.log.records, self.settings.finishing.top_k)
            ran = [r for r in self.log.records if r.status in ("ok", "oom", "pruned")]
            failed = [r for r in self.log.records if r.status in ("error", "crashed")]
            if not candidates and not ran and failed:  # not memory: nothing ran to show it
                first = failed[0]
                said = first.message.splitlines()[0] if first.message else first.status
                raise SearchError(
                    f"no trial ran: all {len(failed)} failed (trial {first.number}: "
                    f"{shortened_keeping_hint(said)}); every trial is stored: see `autotune show`"
                )
            if not candidates:
                raise nothing_fits(self.budget_bytes, self.limit_bytes, self._least())
            lost = "; ".join(f"{c.summary()}: {self._last_failure(c)}" for c in candidates)
            moved = "; ".join(f"{c.summary()}: {self._last_failure(c)}" for c, _ in self.rooms)
            if moved:
                moved = f"; raced again where each was expected to leave room, none fit ({moved})"
            elif all(room.over_in_race(self.log.records, c) for c in candidates):
                moved = room.no_room(self.log.records, candidates)
            raise SearchError(
                f"every finalist failed in the race ({lost}){moved}; all "
                f"{len(self.log.records)} trials are stored: see `autotune show`"
            )
        fallback: tuple[TrainConfig, TrialResult] | None = None
        for config in ranked:
            self.reporter.phase(
                f"verifying in a run {self.settings.finishing.verify_factor}x a race run's"
            )
            record, result = self.run_one(
                config, "verify", longer=self.settings.finishing.verify_factor
            )
            if record.fits:
                return config, result
            fallback = fallback or (config, result)
        assert fallback is not None  # ranked is not empty
        return fallback

    def _least(self) -> str:
        """What the least any configuration measured or was predicted to need was, and what
        would make room: for the no-fit error."""
        needs = [
            (r.memory_used_bytes or r.predicted_memory_bytes or 0, r)
            for r in self.log.records
            if r.config is not None and (r.memory_used_bytes or r.predicted_memory_bytes)
        ]
        choices = self.choices
        missing = [
            f"allow {name} in the search space"
            for name in ("checkpoint_segments", "grad_accum_steps")
            if len(choices.get(name, ())) < 2
        ]
        if not needs:
            return "; raise --memory-budget" + "".join(f" or {m}" for m in missing)
        least, record = min(needs, key=lambda n: (n[0], not n[1].memory_used_bytes))
        how = "measured" if record.memory_used_bytes else "predicted"
        assert record.config is not None
        needed = least / (1 - self.settings.memory.safety_margin)
        return (
            f": the least was {least / 2**20:,.0f} MiB, {how} ({record.config.summary()}, "
            f"trial {record.number}); a budget of at least {format_budget(needed)} would hold it"
            + "".join(f", or {m}" for m in missing)
            + self._beyond(record.config)
        )

    def _beyond(self, config: TrainConfig) -> str:
        """For the no-fit error, where the space stops short of it: ``config`` with every block
        checkpointed at micro-batch 1 (``model_facts.every_block_at_one``), predicted, as
        ``plan`` says it; '' where nothing predicts or the space offers it."""
        model = self.gate.model
        further = every_block_at_one(config, model.workload) if model is not None else None
        if further is None:
            return ""
        offered = all(
            getattr(further, name) in self.choices.get(name, ())
            for name in ("checkpoint_segments", "grad_accum_steps")
        )
        prediction = None if offered else self.gate.predict(further)
        if prediction is None:
            return ""
        needs = prediction.peak_bytes
        budget = needs / (1 - self.settings.memory.safety_margin)
        verdict = (
            "within the limit: a space that offers it would run it"
            if self.gate.fits(prediction)
            else f"over the limit too (a budget of {format_budget(budget)} would hold it)"
        )
        return (
            f"; beyond the space, {further.summary()} ({EVERY_BLOCK_AT_ONE}) is predicted "
            f"~{needs / 2**20:,.0f} MiB, {verdict}"
        )

    def _last_failure(self, config: TrainConfig) -> str:
        tried = [r for r in self.log.records if r.config == config and r.role == "race"]
        last = tried[-1] if tried else None
        if last is None:
            return "not raced"
        if last.status == "ok":
            return "over the memory limit"
        return f"{last.status}: {last.message}"[:120]
