"""Run trials on Ray: the ``Executor`` over gangs of rank actors (``ray_gang``), reused while
healthy.

Gangs of the shape a trial needs are reused (on CPU, one whose trials compiled or ran autocast
only by trials that do the same: ``ray_gang.leaves_behind``); idle gangs that do not serve it
make room when the cluster is full. After any failure (crash, OOM, hang, error) the gang's
actors are killed and its placement group removed, so the next trial gets fresh processes.
Ray never retries anything by itself here.

Shipping code: with ``ship`` (a directory, on by default for ``--ray-address``), the executor
starts its Ray job with that directory as the runtime environment's ``working_dir``. Ray zips it
(honouring ``.gitignore`` and ``SHIP_EXCLUDES``), uploads it once, and every rank actor on every
node runs inside an unpacked copy, with it first on ``sys.path``; the ranks then import the
user's modules from that copy, never from a path that exists only on the driver. Ray caps the
package at 512 MiB (its gRPC message limit).

Import cost: this module imports Ray; ``autotune`` imports it only when a search starts.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from autotune.errors import AutotuneError
from autotune.result import Platform, RankReport, TrialResult
from autotune.runner.executor import (
    CUT_FLOOR_S,
    PlacementError,
    Watchdog,
    cut_reason,
    cut_report,
    stopped_message,
)
from autotune.runner.launch import write_rank_output
from autotune.runner.outcome import assemble_result
from autotune.runner.ray_gang import (
    Gang,
    GangShape,
    gang_shape,
    leaves_behind,
    lost_node,
    quiet_raylet_errors,
    reusable,
    start_gang,
)
from autotune.runner.request import TrialRequest

SHIP_EXCLUDES = [".git", ".venv", "venv", "__pycache__", "*.pyc", "*.db", "*.pt", "*.ckpt"]
"""Left out of the shipped directory besides what ``.gitignore`` names."""
HEALTH_S = 3.0
"""How often a waiting driver checks that the cluster's head still answers."""
LOST_AFTER = 3
"""Unanswered checks in a row after which the cluster is taken as lost: well inside the minute
after which Ray ends a driver whose head is gone, without a word of ours."""
PLACEMENT_TIMEOUT_S = 30.0
POLL_S = 0.05
LOOK_S = 0.25
"""How often a trial that may be pruned has its ranks' phases read (``executor.cut_reason``)."""


@dataclass
class _Running:
    ticket: int
    request: TrialRequest
    gang: Gang
    futures: dict[Any, int]
    watchdog: Watchdog
    launch_s: float
    reports: dict[int, RankReport] = field(default_factory=dict)
    outputs: dict[int, str | None] = field(default_factory=dict)  # captured, by rank
    next_look: float = 0.0


def _died(rank: int, error: Exception, node: str | None = None) -> RankReport:
    """The report of a rank whose actor died; ``node``: the node it ran on, which died too."""
    text = " ".join(str(error).split())
    lowered = text.lower()
    if isinstance(error, ray.exceptions.OutOfMemoryError) or "memory monitor" in lowered:
        return RankReport(
            rank=rank, status="oom", message=f"killed by Ray's memory monitor: {text[:300]}"
        )
    if node is not None:
        return RankReport(
            rank=rank,
            status="crashed",
            message=f"node lost: the Ray node {node[:12]} running rank {rank} left the cluster "
            f"({text[:200]})",
        )
    return RankReport(rank=rank, status="crashed", message=f"rank actor died: {text[:400]}")


def _ignored_settings(address: str | None, num_cpus: int | None, ship: str | None) -> list[str]:
    """Ray was initialised before the search (by the caller): say what that overrides."""
    notes = []
    if ship is not None:
        notes.append(
            f"Ray is already initialised in this process, so {ship!r} is not shipped to its "
            "nodes; pass runtime_env={'working_dir': ...} to your ray.init if they need it"
        )
    if address is not None:
        notes.append(
            f"Ray is already initialised in this process; the address {address!r} is not used "
            "and trials run on the existing instance"
        )
    cpus = ray.cluster_resources().get("CPU", 0)
    if num_cpus is not None and address is None and cpus < num_cpus:
        notes.append(
            f"Ray is already initialised in this process with {cpus:g} CPUs; the search asked "
            f"for {num_cpus}, so gangs of some shapes may not be kept warm or placed"
        )
    return notes


