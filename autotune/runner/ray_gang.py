"""A gang: one placement group with one bundle per rank (the rank's GPU, and CPUs for the rank
and its DataLoader workers) and one actor per bundle. The actors form the process group once and
then run trial after trial through the same ``run_rank`` as the local launcher.

Import cost: this module imports Ray.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from autotune.config import GRAPH_CAPTURING_MODES
from autotune.runner.launch import free_port
from autotune.runner.rank import Progress, apply_memory_limit, run_rank
from autotune.runner.request import TrialRequest
from autotune.runner.workload import WorkloadCache


def quiet_raylet_errors() -> None:
    """Route Ray's driver-side error prints (e.g. "a worker died") to logging, not stdout.

    A dead rank is an outcome this module reports itself; Ray would print it to standard
    output, where it corrupts ``--json`` and tables. Ray's error listener looks the printing
    function up at call time, so replacing it here covers messages from then on.
    """
    from ray._private import worker

    original = getattr(worker, "print_to_stdstream", None)
    if original is None or getattr(original, "_autotune", False):
        return
    log = logging.getLogger("autotune.ray")

    def to_log(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            for line in data.get("lines", []):
                log.debug("raylet: %s", line)
            return
        original(data, ignore_prefix)

    to_log._autotune = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_log


class _RankActor:
    """One rank: keeps its process group, workload cache and phase between trials."""

    def __init__(self) -> None:
        os.environ["LOCAL_RANK"] = "0"  # Ray exposes exactly this rank's GPU(s)
        self.progress = Progress(None)
        self.workloads = WorkloadCache()

    def address(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), free_port()

    def join(self, master_addr: str, master_port: int, world_size: int, rank: int) -> int:
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            WORLD_SIZE=str(world_size),
            RANK=str(rank),
        )
        return os.getpid()

    def run(
        self, request_json: str, rank: int, submitted_at: float, capture: bool = False
    ) -> tuple[str, str | None]:
        """The rank's report (JSON) and, with ``capture``, its output during the trial."""
        os.environ["AUTOTUNE_SPAWNED_AT"] = repr(submitted_at)
        request = TrialRequest.model_validate_json(request_json)
        if request.config.device == "cpu":
            apply_memory_limit(request.options.memory_limit_bytes)
        output: list[str] = []
        try:
            with _captured(output) if capture else contextlib.nullcontext():
                report = run_rank(request, rank, self.progress, self.workloads)
        finally:
            apply_memory_limit(None)
            gc.collect()
        node = ray.get_runtime_context().get_node_id()
        text = output[0] if output else None
        return report.model_copy(update={"node": node}).model_dump_json(), text

    @ray.method(concurrency_group="phase")
    def where(self) -> tuple[str, float]:
        """The current phase and the seconds spent in it so far."""
        return self.progress.where()


@contextlib.contextmanager
def _captured(into: list[str]) -> Iterator[None]:
    """What the process writes to its stdout and stderr while the block runs (C++'s and
    DataLoader workers' too: the file descriptors are redirected), appended to ``into``. A Ray
    actor's output otherwise goes to a log file of Ray's session, which a search does not show."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    with tempfile.TemporaryFile() as file:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, kept in zip((1, 2), saved, strict=True):
                os.dup2(kept, fd)
                os.close(kept)
            file.seek(0)
            into.append(file.read().decode(errors="replace"))


_remote_actor: Any = None


def _actor_class() -> Any:
    global _remote_actor
    if _remote_actor is None:
        # where() answers from a thread of its own while run() runs. Every trial runs on the
        # one thread of the default group: trials that alternated between two threads measured
        # ~10% apart by thread alone (gpt_tiny on a 2-core CPU: one thread slower in 5 of 6
        # pairs), noise the race then had to average away.
        options: Any = {
            "max_restarts": 0,
            "max_task_retries": 0,
            "concurrency_groups": {"phase": 1},
        }
        _remote_actor = ray.remote(**options)(_RankActor)
    return _remote_actor


def reusable(request: TrialRequest) -> bool:
    """Whether a gang may run another trial after this one finished ok.

    Not after CUDA graphs (compile=reduce-overhead or max-autotune on CUDA): their trees and
    private memory pools live in the state of the thread that ran the trial. Seen on an H100
    while an actor ran its trials on either of two threads: a GPT-2 trial's pools (38 GiB)
    stayed, and the next trial, which had fitted, ran out of memory. Trials now share one
    thread, so the next trial's reset may reach them, but that has not run on a GPU: until it
    has, such a gang is not reused.
    """
    config = request.config
    return not (config.device == "cuda" and config.compile in GRAPH_CAPTURING_MODES)


def leaves_behind(request: TrialRequest, device: Literal["cpu", "cuda"]) -> tuple[str, ...]:
    """What the trial leaves resident in its ranks that every later trial's measured peak in the
    gang would include; a gang serves only trials that leave the same. On CPU:

    - ``compiler``: a rank that ran ``torch.compile`` keeps Inductor's modules and caches
      (``gpt_tiny``, DDP over 2 ranks: 845 MiB on a fresh gang, 1,061 after a compiled trial in
      it; ``scripts/bench_memory_prediction.py --repeat``);
    - ``autocast kernels``: under autocast oneDNN compiles a kernel per shape and caches it, and
      no API empties the caches (``examples/moe.py``, DDP over 2 ranks in fp32: 1,836 MiB on a
      fresh gang, 2,914-2,925 after bf16 trials in it; ``scripts/bench_cpu_growth.py``).

    On CUDA the device's memory is what is measured: nothing."""
    if device != "cpu":
        return ()
    config = request.config
    autocast = config.amp != "off" or config.fsdp_mixed_precision != "off"
    return (("compiler",) if config.compile != "off" else ()) + (
        ("autocast kernels",) if autocast else ()
    )


