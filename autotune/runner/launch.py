"""Run one trial on this machine: one process per rank, no Ray needed.

Each rank runs ``python -m autotune.runner.rank`` in a session of its own, so that the rank and
its DataLoader workers can be ended together. The launcher watches them: when one fails the
others get ``failure_grace_s`` to report (their own errors are usually echoes of the failure),
then everything left is killed; at ``timeout_s`` the trial ends as timed out. Whatever happens,
no process of the trial outlives ``run_trial``.
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
from pathlib import Path

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.result import Platform, RankReport, TrialResult
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


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


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

    def kill_all(self) -> None:
        for rank, process in enumerate(self.processes):
            if process.poll() is None:
                self.killed_by_us.add(rank)
            _kill_group(process)
        for process in self.processes:
            process.wait()

    def phase(self, rank: int) -> str:
        path = self.workdir / f"phase-{rank}.txt"
        return path.read_text() if path.exists() else "starting"

    def outcome(self, rank: int, oom_killed: bool) -> RankReport:
        """This rank's own report, or one made from how its process ended."""
        report = self.report(rank)
        if report is not None:
            return report
        code = self.processes[rank].returncode
        where = f"in {self.phase(rank)}"
        tail = _last_line(self.workdir / f"stderr-{rank}.txt")
        detail = f" ({tail})" if tail else ""
        if rank in self.killed_by_us:
            return RankReport(rank=rank, status="timed_out", message=f"still running {where}")
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


def run_trial(
    config: TrainConfig, workload: WorkloadSpec, options: TrialOptions | None = None
) -> TrialResult:
    """Measure ``config`` on ``workload`` with real rank processes; never raises for a bad trial."""
    options = options or TrialOptions()
    started = time.perf_counter()
    device = resolve_device(config.device)
    platform = detect_platform(device)
    try:
        config = config.resolved(device)
    except ConfigError as error:
        return _invalid(config, str(error), platform)
    if device == "cuda" and config.world_size > platform.device_count:
        return _invalid(
            config,
            f"world_size={config.world_size} needs {config.world_size} GPUs, "
            f"this machine has {platform.device_count}",
            platform,
        )
    request = TrialRequest(config=config, workload=workload, options=options)
    oom_kills_before = _cgroup_oom_kills()
    with tempfile.TemporaryDirectory(prefix="autotune-trial-") as tmp:
        ranks = _Ranks(request, Path(tmp))
        launch_s = time.perf_counter() - started
        deadline = started + options.timeout_s
        failed_at: float | None = None
        try:
            while ranks.running():
                now = time.perf_counter()
                if now > deadline:
                    break
                if failed_at is None and ranks.failed():
                    failed_at = now
                if failed_at is not None and now - failed_at > options.failure_grace_s:
                    break
                time.sleep(POLL_S)
        finally:
            ranks.kill_all()
        oom_killed = _cgroup_oom_kills() > oom_kills_before
        reports = [ranks.outcome(r, oom_killed) for r in range(len(ranks.processes))]
    total_s = time.perf_counter() - started
    return assemble_result(request, platform, reports, launch_s=launch_s, total_s=total_s)
