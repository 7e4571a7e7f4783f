"""The count behind ``refusals.GLOO_SPARSE`` (``scripts/bench_gloo_sparse.py``): a run of the
ranks ends "ok" or names how a rank died."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from autotune.bench import gloo_sparse
from autotune.bench.gloo_sparse import run, tally


def test_a_short_run_of_one_lookup_trains() -> None:
    assert run(1, 5, variant="head+bucket-view+agree") == "ok"  # the variant's parts, each at once


def test_a_rank_that_died_is_named_by_its_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    def died(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        said = "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with "
        return subprocess.CompletedProcess(command, 1, "", said + "signal SIGABRT\n")

    monkeypatch.setattr(gloo_sparse.subprocess, "run", died)
    assert run(4, 300) == "SIGABRT"
    assert tally(["ok", "SIGABRT", "ok"]) == {"ok": 2, "SIGABRT": 1}
