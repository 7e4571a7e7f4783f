"""One contract, every executor: the same trial ends with the same status, whoever runs it, and
no process outlives it.

In the spirit of Optuna's storage and sampler test suites: each case below runs against the
local launcher and the Ray executor (real gloo ranks), and, where a recorded landscape can
answer it, the replay executor of the benchmarks.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest

from autotune.bench.landscape import Landscape, Point, Run
from autotune.bench.replay import ReplayExecutor
from autotune.config import TrainConfig, make_config
from autotune.runner.executor import CUT_FLOOR_S, Executor, run_to_end
from autotune.runner.launch import LocalExecutor
from autotune.runner.platform import detect_platform
from autotune.runner.request import TrialOptions, TrialRequest
from autotune.runner.workload import WorkloadSpec
from autotune.search.space import parse_space
from tests.helpers import FEW

QUICK = TrialOptions(**FEW, timeout_s=120)
DDP = {"parallel": "ddp", "world_size": 2}


@dataclass(frozen=True)
class Case:
    model: str
    values: dict[str, Any]
    status: str
    says: tuple[str, ...]  # what the message must name
    options: TrialOptions = QUICK
    recorded: dict[str, Any] | None = field(default=None)  # how a landscape recorded it
    cut: bool = False  # ended mid-step from outside: no memory read, its processes ended


CASES = {
    "ok": Case("tests.fixtures.models:Small", DDP, "ok", (), recorded={"status": "ok"}),
    "pruned below the incumbent": Case(
        "tests.fixtures.models:Small",
        DDP,
        "pruned",
        ("the pruning line",),
        options=TrialOptions(warmup_steps=1, timeout_s=120, prune_below_samples_per_s=1e9),
        recorded={"status": "ok"},
    ),
    "a step past the pruning limit": Case(
        "tests.fixtures.models:Hanging",
        DDP,
        "pruned",
        ("warm-up step 1 still running after", "the pruning line", "at most"),
        options=TrialOptions(warmup_steps=1, timeout_s=120, prune_below_samples_per_s=1e9),
        cut=True,
    ),
    "rank abort": Case(
        "tests.fixtures.models:Aborting",
        DDP,
        "crashed",
        ("rank 1",),
        recorded={"status": "crashed", "message": "rank 1: killed by SIGABRT"},
    ),
    "rank hang": Case(
        "tests.fixtures.models:Hanging",
        DDP,
        "timed_out",
        ("timeout_s=10", "still running in warm-up step 1"),
        # the whole timeout is spent: short, yet past a gang's start on a loaded box (2-4 s)
        options=TrialOptions(**FEW, timeout_s=10),
    ),
    "out of memory under a limit": Case(
        "tests.fixtures.models:MemoryHog",
        DDP,
        "oom",
        ("rank 1:",),
        options=QUICK.model_copy(update={"memory_limit_bytes": 3 << 30}),
    ),
    "exception in user code": Case(
        "tests.fixtures.models:Raising",
        {},
        "error",
        # where in the user's code: the rank's traceback is not shown
        (
            "rank 0: warm-up step 1: ValueError: shape mismatch in layer 3 "
            "(at tests/fixtures/models.py:114, in forward)",
        ),
    ),
    "invalid config": Case(
        "workloads.gpt:gpt_tiny",
        {"checkpoint_segments": 5},
        "invalid",
        ("checkpoint_segments=5 exceeds the 4 repeated Block blocks of GPT",),
        recorded={
            "status": "invalid",
            "message": "rank 0: building the workload: checkpoint_segments=5 exceeds the 4 "
            "repeated Block blocks of GPT",
        },
    ),
}


def _config(case: Case) -> TrainConfig:
    return make_config({"global_batch_size": 16, "device": "cpu", **case.values})


def _replay(case: Case) -> ReplayExecutor:
    points = []
    if case.recorded is not None:
        if case.recorded["status"] == "ok":
            run = Run(status="ok", samples_per_s=100.0, memory_used_bytes=300 << 20)
        else:
            run = Run(status=case.recorded["status"], message=case.recorded["message"])
        points.append(Point(config=_config(case), runs=[run]))
    landscape = Landscape(
        workload=case.model,
        platform=detect_platform("cpu"),
        devices=2,
        space=parse_space({"parallel": ["single", "ddp"]}, "test"),
        global_batch_size=16,
        warmup_steps=1,
        measured_steps=2,
        memory_limit_bytes=1 << 30,
        points=points,
    )
    return ReplayExecutor(landscape, random.Random(0))


def _rank_actors() -> set[int]:
    """This test session's rank actors: the Ray instance it started runs under it, so a search
    running beside the suite on the same machine is not counted."""
    found = set()
    for process in psutil.Process().children(recursive=True):
        try:
            if "_RankActor" in " ".join(process.cmdline()):
                found.add(process.pid)
        except psutil.Error:  # gone meanwhile
            continue
    return found


def _assert_no_rank_actor_left(timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _rank_actors() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _rank_actors(), f"rank actors left behind: {sorted(_rank_actors())}"


@pytest.fixture
def make_executor(
    kind: str, no_leftover_processes: None, request: pytest.FixtureRequest
) -> Iterator[Any]:
    made: list[Executor] = []
    if kind == "ray":  # each test names its executors by parametrizing ``kind``
        request.getfixturevalue("ray_cluster")

    def make(case: Case) -> Executor:
        if kind == "local":
            executor: Executor = LocalExecutor()
        elif kind == "ray":
            from autotune.runner.ray_executor import RayExecutor

            executor = RayExecutor(detect_platform("cpu"), cpus_per_rank=1.0)
        else:
            assert case.recorded is not None, "no landscape records this outcome"
            executor = _replay(case)
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.shutdown()
    if kind == "ray":
        _assert_no_rank_actor_left()


RAY_BY_DEFAULT = ("ok", "rank abort")
"""The Ray cases of the default run (a trial that ends well, a gang killed when a rank aborts);
the rest are ``slow``."""


def _pairs() -> list[Any]:
    """Every case with every executor, but the replay of an outcome no landscape records (not
    generated, rather than skipped: only GPU tests skip on a CPU machine)."""
    pairs = []
    for name, case in CASES.items():
        pairs.append(pytest.param(name, "local", id=f"{name}-local"))
        marks = () if name in RAY_BY_DEFAULT else (pytest.mark.slow,)
        pairs.append(pytest.param(name, "ray", id=f"{name}-ray", marks=marks))
        if case.recorded is not None:
            pairs.append(pytest.param(name, "replay", id=f"{name}-replay"))
    return pairs


@pytest.mark.parametrize(("name", "kind"), _pairs())
def test_every_executor_classifies_the_outcome_the_same_way(
    name: str, kind: str, make_executor: Any
) -> None:
    case = CASES[name]
    executor = make_executor(case)
    workload = WorkloadSpec(model=case.model)
    request = TrialRequest(config=_config(case), workload=workload, options=case.options)
    result = run_to_end(executor, request)  # raises if wait returns another ticket
    assert result.status == case.status, result.message
    for text in case.says:
        assert text in result.message, result.message
    assert result.total_s < case.options.timeout_s + 15  # ended by the watchdog, not later
    if case.status in ("ok", "pruned"):  # a pruned trial keeps its partial measurement
        assert result.samples_per_s and result.samples_per_s > 0
        if not case.cut:
            assert result.peak_memory_bytes and result.peak_memory_bytes > 0
    if kind == "ray" and (case.status not in ("ok", "pruned") or case.cut):
        _assert_no_rank_actor_left()  # a failed gang is killed at once, not at shutdown


@pytest.mark.parametrize(
    "kind", ["local", pytest.param("ray", marks=pytest.mark.slow)]
)  # no landscape records a cut
def test_a_step_cut_mid_way_ends_within_its_bound_and_the_next_trial_runs(
    kind: str, make_executor: Any
) -> None:
    case = CASES["a step past the pruning limit"]
    executor = make_executor(case)
    hung = TrialRequest(
        config=_config(case), workload=WorkloadSpec(model=case.model), options=case.options
    )
    started = time.perf_counter()
    result = run_to_end(executor, hung)
    # cut once the step has run as long as fresh ranks take (a few seconds), not at timeout_s
    assert result.status == "pruned" and time.perf_counter() - started < 30, result.message
    assert result.samples_per_s <= 16 / CUT_FLOOR_S  # a bound from a step of at least 1 s
    ok = TrialRequest(
        config=_config(case),
        workload=WorkloadSpec(model="tests.fixtures.models:Small"),
        options=QUICK,
    )
    assert run_to_end(executor, ok).status == "ok"


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster", "no_leftover_processes")
def test_a_pruned_trial_stops_early_and_its_gang_runs_the_next_trial() -> None:
    from autotune.runner.ray_executor import RayExecutor

    executor = RayExecutor(detect_platform("cpu"), cpus_per_rank=1.0)
    config = _config(CASES["ok"])
    workload = WorkloadSpec(model="tests.fixtures.models:Small")
    try:
        slow = TrialOptions(warmup_steps=1, timeout_s=120, prune_below_samples_per_s=1e9)
        pruned = run_to_end(executor, TrialRequest(config=config, workload=workload, options=slow))
        # its first (warm-up) step is already hopeless: 1 step, not the 5-step floor
        assert pruned.status == "pruned" and pruned.measured_steps == 1
        gang = _rank_actors()
        assert len(gang) == 2
        ok = run_to_end(executor, TrialRequest(config=config, workload=workload, options=QUICK))
        assert ok.status == "ok" and _rank_actors() == gang  # the same processes, reused
    finally:
        executor.shutdown()
    _assert_no_rank_actor_left()


@pytest.mark.parametrize("kind", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_every_executor_sees_the_dataloader_workers_it_measures(
    kind: str, make_executor: Any
) -> None:
    # A trial's peak adds its DataLoader workers' private memory to its rank's; the Ray
    # executor's ranks run on a thread of their own, whose forked workers went unseen.
    case = Case("tests.fixtures.models:Small", {"num_workers": 1}, "ok", ())
    request = TrialRequest(
        config=_config(case), workload=WorkloadSpec(model=case.model), options=QUICK
    )
    result = run_to_end(make_executor(case), request)
    assert result.status == "ok", result.message
    diagnostics = result.ranks[0].diagnostics
    assert diagnostics is not None and diagnostics.dataloader_worker_pids
    assert all(len(pids) == 1 for pids in diagnostics.dataloader_worker_pids)
