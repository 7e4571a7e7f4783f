"""Progress of a long search: a live display on a terminal, plain lines elsewhere, or nothing."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from autotune.config import TrainConfig
from autotune.errors import shortened
from autotune.records import PREDICTED_NOT_TO_FIT, TrialRecord
from autotune.stats import drift_size
from autotune.units import format_rate


class Reporter:
    """Receives search events; this base class stays silent (the Python API's default)."""

    def start(self, **info: Any) -> None:
        """Called once the space, probe and study are ready, before the first trial."""

    def resumed(self, measured: int) -> None:
        """Called before the first trial when the study already holds ``measured`` trials of
        the budget (a resumed study), so that the count goes on from them."""

    def phase(self, text: str) -> None:
        """Called when the search moves to a new phase (re-measuring, verifying)."""

    def trial_started(self, role: str, config: TrainConfig) -> None:
        """Called just before a trial is submitted."""

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        """Called when a trial's outcome is known (also for skipped trials)."""

    def close(self) -> None:
        """Called once at the end, also after an error."""


def prediction_text(record: TrialRecord) -> str:
    """The peak predicted before the trial ran, and how far off it was: never a measurement."""
    if record.predicted_memory_bytes is None:
        return ""
    text = f"predicted ~{record.predicted_memory_bytes / 2**20:,.0f} MiB"
    if (miss := record.prediction_miss) is not None:
        text += f", {miss}"
    return text


def _outcome(record: TrialRecord) -> str:
    predicted = prediction_text(record)
    if record.status == "ok" and record.samples_per_s is not None:
        fits = "fits" if record.feasible else "OVER BUDGET"
        used = (record.memory_used_bytes or 0) / 2**20
        compiled = f", compiled in {record.compile_s:.1f} s" if record.compile_s else ""
        if (drift := record.step_time_drift) is not None:
            way = "rising" if drift > 1 else "falling"
            compiled += f", step time {way} {drift_size(drift):.1f}x over its steps"
        predicted = f"; {predicted}" if predicted else ""
        return f"{format_rate(record.samples_per_s)}, {used:,.0f} MiB ({fits}{predicted}){compiled}"
    return shortened(f"{record.status}: {record.message}")


class LineReporter(Reporter):
    """One line per event, for logs and pipes."""

    def __init__(self, stream: TextIO | None = None, trials: int | None = None) -> None:
        self.stream = stream or sys.stderr
        self.trials = trials
        self.done = 0
        self.started = time.perf_counter()

    def _line(self, text: str) -> None:
        elapsed = time.perf_counter() - self.started
        print(f"[{elapsed:6.0f}s] {text}", file=self.stream, flush=True)

    def start(self, **info: Any) -> None:
        for key, value in info.items():
            self._line(f"{key}: {value}")

    def resumed(self, measured: int) -> None:
        self.done = measured
        if self.trials and measured >= self.trials:
            self._line(
                f"resuming: {measured} trial(s) already stored, the budget of {self.trials} "
                "spent: no new search trials (--trials more, or --new-study to start again)"
            )
        else:
            self._line(f"resuming: {measured} trial(s) of the budget already stored")

    @property
    def counted(self) -> str:
        """Trials done against the budget: "5/10", or "8 (budget 2)" once a resumed study
        holds more than this run's budget."""
        if not self.trials:
            return str(self.done)
        if self.done > self.trials:
            return f"{self.done} (budget {self.trials})"
        return f"{self.done}/{self.trials}"

    def phase(self, text: str) -> None:
        self._line(text)

    def trial_started(self, role: str, config: TrainConfig) -> None:
        self._line(f"{role} trial: {config.summary()}")

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        if record.counts_toward_budget:  # what the tuner's trial budget counts
            self.done += 1
        best_text = format_rate(best.samples_per_s) if best and best.samples_per_s else "-"
        counted = f"[trials {self.counted}, best {best_text}]"
        self._line(f"  #{record.number} {_outcome(record)}  {counted}")


class RichReporter(LineReporter):
    """A live status line (trials done / budget, best so far, current trial) above the log."""

    def __init__(self, trials: int | None = None) -> None:
        from rich.console import Console
        from rich.status import Status

        super().__init__(sys.stderr, trials)
        self.console = Console(stderr=True)
        self.status: Status = self.console.status("starting")
        self.status.start()
        self.best_text = "-"

    def _line(self, text: str) -> None:
        elapsed = time.perf_counter() - self.started
        self.console.log(f"[dim]{elapsed:6.0f}s[/] {text}", markup=True, highlight=False)

    def trial_started(self, role: str, config: TrainConfig) -> None:
        self.status.update(
            f"trials {self.counted} | best {self.best_text} | running {role}: {config.summary()}"
        )

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        if best and best.samples_per_s:
            self.best_text = format_rate(best.samples_per_s)
        super().trial_finished(record, best)

    def close(self) -> None:
        self.status.stop()


def make_reporter(quiet: bool, trials: int | None) -> Reporter:
    if quiet:
        return Reporter()
    if sys.stderr.isatty():
        try:
            return RichReporter(trials)
        except ImportError:
            pass
    return LineReporter(trials=trials)


SAID_IN_A_ROW = 5
"""Configurations decided without running said one by one before the rest are summed up."""
SUMMED_EVERY = 50
"""How many held back make a progress line while no trial runs."""


class SkipLines:
    """Says the configurations decided without running (skipped) between two trials: the
    first ``SAID_IN_A_ROW`` a line each, the rest summed up in one line once a trial runs or
    the search ends, and every ``SUMMED_EVERY`` of them while none does (a search where
    nothing fits proposed 218 in a row, a line each); a configuration proposed again is
    skipped in silence. Each is stored, and ``autotune show`` lists them all."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.in_a_row = 0
        self.held: list[TrialRecord] = []
        self.said: set[str] = set()  # by configuration

    def skipped(self, record: TrialRecord, best: TrialRecord | None) -> None:
        key = record.config.key() if record.config else ""
        if key in self.said:
            return
        self.said.add(key)
        self.in_a_row += 1
        if self.in_a_row <= SAID_IN_A_ROW:
            self.reporter.trial_finished(record, best)
            return
        self.held.append(record)
        if len(self.held) >= SUMMED_EVERY:
            self.flush()

    def trial_runs(self) -> None:
        """A trial starts: what was held is summed up, and the next skips are said again."""
        self.flush()
        self.in_a_row = 0

    def flush(self) -> None:
        if not self.held:
            return
        numbers = [r.number for r in self.held]
        predicted = [r.predicted_memory_bytes for r in self.held if r.predicted_memory_bytes]
        over = sum(r.message.startswith(PREDICTED_NOT_TO_FIT) for r in self.held)
        least = f", the least ~{min(predicted) / 2**20:,.0f} MiB predicted" if predicted else ""
        self.reporter.phase(
            f"  #{min(numbers)}-#{max(numbers)}: {len(self.held)} more configurations decided "
            f"without running ({over} predicted not to fit{least}; `autotune show` lists each)"
        )
        self.held = []
