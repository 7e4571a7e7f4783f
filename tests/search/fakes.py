"""A scripted executor and a ready Tuner for unit tests of the search's phases (no processes)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import optuna

from autotune.config import TrainConfig
from autotune.result import Platform, RankReport, TrialResult
from autotune.runner.executor import PlacementError
from autotune.runner.request import TrialRequest
from autotune.runner.workload import WorkloadSpec
from autotune.search.progress import Reporter
from autotune.search.settings import make_settings
from autotune.search.space import parse_space
from autotune.search.study import make_sampler
from autotune.search.tuner import Tuner

MiB = 2**20
PLATFORM = Platform(
    device_type="cpu",
    device_name="test CPU",
    device_count=1,
    device_memory_bytes=64 << 30,
    torch_version="2.13.0",
    python_version="3.11",
    backend="gloo",
    cpu_count=2,
    hostname="test",
)
Outcome = Callable[[TrainConfig, int], TrialResult]
"""(config, how many times it ran before) -> its result."""


def ok(config: TrainConfig, samples_per_s: float, memory_mib: float) -> TrialResult:
    """A trial that finished: one rank report carries the judged memory."""
    report = RankReport(rank=0, status="ok", peak_memory_bytes=int(memory_mib * MiB))
    return TrialResult(
        config=config, status="ok", samples_per_s=samples_per_s, measured_steps=8, ranks=[report]
    )


def failed(config: TrainConfig, status: Any, message: str = "rank 1: killed") -> TrialResult:
    return TrialResult(config=config, status=status, message=message)


class FakeExecutor:
    """The ``Executor`` contract with scripted outcomes; counts what it ran."""

    rank_imports: tuple[str, ...] = ()

    def __init__(self, outcome: Outcome, refuse: bool = False) -> None:
        self.outcome, self.refuse = outcome, refuse
        self.runs: list[TrialRequest] = []
        self._done: list[tuple[int, TrialResult]] = []

    def submit(self, request: TrialRequest) -> int:
        if self.refuse:
            raise PlacementError("the Ray cluster cannot place 2 ranks of {'CPU': 1.0}")
        before = sum(r.config == request.config for r in self.runs)
        self.runs.append(request)
        self._done.append((len(self.runs), self.outcome(request.config, before)))
        return len(self.runs)

    def wait(self, timeout_s: float | None = None) -> list[tuple[int, TrialResult]]:
        done, self._done = self._done, []
        return done

    def fits_now(self, request: TrialRequest) -> bool:
        return True

    def shutdown(self) -> None:
        pass

    def ran(self, **values: Any) -> int:
        """How many runs had a config with these field values."""
        return sum(all(getattr(r.config, k) == v for k, v in values.items()) for r in self.runs)


class Said(Reporter):
    """Keeps the phase lines a search says."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def phase(self, text: str) -> None:
        self.lines.append(text)


def make_tuner(
    executor: FakeExecutor,
    space: dict[str, Any],
    *,
    limit_mib: float = 1000,
    storage: str | None = None,
    study: Any = None,
    workload: WorkloadSpec | None = None,
    **settings: Any,
) -> Tuner:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    values = {
        "global_batch_size": 16,
        "memory_budget": int(limit_mib * MiB),
        "safety_margin": 0.0,
        "trials": 6,
        "top_k": 2,
        "race_rounds": 3,
        "predict_memory": False,  # scripted peaks: the model's own would disagree with them
        **settings,
    }
    return Tuner(
        study=study
        or optuna.create_study(storage=storage, direction="maximize", sampler=make_sampler(0)),
        executor=executor,
        workload=workload or WorkloadSpec(model="tests.fixtures.models:Small"),
        settings=make_settings(values),
        space=parse_space(space, "test"),
        platform=PLATFORM,
        devices=2,
        reporter=Reporter(),
    )
