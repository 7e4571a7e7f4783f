"""Run trials on this machine: one process per rank, no Ray needed.

Each rank runs ``python -m autotune.runner.rank`` in a session of its own, so that the rank and
its DataLoader workers can be ended together. ``LocalExecutor`` watches them with the shared
``Watchdog``: when one fails the others get ``failure_grace_s`` to report, then everything left
is killed; at ``timeout_s`` the trial ends as timed out. Whatever happens, no process of a trial
outlives the ``wait`` that returns its result.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.result import Platform, RankReport, TrialResult
from autotune.runner.executor import (
    Watchdog,
    cut_reason,
    cut_report,
    run_to_end,
    stopped_message,
)
from autotune.runner.outcome import assemble_result
from autotune.runner.platform import detect_platform, resolve_device
from autotune.runner.request import TrialOptions, TrialRequest
from autotune.runner.workload import WorkloadSpec

POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cgroup_oom_kills() -> int:
    """OOM kills counted by this cgroup (v2), to tell the kernel's SIGKILL from others."""
    try:
        for line in Path("/sys/fs/cgroup/memory.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def kill_group(process: subprocess.Popen[Any]) -> None:
    """Kill ``process`` and every process of its session (started with ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def write_rank_output(out: TextIO, texts: Sequence[str | None]) -> None:
    """Each rank's output (``texts[rank]``; None: lost with its process) under a line naming
    the rank, to ``out``: what ``--debug`` shows of a trial's ranks, from any executor. One
    line where no rank printed anything (most of a search's trials)."""
    if all(text is not None and not text.strip() for text in texts):
        out.write(f"--- the {len(texts)} rank(s) printed nothing ---\n")
        out.flush()
        return
    for rank, text in enumerate(texts):
        said = "lost with its process" if text is None else "below" if text.strip() else "none"
        out.write(f"--- rank {rank}'s output ({said}) ---\n")
        if text:
            out.write(text if text.endswith("\n") else text + "\n")
    out.flush()


class _Ranks:
    """The rank processes of one trial and what each left behind."""

    def __init__(self, request: TrialRequest, workdir: Path) -> None:
        self.workdir = workdir
        request_path = workdir / "request.json"
        request_path.write_text(request.model_dump_json())
        world = request.config.processes
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(world),
            "AUTOTUNE_SPAWNED_AT": repr(time.time()),
            "PYTHONUNBUFFERED": "1",
        }
        self.processes = []
        for rank in range(world):
            log = open(workdir / f"stderr-{rank}.txt", "wb")  # noqa: SIM115 - closed below
            self.processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "autotune.runner.rank",
                        str(request_path),
                        str(rank),
                        str(workdir),
                    ],
                    env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            log.close()
        self.killed_by_us: set[int] = set()
        self.why = ""
        self.cut: tuple[str, float] | None = None  # why a step was cut, and its time so far

    def copy_output(self, out: TextIO) -> None:
        """Each rank's output, under a line naming the rank, to ``out``."""
        texts = []
        for rank in range(len(self.processes)):
            path = self.workdir / f"stderr-{rank}.txt"
            texts.append(path.read_text(errors="replace") if path.exists() else "")
        write_rank_output(out, texts)

    def report(self, rank: int) -> RankReport | None:
        path = self.workdir / f"rank-{rank}.json"
        return RankReport.model_validate_json(path.read_text()) if path.exists() else None

    def failed(self) -> bool:
        for rank, process in enumerate(self.processes):
            code = process.poll()
            report = self.report(rank)
            if (report is not None and report.status != "ok") or (code not in (None, 0)):
                return True
        return False

    def running(self) -> list[int]:
        return [r for r, p in enumerate(self.processes) if p.poll() is None]

    def kill_all(self, why: str) -> None:
        self.why = why
        for rank, process in enumerate(self.processes):
            if process.poll() is None:
                self.killed_by_us.add(rank)
            kill_group(process)
        for process in self.processes:
            process.wait()

    def _phase_file(self, rank: int) -> Path:
        """Where the rank writes its phase (``rank.Progress``); modified when a phase starts."""
        return self.workdir / f"phase-{rank}.txt"

    def phase(self, rank: int) -> str:
        path = self._phase_file(rank)
        return path.read_text() if path.exists() else "starting"

    def overran(self, request: TrialRequest) -> tuple[str, float] | None:
        """Why to cut the trial (``executor.cut_reason``), from a running rank's phase file,
        whose modification time is its phase's start; with the step's time so far."""
        for rank in self.running():
            path = self._phase_file(rank)
            try:
                phase, running_s = path.read_text(), time.time() - path.stat().st_mtime
            except OSError:  # not written yet
                continue
            why = cut_reason(request, phase, running_s)  # fresh processes every trial anyway
            if why is not None:
                return why, running_s
        return None

    def outcome(self, rank: int, oom_killed: bool) -> RankReport:
        """This rank's own report, or one made from how its process ended."""
        report = self.report(rank)
        if report is not None:
            return report
        if rank in self.killed_by_us:  # cut mid-step, or stopped by the watchdog
            if self.cut is not None:
                return cut_report(rank, *self.cut)
            message = stopped_message(self.phase(rank), self.why)
            return RankReport(rank=rank, status="timed_out", message=message)
        code = self.processes[rank].returncode
        where = f"in {self.phase(rank)}"
        tail = _last_line(self.workdir / f"stderr-{rank}.txt")
        detail = f" ({tail})" if tail else ""
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            if name == "SIGKILL" and oom_killed:
                return RankReport(
                    rank=rank, status="oom", message=f"killed by the OOM killer {where}"
                )
            return RankReport(
                rank=rank, status="crashed", message=f"killed by {name} {where}{detail}"
            )
        return RankReport(
            rank=rank, status="crashed", message=f"exited with code {code} {where}{detail}"
        )