def _init_failure(error: Exception, address: str | None, ship: str | None) -> str:
    """One line on why Ray could not be started or joined, with what to try."""
    text = " ".join(str(error).split())[:300]
    if ship is not None and any(w in text.lower() for w in ("size", "too large", "exceed")):
        return (
            f"cannot ship {ship!r} to the Ray cluster ({text}); make it smaller (see its "
            ".gitignore) or pass --no-ship-code with the code installed on every node"
        )
    if address is None:
        return f"cannot start a local Ray instance: {text}"
    return (
        f"cannot join the Ray cluster at {address!r} ({text}); is it running there? A cluster "
        "with token authentication also needs RAY_AUTH_MODE=token and its token here"
    )


class ClusterLost(AutotuneError):
    """The Ray cluster's head stopped answering: the search stops, the study keeps every
    trial stored before, and the same command resumes it."""


KILL_WAIT_S = 10.0
"""How long ``shutdown`` waits for Ray to kill the gangs. Where every process of the job was
sent SIGTERM at once (Slurm's ``scancel``, ``kill`` of the process group), the local raylet was
gone and ``remove_placement_group`` waited for it forever: the search hung in its shutdown."""


def _kill_all(gangs: list[Gang]) -> None:
    for gang in gangs:
        gang.kill()


@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """Keep the Python SIGTERM handler the program had (the CLI's ``SigtermWatch``; an
    embedding program's own) over ``ray.init``, which sets its own and whose core worker
    installs a C++ handler that prints a stack trace and aborts: a stopped search then ended in
    SIGABRT (exit 134) with a trace, its ranks left to Ray's exit hooks. Where the handler was
    the default (or not Python's), Ray's stay."""
    held = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if callable(held) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, held)


def _answers(endpoint: tuple[str, int] | None) -> bool:
    """Whether the cluster's head (its GCS) accepts a connection (True: unknown)."""
    import socket

    if endpoint is None:
        return True
    try:
        with socket.create_connection(endpoint, timeout=2.0):
            return True
    except OSError:
        return False


def _head(address: str | None) -> tuple[str, int] | None:
    try:
        host, _, port = str(ray.get_runtime_context().gcs_address).rpartition(":")
        return host, int(port)
    except Exception:  # an older Ray, or a client connection: no check
        return None


