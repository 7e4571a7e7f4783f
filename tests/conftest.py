from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank processes import "tests.fixtures..." and "workloads..." as a user's cwd would give.
    monkeypatch.chdir(ROOT)
    # A model file's directory goes first on sys.path as it is imported, as `python file.py`
    # puts it: a test's (one holding a package named "json") stayed there, and processes
    # spawned by later tests, which inherit sys.path, imported it for the standard library's.
    monkeypatch.setattr(sys, "path", list(sys.path))


# Every process this test session starts inherits this token; rank processes and their
# DataLoader workers (forked: same command line) are found by it, and by nothing else, so that
# other autotune runs on the machine do not count.
SESSION_TOKEN = uuid.uuid4().hex
os.environ["AUTOTUNE_TEST_SESSION"] = SESSION_TOKEN


def _rank_processes() -> set[int]:
    found = set()
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if "autotune.runner.rank" not in cmdline or process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if process.environ().get("AUTOTUNE_TEST_SESSION") == SESSION_TOKEN:
                found.add(process.pid)
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
    return found


@pytest.fixture
def no_leftover_processes():
    """Fails the test if a rank process or DataLoader worker it started is still alive after."""
    before = _rank_processes()
    yield
    left = _rank_processes() - before
    assert not left, f"trial processes left behind: {sorted(left)}"


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance for the whole session, with the logical CPUs a search of two ranks
    over the quick space asks of its own instance (``driver._executor``): with fewer, its gangs
    cannot all stay warm, and race runs start new rank actors, seconds each."""
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=16,
        include_dashboard=False,
        object_store_memory=100 << 20,
        log_to_driver=False,
        logging_level="ERROR",
        configure_logging=False,
    )
    yield ray
    ray.shutdown()


@pytest.fixture
def probe_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """A probe cache shared by the session's searches, apart from the user's own."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


@pytest.fixture
def one_rank_group():
    """A one-rank gloo process group in the test's own process, left afterwards."""
    from autotune.runner.fake_group import group_of_one

    with group_of_one():
        yield


@pytest.fixture
def rank_in_this_process() -> Iterator[None]:
    """For a test that runs a rank in its own process (``run_rank``): a one-process trial's
    rank stays in the group of one it joins, as a Ray rank does; left afterwards."""
    import torch.distributed as dist

    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of the module's own on the loopback address (skipped, with the
    reason, where none can be started)."""
    from tests import postgres as pg

    reason = pg.why_not()
    if reason is not None:
        pytest.skip(reason)
    server = pg.Server()
    server.start()
    yield server
    server.close()
