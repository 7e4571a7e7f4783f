from __future__ import annotations

from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank processes import "tests.fixtures..." and "workloads..." as a user's cwd would give.
    monkeypatch.chdir(ROOT)


def _rank_processes() -> set[int]:
    """Rank processes and their DataLoader workers (forked: same command line), system-wide."""
    found = set()
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if "autotune.runner.rank" in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.add(process.pid)
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
    """One local Ray instance for the whole session, with logical CPUs for 2-rank gangs."""
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=8,
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