GangShape = tuple[int, float, float]  # (rank processes, CPUs per rank, GPUs per rank)


def gang_shape(
    request: TrialRequest, device: Literal["cpu", "cuda"], cpus_per_rank: float
) -> GangShape:
    """Ranks, CPUs and GPUs per rank. CPUs cover the most DataLoader workers the search may
    ask for, so that one gang serves trials with any worker count."""
    config = request.config
    gpus = float(config.world_size if config.parallel == "dp" else 1) if device == "cuda" else 0.0
    return config.processes, max(cpus_per_rank, float(1 + config.num_workers)), gpus


@dataclass
class Gang:
    shape: GangShape
    group: PlacementGroup
    actors: list[Any]
    nodes: dict[int, str] = field(default_factory=dict)
    """The Ray node each rank's bundle was placed on, by rank."""
    left: tuple[str, ...] = ()
    """What its ranks' trials left resident (``leaves_behind``): it serves only trials that
    leave the same."""
    restart_s: float = 0.0
    """What a fresh gang like this one costs before its first step: its start (placement,
    processes, process group) and its first trial's start-up and build (imports, the
    workload), as measured on this gang; its start alone until its first trial is done."""
    trials: int = 0

    def kill(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.group)


def start_gang(shape: GangShape, group: PlacementGroup) -> Gang:
    """One actor per bundle of the ready ``group``, joined into one process group's ranks."""
    processes, cpus, gpus = shape
    actor_class = _actor_class()
    actors = [
        actor_class.options(
            num_cpus=cpus,
            num_gpus=gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=i
            ),
        ).remote()
        for i in range(processes)
    ]
    master_addr, master_port = ray.get(actors[0].address.remote())
    ray.get([a.join.remote(master_addr, master_port, processes, i) for i, a in enumerate(actors)])
    placed = ray.util.placement_group_table(group).get("bundles_to_node_id", {})
    return Gang(shape, group, actors, nodes={int(i): str(n) for i, n in placed.items()})


NODE_DEATH_S = 30.0
"""How long Ray may take to declare a node dead after its actors stopped answering (its
health checks: a few seconds apart, several missed)."""


def lost_node(gang: Gang, rank: int, error: Exception) -> str | None:
    """The node ``rank`` ran on, if Ray no longer has it alive (None: it is, or unknown).

    A node that vanished first shows as its actors being unavailable; Ray declares the node
    dead only after its health checks fail, so for that error this waits to be sure."""
    node = gang.nodes.get(rank)
    if not node:
        return None
    patience = NODE_DEATH_S if isinstance(error, ray.exceptions.ActorUnavailableError) else 0.0
    deadline = time.perf_counter() + patience
    while True:
        if not any(n["NodeID"] == node and n.get("Alive") for n in ray.nodes()):
            return node
        if time.perf_counter() >= deadline:
            return None
        time.sleep(0.5)
