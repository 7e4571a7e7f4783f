"""A model with parameters a step does not use: DDP fails without find_unused_parameters and
runs with it; the search learns it from the failure and says so."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.api import run_trial
from autotune.config import TrainConfig
from autotune.result import TrialResult
from autotune.search.lessons import UNUSED_PARAMETERS_ERROR
from autotune.search.log import StudyLog
from autotune.search.proposer import Proposer
from tests.search.fakes import FakeExecutor, failed, make_tuner, ok

DDP = {"global_batch_size": 16, "parallel": "ddp", "world_size": 2, "device": "cpu"}
FAST = {"warmup_steps": 2, "measured_steps": 3, "target_interval": 0}


@pytest.mark.slow
def test_a_ddp_trial_of_a_model_with_an_unused_head_needs_find_unused_parameters() -> None:
    without = run_trial("tests.fixtures.models:AuxHead", DDP, **FAST)
    assert without.status == "error" and UNUSED_PARAMETERS_ERROR in without.message
    assert without.message.startswith("the model leaves some parameters without a gradient")
    assert "--find-unused-parameters" in without.message.split(";")[0]
    found = run_trial(
        "tests.fixtures.models:AuxHead", {**DDP, "find_unused_parameters": True}, **FAST
    )
    assert found.status == "ok", found.message
    assert found.samples_per_s and found.samples_per_s > 0


def test_find_unused_parameters_is_a_ddp_knob() -> None:
    with pytest.raises(ValueError, match="find_unused_parameters=true needs parallel=ddp"):
        TrainConfig(global_batch_size=16, find_unused_parameters=True)
    config = TrainConfig.model_validate({**DDP, "find_unused_parameters": True})
    assert "find-unused" in config.summary()


def test_the_search_learns_it_from_the_first_ddp_failure_and_keeps_it() -> None:
    def outcome(config: TrainConfig, before: int) -> TrialResult:
        if config.parallel == "ddp" and not config.find_unused_parameters:
            return failed(config, "error", f"rank 0: RuntimeError: {UNUSED_PARAMETERS_ERROR} ...")
        return ok(config, 100.0 + 10 * config.num_workers, 100)

    space = {
        "parallel": ["single", "ddp"],
        "world_size": {"choices": [2], "when": {"parallel": ["ddp"]}},
        "num_workers": [0, 1],
    }
    executor = FakeExecutor(outcome)
    tuner = make_tuner(executor, space, trials=4)
    baseline = tuner.baseline()
    assert baseline.status == "ok" and baseline.config is not None
    assert baseline.config.find_unused_parameters  # run again with it, after one failure
    tuner.search()
    ddp_runs = [r.config for r in executor.runs if r.config.parallel == "ddp"]
    assert [c.find_unused_parameters for c in ddp_runs] == [False] + [True] * (len(ddp_runs) - 1)
    assert executor.ran(parallel="single") >= 1  # other modes are untouched


def test_a_resumed_search_remembers_it(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        if not config.find_unused_parameters:
            return failed(config, "error", f"rank 0: RuntimeError: {UNUSED_PARAMETERS_ERROR}")
        return ok(config, 100.0, 100)

    space = {"parallel": ["ddp"], "world_size": [2], "num_workers": [0, 1]}
    first = make_tuner(FakeExecutor(outcome), space, storage=storage)
    first.baseline()
    study = optuna.load_study(study_name=first.proposer.study.study_name, storage=storage)
    log = StudyLog(study, first.limit_bytes)  # read back from storage, as a resumed search does
    resumed = Proposer(study, log, first.proposer.space, first.proposer.fixed)
    assert resumed.find_unused_parameters
    assert resumed.propose().config.find_unused_parameters  # type: ignore[union-attr]