def _invalid(config: TrainConfig, message: str, platform: Platform | None) -> TrialResult:
    return TrialResult(config=config, status="invalid", message=message, platform=platform)


@dataclass
class _Trial:
    request: TrialRequest
    platform: Platform
    workdir: tempfile.TemporaryDirectory[str]
    ranks: _Ranks
    watchdog: Watchdog
    launch_s: float
    oom_kills_before: int


class LocalExecutor:
    """Runs each trial's ranks as processes of this machine (the ``Executor`` without Ray)."""

    rank_imports: tuple[str, ...] = ()

    def __init__(self, rank_output: TextIO | None = None) -> None:
        self.rank_output = rank_output
        """Where each trial's ranks' own output (prints, warnings, a traceback) is copied as
        it ends; None: it goes with the trial's directory."""
        self._running: dict[int, _Trial] = {}
        self._done: list[tuple[int, TrialResult]] = []
        self._next_ticket = 0

    def submit(self, request: TrialRequest) -> int:
        started = time.perf_counter()
        ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
        config, options = request.config, request.options
        device = resolve_device(config.device)
        platform = detect_platform(device)
        try:
            config = config.resolved(device)
        except ConfigError as error:
            self._done.append((ticket, _invalid(config, str(error), platform)))
            return ticket
        if device == "cuda" and config.world_size > platform.device_count:
            message = (
                f"world_size={config.world_size} needs {config.world_size} GPUs, "
                f"this machine has {platform.device_count}"
            )
            self._done.append((ticket, _invalid(config, message, platform)))
            return ticket
        request = request.model_copy(update={"config": config})
        oom_kills_before = _cgroup_oom_kills()
        workdir = tempfile.TemporaryDirectory(prefix="autotune-trial-")
        ranks = _Ranks(request, Path(workdir.name))
        watchdog = Watchdog(options.timeout_s, options.failure_grace_s, started=started)
        launch_s = time.perf_counter() - started
        self._running[ticket] = _Trial(
            request, platform, workdir, ranks, watchdog, launch_s, oom_kills_before
        )
        return ticket

    def fits_now(self, request: TrialRequest) -> bool:
        # One machine: concurrent trials would disturb each other's timings.
        return not self._running

    def _finish(self, ticket: int, why: str | None) -> TrialResult:
        trial = self._running.pop(ticket)
        try:
            trial.ranks.kill_all(why or "")
            oom_killed = _cgroup_oom_kills() > trial.oom_kills_before
            reports = [
                trial.ranks.outcome(r, oom_killed) for r in range(len(trial.ranks.processes))
            ]
            if self.rank_output is not None:
                trial.ranks.copy_output(self.rank_output)
        finally:
            trial.workdir.cleanup()
        return assemble_result(
            trial.request,
            trial.platform,
            reports,
            launch_s=trial.launch_s,
            total_s=time.perf_counter() - trial.watchdog.started,
        )

    def wait(self, timeout_s: float | None = None) -> list[tuple[int, TrialResult]]:
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        while True:
            done, self._done = self._done, []
            now = time.perf_counter()
            for ticket, trial in list(self._running.items()):
                if not trial.ranks.running():
                    done.append((ticket, self._finish(ticket, None)))
                    continue
                if trial.ranks.failed():
                    trial.watchdog.rank_failed(now)
                why = trial.watchdog.expired(now)
                if why is None and trial.request.options.prune_below_samples_per_s:
                    trial.ranks.cut = trial.ranks.overran(trial.request)
                if why is not None or trial.ranks.cut is not None:
                    done.append((ticket, self._finish(ticket, why)))
            if done or not self._running or (deadline is not None and now > deadline):
                return done
            time.sleep(POLL_S)

    def shutdown(self) -> None:
        for ticket in list(self._running):
            self._finish(ticket, "the executor shut down")


def run_trial(
    config: TrainConfig,
    workload: WorkloadSpec,
    options: TrialOptions | None = None,
    rank_output: TextIO | None = None,
) -> TrialResult:
    """Measure ``config`` on ``workload`` with real rank processes; never raises for a bad trial.
    ``rank_output``: where the ranks' own output is copied as the trial ends."""
    request = TrialRequest(config=config, workload=workload, options=options or TrialOptions())
    executor = LocalExecutor(rank_output)
    try:
        return run_to_end(executor, request)
    finally:
        executor.shutdown()
