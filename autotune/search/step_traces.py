"""The training steps a memory model has traced under fake tensors, by what each depends on:
traced when first looked up, or ahead, side by side (``side_by_side``), for a table's plan.

A trace is kept once a process (``_TRACED``, by workload and key), so a second model of the
same workload (a search's, after a plan's) traces nothing again. A step that could not be traced
ends the tracing: ``error`` says why, and every later look-up answers None.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from autotune.runner.fake_memory import TensorPeak, TraceError, trace_step, warnings_once
from autotune.runner.workload import WorkloadSpec
from autotune.search.side_by_side import run_side_by_side

Job = tuple[int, str, int, str, int]
"""A step to trace: micro-batch, autocast, checkpointed blocks, optimizer implementation, and
the world it is traced among."""

Key = tuple[int, str, int, str, int]
"""What a trace is kept by: a job with its autocast as its ``precision``."""

_TRACED: dict[tuple[Any, ...], TensorPeak] = {}
"""Traces by workload and what they depend on, shared by every model in this process."""


def precision(amp: str) -> str:
    """fp16 and bf16 hold the same bytes: one trace serves both."""
    return "fp32" if amp == "off" else "16-bit"


def key_of(job: Job) -> Key:
    micro_batch, amp, segments, impl, world = job
    return (micro_batch, precision(amp), segments, impl, world)


def tracing_line(job: Job) -> str:
    micro_batch, amp, segments, impl, world = job
    return (
        f"tracing a step under fake tensors: micro-batch {micro_batch}, {precision(amp)}, "
        f"{segments} block(s) checkpointed"
        + (f", optimizer {impl}" if impl != "default" else "")
        + (f", as one rank of {world}" if world > 1 else "")
    )


@dataclass
class StepTraces:
    """One workload's traced steps on one kind of device."""

    workload: WorkloadSpec
    device_type: str
    tracing: Callable[[str], None] | None = None
    """Told, in words, of each step about to be traced (seconds each): progress on long work."""
    last_trace_s: float | None = None
    """How long the last step traced here took (None: none traced yet)."""
    error: str | None = None
    held: dict[Key, TensorPeak] = field(default_factory=dict)
    _failed: dict[Key, str] = field(default_factory=dict)
    """Why a step a forked copy traced (``ahead``) failed, by key."""

    def get(self, job: Job) -> TensorPeak | None:
        """``job``'s trace, traced now if no trace of the process holds it; None once a step
        could not be traced (``error`` says why)."""
        key = key_of(job)
        if key not in self.held and self.error is None:
            shared = self._shared(key)
            try:
                if key in self._failed:
                    raise TraceError(self._failed[key])
                if shared not in _TRACED:
                    if self.tracing is not None:
                        self.tracing(tracing_line(job))
                    started = time.perf_counter()
                    _TRACED[shared] = self._run(job)
                    self.last_trace_s = time.perf_counter() - started
                self.held[key] = _TRACED[shared]
            except TraceError as error:
                self.error = str(error)
        return self.held.get(key)

    def missing(self, jobs: Iterable[Job]) -> list[Job]:
        """Those of ``jobs`` no trace of the process holds, each once, in order."""
        wanted: dict[Key, Job] = {}
        for job in jobs:
            key = key_of(job)
            if key not in self.held and self._shared(key) not in _TRACED:
                wanted.setdefault(key, job)
        return list(wanted.values())

    def ahead(self, jobs: list[Job], processes: int) -> None:
        """Trace ``jobs`` now, ``processes`` at a time, for ``get`` to find. Where one failed,
        ``error`` says the first of them in ``jobs``' order (the one looking them up in that
        order would meet); a job no copy answered for is traced when it is looked up."""
        total, at_once = len(jobs), min(processes, len(jobs))

        def starting(index: int, job: Job) -> None:
            if self.tracing is not None:
                self.tracing(tracing_line(job) + f" ({index + 1} of {total}, {at_once} at a time)")

        def work(job: Job) -> TensorPeak | str:
            try:
                return self._run(job)
            except TraceError as error:
                return str(error)

        with warnings_once():  # what a copy's trace warned of, said here once with our own
            done = run_side_by_side(jobs, work, processes, starting)
        for index, answer in done.items():
            key = key_of(jobs[index])
            if isinstance(answer, str):
                self._failed[key] = answer
            else:
                _TRACED[self._shared(key)] = answer
        failed = [self._failed[k] for k in map(key_of, jobs) if k in self._failed]
        if failed and self.error is None:
            self.error = failed[0]

    def _shared(self, key: Key) -> tuple[Any, ...]:
        return (self.workload.model_dump_json(), self.device_type, *key)

    def _run(self, job: Job) -> TensorPeak:
        micro_batch, amp, segments, impl, world = job
        return trace_step(
            self.workload,
            micro_batch,
            amp,
            segments,
            optimizer_impl=impl,
            device_type=self.device_type,
            world_size=world,
        )
