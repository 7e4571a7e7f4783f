"""A trial whose two ranks run on two nodes of a local Ray cluster, with the user's code shipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_processes")]

SCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "two_node_trial.py"
MODEL = """
import torch.nn as nn


class Net(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def autotune_dataset(model):
    import torch
    from torch.utils.data import TensorDataset

    return TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
"""


@pytest.mark.timeout(600)
def test_two_ranks_on_two_nodes_rendezvous_train_and_are_measured(tmp_path: Path) -> None:
    driver_dir = tmp_path / "project"
    driver_dir.mkdir()
    (driver_dir / "only_here_model.py").write_text(MODEL)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    process = subprocess.run(
        [sys.executable, str(SCRIPT), "only_here_model"],
        cwd=driver_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    out = json.loads(process.stdout.strip().splitlines()[-1])
    assert not (driver_dir / "only_here_model.py").exists()  # only the shipped copy existed
    assert out["shipped"] == str(driver_dir)
    result = out["result"]
    assert result["status"] == "ok", result["message"]
    assert result["samples_per_s"] > 0 and result["measured_steps"] == 3
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["node"] for r in ranks} == set(out["nodes"])  # one rank on each of the 2 nodes
    assert len(out["nodes"]) == 2
    for rank in ranks:
        assert len(rank["step_times_s"]) == 3 and all(x > 0 for x in rank["losses"])


LOST_NODE = Path(__file__).resolve().parent.parent / "fixtures" / "lost_node_trial.py"


def _ray_processes() -> dict[int, str]:
    """Ray processes this test session started (they inherit its token), each with the Ray
    session it belongs to (its command line's, else its parent's: a worker renames itself
    ``ray::IDLE``)."""
    import re

    import psutil

    token = os.environ["AUTOTUNE_TEST_SESSION"]
    session = re.compile(r"session_\d{4}-\d\d-\d\d_[\d-]+_\d+_\d+")
    found = {}
    for process in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
            ours = process.environ().get("AUTOTUNE_TEST_SESSION") == token
            alive = process.status() != psutil.STATUS_ZOMBIE
            if "ray" in cmdline and "pytest" not in cmdline and ours and alive:
                parent = process.parent()
                named = session.search(cmdline) or session.search(
                    " ".join(parent.cmdline()) if parent else ""
                )
                found[process.pid] = named.group(0) if named else ""
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
    return found


def _left_behind(before: dict[int, str]) -> set[int]:
    """Ray processes started since ``before`` that belong to none of its Ray sessions: the
    test session's own Ray instance may start a worker meanwhile, and that is not left behind."""
    kept = set(before.values()) - {""}
    return {pid for pid, name in _ray_processes().items() if pid not in before and name not in kept}


def _described(pids: set[int]) -> list[str]:
    """Each left-behind process's pid, command line and parent, for the failure's message."""
    import psutil

    described = []
    for pid in sorted(pids):
        try:
            process = psutil.Process(pid)
            parent = process.parent()
            command = " ".join(process.cmdline())[:160]
            parents = f"{parent.pid} {' '.join(parent.cmdline())[:80]!r}" if parent else "none"
            described.append(f"{pid} {command!r} (parent {parents})")
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            described.append(f"{pid} (gone)")
    return described


@pytest.mark.timeout(600)
def test_a_lost_node_fails_its_trial_and_a_lost_cluster_stops_in_one_line() -> None:
    before = _ray_processes()
    process = subprocess.run(
        [sys.executable, str(LOST_NODE)],
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    out = json.loads(process.stdout.strip().splitlines()[-1])
    assert out["lost"]["status"] == "crashed"
    assert "node lost: the Ray node" in out["lost"]["message"], out["lost"]["message"]
    assert out["lost_after_s"] < 120  # found within the failure grace, not the trial timeout
    assert out["after"]["status"] == "ok", out["after"]["message"]  # what is left still runs
    # the whole cluster lost: a clear message within seconds, not Ray's ending the driver
    assert out["cluster_lost"].startswith("lost the Ray cluster at '"), out["cluster_lost"]
    assert "run the same command again" in out["cluster_lost"]
    assert out["cluster_lost_after_s"] < 30 and out["shutdown_after_s"] < 40
    # a Ray worker that was starting when the head went may wait out Ray's GCS reconnect
    # timeout (RAY_gcs_rpc_server_reconnect_timeout_s) before it exits by itself, longer on a
    # loaded machine; what stays past 90 s is left behind
    deadline = time.time() + 90
    while _left_behind(before) and time.time() < deadline:
        time.sleep(1)
    left = _left_behind(before)
    assert not left, f"Ray processes left behind: {_described(left)}"
