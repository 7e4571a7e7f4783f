"""The count behind ``refusals.GLOO_SPARSE`` (``scripts/bench_gloo_sparse.py``): a run of the
ranks ends "ok" or names how a rank died."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from autotune.bench.gloo_sparse import outcome, run, tally


@pytest.mark.slow  # the benchmark's own ranks; their hang is checked in the default run
def test_a_short_run_of_one_lookup_trains() -> None:
    # every variant's parts at once
    assert run(1, 5, variant="head+bucket-view+agree+sample") == "ok"


def test_a_rank_that_died_is_named_by_its_signal() -> None:
    said = "ProcessExitedException: process 1 terminated with signal SIGABRT"
    assert outcome(_failing(said), 60) == "SIGABRT"
    assert tally(["ok", "SIGABRT", "ok"]) == {"ok": 2, "SIGABRT": 1}


def test_a_hooks_error_is_said_in_its_own_words_one_key_a_cause() -> None:
    wrapped = "RuntimeError: Got the following error when running the callback: " * 2
    for port in (18636, 59617):
        said = f"{wrapped}RuntimeError: [/gloo/transport/tcp/pair.cc:553] Connection closed "
        said += f"by peer [127.0.0.1]:{port}. This is typically caused by a remote worker crashing"
        said_once = "failed: RuntimeError: Connection closed by peer [127.0.0.1]"
        assert outcome(_failing(said), 60) == said_once


def test_a_run_still_waiting_at_its_timeout_is_hung_and_leaves_no_rank(tmp_path: Path) -> None:
    # PowerSGD's ranks may wait on each other for good: a run killed alone left them running,
    # and the pytest that spawned them never exited.
    pid_file = tmp_path / "rank.pid"
    rank = "import time; time.sleep(120)"
    waits = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {rank!r}]); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)"
    )
    assert outcome([sys.executable, "-c", waits], 3) == "hung"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _failing(stderr: str) -> list[str]:
    """A command that writes ``stderr`` and exits 1, as a run whose rank failed does."""
    return [sys.executable, "-c", f"import sys; sys.stderr.write({stderr!r}); sys.exit(1)"]
