"""Where the search's global batch comes from when the user gives none."""

from __future__ import annotations

import pytest

from autotune.errors import WorkloadError
from autotune.runner.workload import WorkloadSpec
from autotune.search.driver import _oversubscribed, resolve_global_batch
from autotune.search.settings import make_settings


def test_a_given_global_batch_wins() -> None:
    settings = make_settings({"global_batch_size": 64})
    spec = WorkloadSpec(model="tests.fixtures.declared_batch:Model")
    assert resolve_global_batch(spec, settings) == (settings, "given")


def test_the_model_module_declares_it() -> None:
    spec = WorkloadSpec(model="tests.fixtures.declared_batch:Model")
    settings, source = resolve_global_batch(spec, make_settings({}))
    assert settings.global_batch_size == 16
    assert source == "tests.fixtures.declared_batch autotune_global_batch_size"


def test_otherwise_the_default_and_how_to_give_the_real_one() -> None:
    spec = WorkloadSpec(model="tests.fixtures.models:Small")
    settings, source = resolve_global_batch(spec, make_settings({}))
    assert settings.global_batch_size == 32
    assert source.startswith("default 32")
    assert "--global-batch-size" in source and "autotune_global_batch_size" in source


def test_a_bad_declaration_is_one_line() -> None:
    spec = WorkloadSpec(model="tests.fixtures.bad_batch:Model")
    with pytest.raises(WorkloadError, match=r"autotune_global_batch_size = 'big': expected a pos"):
        resolve_global_batch(spec, make_settings({}))


def test_a_trial_given_no_global_batch_takes_the_modules(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from autotune.cli import main

    argv = ["trial", "--model", "tests.fixtures.declared_batch:Model", "--json"]
    code = main([*argv, "--measured-steps", "2", "--warmup-steps", "1", "--target-interval", "0"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["config"]["global_batch_size"] == 16


def test_more_cpu_ranks_than_cores_are_said_to_share_them() -> None:
    # --devices 4 on this 2-core machine ran "AMD EPYC x4" trials without a word of the
    # contention that each measured.
    plain = make_settings({"trials": 2})
    said = _oversubscribed(plain, "cpu", 4, 2)["cores"]
    assert said.startswith("--devices 4 on 2 usable cores: ranks share cores")
    assert _oversubscribed(plain, "cpu", 2, 2) == {}
    assert _oversubscribed(plain, "cuda", 4, 2) == {}  # GPUs are counted, not cores
    cluster = make_settings({"trials": 2, "ray_address": "10.0.0.1:6379"})
    assert _oversubscribed(cluster, "cpu", 4, 2) == {}  # a cluster's nodes bring their own
