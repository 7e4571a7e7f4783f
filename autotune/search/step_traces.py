"""The training steps a memory model has traced under fake tensors, by what each depends on:
traced when first looked up, or ahead, side by side (``side_by_side``), for a table's plan.

A trace is kept once a process (``_TRACED``, by workload and key), so a second model of the
same workload (a search's, after a plan's) traces nothing again. A step that could not be traced
ends the tracing: ``error`` says why, and every later look-up answers None.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from autotune.runner.fake_memory import TensorPeak, TraceError, trace_step, warnings_once
from autotune.runner.planned_gpu import planned
from autotune.runner.workload import WorkloadSpec
from autotune.search.side_by_side import forked_autograd_runs, run_side_by_side

Job = tuple[int, str, int, str, int, str, bool]
"""A step to trace: micro-batch, autocast, checkpointed blocks, optimizer implementation, the
world it is traced among, the checkpointing policy ("full" where nothing is checkpointed), and
whether the optimizer steps in backward."""

Key = tuple[int, str, int, str, int, str, bool]
"""What a trace is kept by: a job with its autocast as its ``precision``."""

_TRACED: dict[tuple[Any, ...], TensorPeak] = {}
"""Traces by workload and what they depend on, shared by every model in this process."""


def precision(amp: str) -> str:
    """fp16 and bf16 hold the same bytes: one trace serves both."""
    return "fp32" if amp == "off" else "16-bit"


Kind = tuple[str, str]
"""A kind of step: its precision, and how it checkpoints ("" not at all, else its policy). A
failure of the model's own in one kind (attention whose code enables CUDA's flash kernel alone
fails in float32) leaves the other kinds traced (``memory_gate``, ``plan``)."""


def kind_of(amp: str, segments: int, policy: str = "full") -> Kind:
    return precision(amp), policy if segments > 0 else ""


def kind_words(kind: Kind) -> str:
    """``kind`` in words: "fp32 steps", "16-bit steps with checkpointing", "fp32 steps with
    selective checkpointing"."""
    how = {"": "", "full": " with checkpointing"}.get(kind[1], f" with {kind[1]} checkpointing")
    return f"{kind[0]} steps{how}"


def traced_policy(segments: int, policy: str) -> str:
    """The policy a step of ``segments`` checkpointed blocks is traced and kept under: none
    checkpointed is "full" (a configuration's selective policy names no block there)."""
    return policy if segments else "full"


def key_of(job: Job) -> Key:
    micro_batch, amp, segments, impl, world, policy, in_backward = job
    policy = traced_policy(segments, policy)
    return (micro_batch, precision(amp), segments, impl, world, policy, in_backward)


def tracing_line(job: Job) -> str:
    micro_batch, amp, segments, impl, world, policy, in_backward = job
    return (
        f"tracing a step under fake tensors: micro-batch {micro_batch}, {precision(amp)}, "
        f"{segments} block(s) checkpointed"
        + (f" ({policy})" if traced_policy(segments, policy) != "full" else "")
        + (f", optimizer {impl}" if impl != "default" else "")
        + (", stepped in backward" if in_backward else "")
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

    def get(self, job: Job) -> TensorPeak | None:
        """``job``'s trace, traced now if no trace of the process holds it; None once a step
        could not be traced (``error`` says why)."""
        key = key_of(job)
        if key not in self.held and self.error is None:
            shared = self._shared(key)
            try:
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
        """Trace ``jobs`` now, ``processes`` at a time, for ``get`` to find (one at a time where
        a forked copy could not run a backward). Where one failed, ``error`` says the first of
        them in ``jobs``' order (the one looking them up in that order would meet), as traced
        here: a copy's failure may be the fork's, not the model's, so such a step is traced
        here again. A job no copy answered for is traced when it is looked up."""
        if processes > 1 and not forked_autograd_runs():
            processes = 1
        total, at_once, here = len(jobs), min(processes, len(jobs)), os.getpid()

        def starting(index: int, job: Job) -> None:
            if self.tracing is not None:
                self.tracing(tracing_line(job) + f" ({index + 1} of {total}, {at_once} at a time)")

        def work(job: Job) -> TensorPeak | tuple[int, str]:
            try:
                return self._run(job)
            except TraceError as error:
                return os.getpid(), str(error)  # which process failed, and why

        with warnings_once():  # what a copy's trace warned of, said here once with our own
            done = run_side_by_side(jobs, work, processes, starting)
        for index in sorted(done):  # in order: the first failure is the one a look-up meets
            answer, key = done[index], key_of(jobs[index])
            if isinstance(answer, TensorPeak):
                _TRACED[self._shared(key)] = answer
            elif self.error is None and answer[0] == here:
                self.error = answer[1]
            elif self.error is None:  # a copy's: traced here again, whose failure is the model's
                self.get(jobs[index])

    def _shared(self, key: Key) -> tuple[Any, ...]:
        gpu = planned() if self.device_type == "cuda" else None  # its kernels, its answers
        return (self.workload.model_dump_json(), self.device_type, gpu, *key)

    def _run(self, job: Job) -> TensorPeak:
        micro_batch, amp, segments, impl, world, policy, in_backward = job
        return trace_step(
            self.workload,
            micro_batch,
            amp,
            segments,
            optimizer_impl=impl,
            device_type=self.device_type,
            world_size=world,
            checkpoint_policy=traced_policy(segments, policy),
            optimizer_in_backward=in_backward,
        )
