"""How long a trial measures, and when it gives up: the measured window as a decision per step.

The window adapts to the model, as benchmark harnesses do (``torch.utils.benchmark``'s
``adaptive_autorange``, pyperf): it measures at least ``measured_steps`` steps and at least
``min_measure_s`` seconds, then stops as soon as the 95% interval of the mean step time is
within ``target_interval`` of it, or at ``max_measure_s`` whether tight or not. A model whose
steps take a millisecond gets thousands of steps; one whose steps take seconds gets a few.

With ``prune_below_samples_per_s`` set (the search sets it from the incumbent), a trial that is
clearly slower than that stops early: once the interval's fast end is still below it, or as soon
as one step (warm-up included, whose first step carries one-time costs) takes
``WARMUP_PRUNE_FACTOR`` times longer than a step at that throughput. A step that long is known
to be hopeless before it ends: the executors read each rank's phase and how long it has been in
it, and end a trial whose step has run past that limit (``overran``) rather than wait for it.

One step judges the trial only while the trial has shown nothing faster: once a step has ended
faster than a step at the line, a long one is a stall of the machine (seen on 2 CPU cores:
0.25-0.5 s pauses in steps of 20 ms, about one step in a thousand), and the interval decides.
What a step waited for an epoch's first batch (DataLoader workers started) is paid once an
epoch, measured apart as the epoch boundary, and is not held against the step either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from autotune.runner.request import TrialOptions
from autotune.stats import Interval, step_time_interval
from autotune.units import format_rate

Decision = Literal["measure", "done", "prune"]

WARMUP_PRUNE_FACTOR = 10.0
"""One step this many times longer than a step at the pruning throughput ends the trial at
once: a configuration 100x slower than the incumbent stops after its first step."""

STEP_PHASES = ("warm-up step", "measured step")
"""How a rank names the phase of a step the rule judges (then the step's number); a step that
may compile is named otherwise (``warmup_phase``) and is judged while it runs only past the
time its phase allows for compiling."""
COMPILED_WARMUP = f"compiled {STEP_PHASES[0]}"
"""A warm-up step after the first under torch.compile (then its number and its allowance)."""

RECOMPILE_ALLOWANCE = 2.0
"""A compiled warm-up step after the first may run this many times as long as the first step
(which compiled the whole step) before the rule may judge it while it runs: compiling again
takes no longer than compiling it all did, a hopeless step does."""
AFTER_FASTER = " (after a step faster than the line: its interval judges it)"
"""Said after a step's phase once the trial has shown a step faster than the pruning line: a
long step is then a stall of the machine, which the executors do not end (``overran``)."""
_ALLOWED = re.compile(
    rf"^{re.escape(COMPILED_WARMUP)} \d+ \(compiling again: up to (\d+(?:\.\d+)?) s\)"
)


def warmup_phase(index: int, compiling: bool, first_step_s: float = 0.0) -> str:
    """The phase of warm-up step ``index`` (from 0). Under torch.compile the first step
    compiles, and any warm-up step may compile again where the first broke a guard (a Hugging
    Face classifier sets ``config.problem_type`` in its first forward: seen on a ViT, whose
    second step recompiled for 5.6 s on 2 CPU cores and was pruned as hopeless). The rank
    judges such a step once it ends, if it did not compile; while it runs, only past
    ``RECOMPILE_ALLOWANCE`` times ``first_step_s`` (which the phase carries, for ``overran``)."""
    if not compiling:
        return f"{STEP_PHASES[0]} {index + 1}"
    if index == 0:
        return "compiling (first step)"
    allowed = RECOMPILE_ALLOWANCE * first_step_s
    return f"{COMPILED_WARMUP} {index + 1} (compiling again: up to {allowed:.1f} s)"


def _line_step_s(options: TrialOptions, global_batch_size: int) -> float | None:
    """The step time of the pruning throughput (None: no pruning)."""
    floor = options.prune_below_samples_per_s
    return global_batch_size / floor if floor else None


def step_limit_s(options: TrialOptions, global_batch_size: int) -> float | None:
    """How long one optimizer step may take before the trial is hopeless; None: no pruning."""
    slow = _line_step_s(options, global_batch_size)
    return WARMUP_PRUNE_FACTOR * slow if slow else None


def _past_the_limit(options: TrialOptions, global_batch_size: int, step_s: float) -> str | None:
    """Why a step of ``step_s`` (so far) is hopeless on its own, or None: the one rule, for a
    step that ended and for one still running."""
    slow = _line_step_s(options, global_batch_size)
    if slow is None or step_s <= WARMUP_PRUNE_FACTOR * slow:
        return None
    return (
        f"over {WARMUP_PRUNE_FACTOR:g}x the {slow:.3g} s of a step at "
        f"the pruning line, {format_rate(global_batch_size / slow)}"
    )


def overran(
    options: TrialOptions, global_batch_size: int, phase: str, running_s: float
) -> str | None:
    """Why a rank ``running_s`` into ``phase`` has already made the trial hopeless (the rule
    would prune it when the step ends), or None. A compiled warm-up step may compile again:
    it is judged only past the time its phase allows that (``warmup_phase``)."""
    if phase.endswith(AFTER_FASTER):
        return None
    allowed = _ALLOWED.match(phase)
    if allowed is not None and running_s <= float(allowed.group(1)):
        return None
    if not phase.startswith(STEP_PHASES) and allowed is None:
        return None
    why = _past_the_limit(options, global_batch_size, running_s)
    return f"{phase} still running after {running_s:.3g} s, {why}" if why else None


@dataclass
class Window:
    """The measured steps so far, and what to do after each one."""

    options: TrialOptions
    global_batch_size: int
    steps: list[float] = field(default_factory=list)
    reason: str = ""
    _sums: list[float] = field(default_factory=lambda: [0.0])  # running sums of ``steps``
    _faster: bool = False  # a step has ended faster than a step at the pruning line

    def phase(self, name: str) -> str:
        """A step's phase ``name`` as the executors read it: marked once the trial has shown a
        step faster than the line (``AFTER_FASTER``)."""
        return f"{name}{AFTER_FASTER}" if self._faster else name

    def interval(self) -> Interval:
        """The 95% interval of the mean step time (batch means once there are enough)."""
        return step_time_interval(self.steps, self._sums)

    def _add(self, step_s: float) -> None:
        self.steps.append(step_s)
        self._sums.append(self._sums[-1] + step_s)

    def warmup_step(self, step_s: float, epoch_start_s: float = 0.0) -> Decision:
        """After a warm-up step, ``epoch_start_s`` of which waited for an epoch's first batch:
        prune only a step that is hopeless on its own; that step is then the partial
        measurement."""
        if not self._hopeless(step_s, epoch_start_s):
            return "measure"
        self._add(step_s)
        return "prune"

    def measured_step(
        self, step_s: float, elapsed_s: float, epoch_start_s: float = 0.0
    ) -> Decision:
        """After a measured step, ``elapsed_s`` into the window (``epoch_start_s``: as for
        ``warmup_step``)."""
        self._add(step_s)
        if self._hopeless(step_s, epoch_start_s):
            return "prune"
        interval = self.interval()  # once per step: it runs between timed steps
        if self._clearly_slow(interval):
            return "prune"
        options, n = self.options, len(self.steps)
        if n < options.measured_steps:
            return "measure"
        if options.target_interval == 0:
            return "done"
        if elapsed_s < options.min_measure_s:
            return "measure"
        if interval.relative <= options.target_interval:
            return "done"
        return "done" if elapsed_s >= options.max_measure_s else "measure"

    def _hopeless(self, step_s: float, epoch_start_s: float) -> bool:
        judged = step_s - epoch_start_s
        line = _line_step_s(self.options, self.global_batch_size)
        if line is not None and judged <= line:
            self._faster = True
        why = _past_the_limit(self.options, self.global_batch_size, judged)
        if why is None or self._faster:  # after a step faster than the line: a stall
            return False
        waited = f" besides {epoch_start_s:.3g} s for an epoch's first batch"
        waited = waited if epoch_start_s >= 0.01 else ""
        self.reason = f"one step took {judged:.3g} s{waited}, {why}"
        return True

    def _clearly_slow(self, interval: Interval) -> bool:
        slow = _line_step_s(self.options, self.global_batch_size)
        if slow is None or len(self.steps) < 2:
            return False
        if interval.low <= slow:
            return False
        fastest = self.global_batch_size / interval.low
        self.reason = (
            f"at most {format_rate(fastest)} (95% interval over {len(self.steps)} steps), "
            f"below the pruning line, {format_rate(self.global_batch_size / slow)}"
        )
        return True
