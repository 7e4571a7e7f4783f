"""A search without Ray: ``executor='local'`` runs every trial as rank processes of this
machine (what a machine without Ray, or a lent GPU machine, uses)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

import autotune
from autotune.errors import ConfigError
from autotune.search.progress import Reporter
from autotune.search.settings import make_settings

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("probe_cache")]


def test_a_search_runs_its_trials_without_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.runner import ray_executor

    def no_ray(*args: object, **kwargs: object) -> None:
        raise AssertionError("executor='local' started Ray")

    monkeypatch.setattr(ray_executor.RayExecutor, "__init__", no_ray)
    monkeypatch.setitem(sys.modules, "ray", None)  # as on a machine without it: import fails
    space = tmp_path / "space.yaml"
    space.write_text("parallel: [single]\nnum_workers: [0, 1]\n")
    heard: dict[str, str] = {}

    class Header(Reporter):
        def start(self, **info: object) -> None:
            heard.update({k: str(v) for k, v in info.items()})

    shown = io.StringIO()  # --debug's copy of the ranks' output (the model prints)
    recommendation = autotune.tune(
        "tests.fixtures.models:Chatty",
        global_batch_size=32,
        space=str(space),
        trials=2,
        executor="local",
        devices=1,
        memory_budget="16GiB",
        storage=str(tmp_path / "s.db"),
        warmup_steps=1,
        measured_steps=3,
        target_interval=0,
        race_rounds=2,
        top_k=1,
        verify_factor=2,
        reporter=Header(),
        rank_output=shown,
    )
    assert recommendation.verification is not None and recommendation.memory_confirmed
    ran = {t.config.num_workers for t in recommendation.trials if t.status == "ok" and t.config}
    assert ran == {0, 1}  # with and without a DataLoader worker (2 gloo ranks: test_launch)
    assert heard["executor"].startswith("rank processes of this machine")
    assert heard["data"] == "tests.fixtures.models:autotune_dataset"  # where the samples come from
    assert recommendation.parameter_dtype == "float32"  # the arithmetic its numerics line names
    copied = shown.getvalue()
    assert copied.count("--- rank 0's output (below) ---") >= 3  # 2 trials, the race, ...
    assert "building Chatty" in copied and "forward of (32, 8)" in copied


def test_the_local_executor_cannot_take_a_ray_address() -> None:
    with pytest.raises(ConfigError, match="executor='local' runs on this machine"):
        make_settings({"trials": 2, "executor": "local", "ray_address": "10.0.0.1:6379"})