class RayExecutor:
    """Submits trials to Ray and collects their results."""

    rank_imports: tuple[str, ...] = ("ray",)

    def __init__(
        self,
        platform: Platform,
        *,
        address: str | None = None,
        cpus_per_rank: float = 1.0,
        num_cpus: int | None = None,
        ship: str | None = None,
        rank_output: TextIO | None = None,
    ) -> None:
        self.platform = platform
        self.rank_output = rank_output
        """Where each trial's ranks' output is copied as it ends (``--debug``); None: not
        captured (it goes to Ray's session logs)."""
        self.cpus_per_rank = cpus_per_rank
        self._owns_ray = False
        self.notes: list[str] = []
        """What this executor could not honour, for the user to read."""
        self.shipped: str | None = None
        """The directory every rank runs in a copy of; None: nothing was shipped."""
        if ray.is_initialized():
            self.notes = _ignored_settings(address, num_cpus, ship)
        else:
            self._owns_ray = True
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "logging_level": "ERROR",
                "configure_logging": False,
            }
            if address is None:
                kwargs.update(num_cpus=num_cpus, object_store_memory=128 << 20)
            if ship is not None:
                kwargs["runtime_env"] = {"working_dir": ship, "excludes": SHIP_EXCLUDES}
            logging.getLogger("ray").setLevel(logging.ERROR)
            try:
                with _sigterm_kept():
                    ray.init(address=address, **kwargs)
            except Exception as error:
                raise AutotuneError(_init_failure(error, address, ship)) from error
            self.shipped = ship
            quiet_raylet_errors()
        self._idle: list[Gang] = []
        self._running: dict[int, _Running] = {}
        self._next_ticket = 0
        self.address = address
        self._head = _head(address)
        self._unanswered, self._next_check, self.lost = 0, 0.0, False

    def _check_head(self, now: float) -> None:
        """Raise ``ClusterLost`` once the head has not answered ``LOST_AFTER`` checks."""
        if now < self._next_check:
            return
        self._next_check = now + HEALTH_S
        self._unanswered = 0 if _answers(self._head) else self._unanswered + 1
        if self._unanswered >= LOST_AFTER:
            self._lose()

    def _lose(self) -> None:
        self.lost = True
        where = f"at {self.address!r}" if self.address else "(the local instance)"
        raise ClusterLost(
            f"lost the Ray cluster {where}: its head stopped answering; every finished trial "
            "is stored in the study: run the same command again once the cluster is back"
        )

    def _gang(self, shape: GangShape, left: tuple[str, ...]) -> Gang:
        """An idle gang of ``shape`` that serves the trial, else a new one (``left``: what the
        trial about to run on it leaves behind, ``leaves_behind``)."""
        for gang in self._idle:
            if gang.shape == shape and gang.left == left:
                self._idle.remove(gang)
                return gang
        processes, cpus, gpus = shape
        started = time.perf_counter()
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        group = placement_group([bundle] * processes, strategy="PACK")
        ready, _ = ray.wait([group.ready()], timeout=1.0)
        while not ready and self._idle:  # make room: idle gangs that do not serve it go
            self._idle.pop(0).kill()
            ready, _ = ray.wait([group.ready()], timeout=1.0)
        if not ready:
            ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            remove_placement_group(group)
            raise PlacementError(
                f"the Ray cluster cannot place {processes} ranks of {bundle} within "
                f"{PLACEMENT_TIMEOUT_S:g} s (available: {ray.available_resources()})"
            )
        gang = start_gang(shape, group)
        gang.restart_s = time.perf_counter() - started
        gang.left = left
        return gang

    def _leaves(self, request: TrialRequest) -> tuple[str, ...]:
        return leaves_behind(request, self.platform.device_type)

    def fits_now(self, request: TrialRequest) -> bool:
        """Whether the trial could start now without waiting for another one to end."""
        shape = gang_shape(request, self.platform.device_type, self.cpus_per_rank)
        if any(g.shape == shape and g.left == self._leaves(request) for g in self._idle):
            return True
        processes, cpus, gpus = shape
        free = ray.available_resources()
        for gang in self._idle:  # idle gangs that do not serve it would be evicted for it
            free["CPU"] = free.get("CPU", 0) + gang.shape[0] * gang.shape[1]
            free["GPU"] = free.get("GPU", 0) + gang.shape[0] * gang.shape[2]
        return free.get("CPU", 0) >= processes * cpus and free.get("GPU", 0) >= processes * gpus

    def submit(self, request: TrialRequest) -> int:
        """Start a trial; its result comes back from ``wait``."""
        ticket = self._next_ticket
        self._next_ticket += 1
        submitted = time.time()
        start = time.perf_counter()
        shape = gang_shape(request, self.platform.device_type, self.cpus_per_rank)
        gang = self._gang(shape, self._leaves(request))
        if self.shipped is not None:  # import from the shipped copy, not the driver's paths
            workload = request.workload.model_copy(update={"search_path": ()})
            request = request.model_copy(update={"workload": workload})
        payload = request.model_dump_json()
        futures = {
            actor.run.remote(payload, rank, submitted, self.rank_output is not None): rank
            for rank, actor in enumerate(gang.actors)
        }
        options = request.options
        watchdog = Watchdog(options.timeout_s, options.failure_grace_s)
        self._running[ticket] = _Running(
            ticket, request, gang, futures, watchdog, time.perf_counter() - start
        )
        return ticket

    def _collect(self, trial: _Running, ready: list[Any]) -> None:
        for ref in ready:
            rank = trial.futures.pop(ref, None)
            if rank is None:
                continue
            try:
                report_json, trial.outputs[rank] = ray.get(ref)
                report = RankReport.model_validate_json(report_json)
            except (ray.exceptions.RayError, ray.exceptions.OutOfMemoryError) as error:
                if not _answers(self._head):  # the whole cluster went: asking Ray would hang
                    self._lose()
                report = _died(rank, error, lost_node(trial.gang, rank, error))
            trial.reports[rank] = report
            if report.status != "ok":
                trial.watchdog.rank_failed(time.perf_counter())

    def _where(self, trial: _Running, timeout_s: float) -> dict[int, tuple[str, float] | None]:
        """Each running rank's phase and seconds in it; None where the actor did not answer
        (it may be wedged)."""
        refs = {rank: trial.gang.actors[rank].where.remote() for rank in trial.futures.values()}
        found: dict[int, tuple[str, float] | None] = {}
        for rank, ref in refs.items():
            try:
                phase, running_s = ray.get(ref, timeout=timeout_s)
                found[rank] = (phase, running_s)
            except Exception:
                found[rank] = None
        return found

    def _stop(self, trial: _Running, why: str) -> None:
        """Give up on the ranks still running: note where each stood, then kill the gang."""
        for rank, where in self._where(trial, timeout_s=2.0).items():
            phase = where[0] if where else "an unknown phase"
            trial.reports[rank] = RankReport(
                rank=rank, status="timed_out", message=stopped_message(phase, why)
            )
        trial.futures.clear()

    def _cut(self, trial: _Running, now: float) -> None:
        """End the trial as pruned if one of its ranks is in a step that has run too long
        (``executor.cut_reason``); looked at every ``LOOK_S``, and only with a pruning line."""
        if trial.request.options.prune_below_samples_per_s is None or now < trial.next_look:
            return
        trial.next_look = now + LOOK_S
        if now - trial.watchdog.started < max(CUT_FLOOR_S, trial.gang.restart_s):
            return  # no step of it can have run that long yet: leave the ranks alone
        for where in self._where(trial, timeout_s=1.0).values():
            if where is None:
                continue
            phase, running_s = where
            why = cut_reason(trial.request, phase, running_s, trial.gang.restart_s)
            if why is not None:
                for rank in trial.futures.values():
                    trial.reports[rank] = cut_report(rank, why, running_s)
                trial.futures.clear()
                return

    def _finish(self, trial: _Running) -> TrialResult:
        del self._running[trial.ticket]
        reports = [trial.reports[r] for r in sorted(trial.reports)]
        gang = trial.gang
        if gang.trials == 0 and reports:  # its start-up ran from submit: the gang's start too
            gang.restart_s = max([gang.restart_s] + [r.startup_s + r.build_s for r in reports])
        gang.trials += 1
        if self.rank_output is not None:
            texts = [trial.outputs.get(rank) for rank in sorted(trial.reports)]
            write_rank_output(self.rank_output, texts)
        if all(r.status == "ok" for r in reports) and reusable(trial.request):
            self._idle.append(gang)
        else:
            gang.kill()  # fresh processes after any failure, or state no reset reaches
        return assemble_result(
            trial.request,
            self.platform,
            reports,
            launch_s=trial.launch_s,
            total_s=time.perf_counter() - trial.watchdog.started + trial.launch_s,
        )

    def wait(self, timeout_s: float | None = None) -> list[tuple[int, TrialResult]]:
        """Block until at least one trial ends (or ``timeout_s``); return the ended ones."""
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        while self._running:
            done = []
            refs = [ref for t in self._running.values() for ref in t.futures]
            ready, _ = ray.wait(refs, num_returns=1, timeout=POLL_S) if refs else ([], [])
            now = time.perf_counter()
            for trial in list(self._running.values()):
                self._collect(trial, [r for r in ready if r in trial.futures])
                why = trial.watchdog.expired(now) if trial.futures else None
                if why is not None:
                    self._stop(trial, why)
                elif trial.futures:
                    self._cut(trial, now)
                if not trial.futures:
                    done.append((trial.ticket, self._finish(trial)))
            if done:
                return done
            self._check_head(now)
            if deadline is not None and now > deadline:
                return []
        return []

    def shutdown(self) -> None:
        """Kill every gang; stop Ray if this executor started it (with a lost cluster, only
        disconnect: there is nothing left to kill, and asking would hang)."""
        if self.lost:
            self._running.clear()
            self._idle.clear()
            ray.shutdown()
            return
        gangs = [trial.gang for trial in self._running.values()] + self._idle
        self._running.clear()
        self._idle.clear()
        killing = threading.Thread(target=_kill_all, args=(gangs,), daemon=True)
        killing.start()
        killing.join(KILL_WAIT_S)  # then Ray is stopped all the same: its shutdown kills them
        if self._owns_ray:
            ray.shutdown()
