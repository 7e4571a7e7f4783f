"""What the search needs from whatever runs its trials, and when to give up on a trial's ranks.

Three executors implement ``Executor``: ``LocalExecutor`` (rank processes on this machine, no
Ray), ``RayExecutor`` (gangs of rank actors on a Ray cluster) and the benchmarks'
``ReplayExecutor`` (recorded measurements, nothing runs). ``tests/runner/test_executor_contract.py``
runs one suite against each: whatever the executor, a trial's outcome is classified the same way
and no process outlives it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from autotune.result import RankReport, TrialResult
from autotune.runner.request import TrialRequest
from autotune.runner.window import overran

CUT_FLOOR_S = 1.0
"""A step is never ended from outside before it has run this long (see ``cut_reason``)."""


class PlacementError(RuntimeError):
    """The executor cannot place a trial's ranks: not now and not by waiting."""


class Executor(Protocol):
    """Runs trials; the search submits, waits, and never sees a process or an actor."""

    rank_imports: tuple[str, ...]
    """What a rank of this executor imports besides the trial's own (a Ray worker: ray), for
    the CPU memory model's first guess at a rank's process."""

    def submit(self, request: TrialRequest) -> int:
        """Start a trial and return its ticket; its result comes back from ``wait``. Called when
        ``fits_now`` said yes, or when nothing else runs. Raises ``PlacementError`` when the
        trial can never be placed."""
        ...

    def wait(self, timeout_s: float | None = None) -> list[tuple[int, TrialResult]]:
        """Block until at least one submitted trial ends (or ``timeout_s`` passes); return the
        (ticket, result) of every trial that ended. Empty when nothing runs."""
        ...

    def fits_now(self, request: TrialRequest) -> bool:
        """Whether ``request`` could start now without waiting for a running trial to end."""
        ...

    def shutdown(self) -> None:
        """End every running trial and release every resource; called once, also after an
        error."""
        ...


def run_to_end(executor: Executor, request: TrialRequest) -> TrialResult:
    """Submit ``request`` and wait for its result, on an executor running nothing else (the
    sequential phases of a search, a single trial)."""
    ticket = executor.submit(request)
    while True:
        done = dict(executor.wait())
        if set(done) - {ticket}:
            raise RuntimeError(
                f"tickets {sorted(set(done) - {ticket})} ended while waiting for {ticket}"
            )
        if ticket in done:
            return done[ticket]


@dataclass
class Watchdog:
    """When to stop the ranks still running: ``timeout_s`` after the trial started, or
    ``failure_grace_s`` after one rank failed (the others' own errors are usually echoes of
    that failure, and a peer blocked in a collective never returns by itself)."""

    timeout_s: float
    failure_grace_s: float
    started: float = field(default_factory=time.perf_counter)
    failed_at: float | None = None

    def rank_failed(self, now: float) -> None:
        if self.failed_at is None:
            self.failed_at = now

    def expired(self, now: float) -> str | None:
        """Why the remaining ranks must be stopped now, or None."""
        if now - self.started > self.timeout_s:
            return f"timeout_s={self.timeout_s:g}"
        if self.failed_at is not None and now - self.failed_at > self.failure_grace_s:
            return "after another rank failed"
        return None


def cut_reason(
    request: TrialRequest, phase: str, running_s: float, restart_s: float = 0.0
) -> str | None:
    """Why to end the trial now, from outside, as pruned: a rank ``running_s`` into ``phase``
    is in a step that has run past the pruning rule's limit (``window.overran``), and for
    longer than ending it costs: ``restart_s``, what fresh ranks for the next trial take, and
    at least ``CUT_FLOOR_S``. A step short of that is left to end: the rank then prunes itself,
    with its measurement and memory peak, and its processes serve the next trial. (Waiting as
    long as a restart costs before paying for one keeps the loss within twice the best choice
    in hindsight, whatever the step's length.) A rank cannot end its own step: backward runs
    in C++, and its peers may wait in a collective; so its processes end."""
    if running_s < max(CUT_FLOOR_S, restart_s):
        return None
    return overran(request.options, request.config.global_batch_size, phase, running_s)


def cut_report(rank: int, reason: str, running_s: float) -> RankReport:
    """The report of a rank ended mid-step by ``cut_reason``: pruned, with the step's time so
    far as its one step time (a lower bound: the trial is at most that fast)."""
    return RankReport(
        rank=rank, status="pruned", message=reason, pruned=reason, step_times_s=[running_s]
    )


def stopped_message(phase: str, why: str) -> str:
    """The reason recorded for a rank the watchdog stopped."""
    return f"still running in {phase} ({why})"
