"""A team's study in a real PostgreSQL server: killed, then finished by two drivers at once, the
server restarting under a search, and no password anywhere."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import optuna
import pytest

from autotune.search.storage import StorageLost, open_storage
from tests.helpers import SMALL_SEARCH, cli_here, kill_tree, stored_records
from tests.postgres import PASSWORD, Server, why_not

pytestmark = pytest.mark.usefixtures("probe_cache")

SECRETS = (PASSWORD, quote(PASSWORD, safe=""))
SEARCH = [sys.executable, "-m", "autotune.cli", *SMALL_SEARCH, "--space", "quick"]
SEARCH += ["--top-k", "2", "--race-rounds", "2"]


def _no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


def _measured_keys(records: list[dict]) -> list[str]:
    return [
        json.dumps(r["config"], sort_keys=True)
        for r in records
        if r.get("role") in ("baseline", "search")
        and r.get("status") not in (None, "skipped", "duplicate", "invalid")
    ]


def _wait_for(storage: str, process: subprocess.Popen[str], count: int, within_s: float) -> None:
    """Until ``count`` trials of the baseline and the search are stored."""
    deadline = time.time() + within_s
    while time.time() < deadline and process.poll() is None:
        if len(_measured_keys(stored_records(storage))) >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"fewer than {count} trials stored (driver exit {process.poll()})")


def _own_server() -> Server:
    """A server of the test's own (it is stopped and started), or a skip saying why not."""
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    return Server()


def test_a_database_that_stops_answering_is_waited_for_then_given_up_in_one_line() -> None:
    server = _own_server()
    server.start()
    try:
        url = server.create_database("patience")
        said: list[str] = []
        study = optuna.create_study(study_name="s", storage=open_storage(url, 1.0, said.append))
        study.add_trial(optuna.trial.create_trial(value=1.0))
        server.stop()
        with pytest.raises(StorageLost) as lost:
            study.get_trials(deepcopy=False)
        message = str(lost.value)
        assert "did not answer for 1 s" in message and "run the same command again" in message
        assert "\n" not in message and "***" in message
        assert said == [f"the study database at {url.replace(quote(PASSWORD, safe=''), '***')}"
                        " stopped answering; waiting up to 1 s for it"]  # fmt: skip
        _no_secret(message, *said)

        server.start()  # the server is back: the stored trial is there, the same storage works
        said.clear()
        again = optuna.load_study(study_name="s", storage=open_storage(url, 30.0, said.append))
        assert [t.value for t in again.get_trials()] == [1.0]
        assert [t.value for t in study.get_trials()] == [1.0]
    finally:
        server.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_study_is_finished_by_two_drivers_that_share_it_and_hold_no_password(
    postgres: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = postgres.create_database(f"k{uuid.uuid4().hex[:8]}")
    argv = [*SEARCH, "--devices", "1", "--trials", "6", "--storage", url, "--study-name", "team"]
    first = subprocess.Popen(
        [*argv, "--out", str(tmp_path / "first.yaml")],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _wait_for(url, first, 2, 240)
    kill_tree(first)
    before = stored_records(url)

    # the killed driver's study, resumed by two drivers at once
    drivers = [
        subprocess.Popen(
            [*argv, "--out", str(tmp_path / f"best{i}.yaml")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [d.communicate(timeout=800) for d in drivers]
    for driver, (_, err) in zip(drivers, outs, strict=True):
        assert driver.returncode == 0, err[-2000:]
    everything = stored_records(url, with_running=True)
    hanging = [r["number"] for r in everything if r["state"] == "RUNNING"]
    assert not hanging, (hanging, before, [err[-3000:] for _, err in outs])  # none left running
    after = [r for r in everything if "role" in r]
    # every trial holds its record but one the kill cut short, its configuration run again
    assert [r["state"] for r in everything if "role" not in r] in ([], ["FAIL"])
    assert all(any(a["number"] == b["number"] and a["status"] == b["status"] for a in after)
               for b in before)  # fmt: skip
    measured = _measured_keys(after)
    assert len(measured) == len(set(measured))  # not one configuration measured twice
    assert 6 <= len(measured) <= 7  # the study's budget, shared (one may start as it fills)
    assert all("***@127.0.0.1" in out for out, _ in outs)  # where the study lives, said

    outputs = [o for pair in outs for o in pair] + [first.stdout.read() if first.stdout else ""]
    for fmt in ("yaml", "torchrun", "hf"):  # the header, the command, a trainer's notes
        outputs += cli_here(capsys, "export", "--storage", url, "--study-name", "team",
                            "--format", fmt, "--out", str(tmp_path / f"export.{fmt}"))  # fmt: skip
    for command in (["show"], ["report", "--out", str(tmp_path / "report.html")]):
        outputs += cli_here(capsys, *command, "--storage", url, "--study-name", "team")
    files = [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) >= 5
    _no_secret(*outputs, *files, postgres.dump(url.rsplit("/", 1)[1]))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_search_waits_out_a_server_restart_and_loses_nothing(tmp_path: Path) -> None:
    server = _own_server()
    server.start()
    try:
        url = server.create_database("restart")
        argv = [*SEARCH, "--devices", "1", "--trials", "6", "--storage", url]
        driver = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stream = driver.stderr
        assert driver.stdout is not None and stream is not None
        said: list[str] = []  # the driver's progress lines, read as they come
        reader = threading.Thread(target=lambda: said.extend(iter(stream.readline, "")))
        reader.start()
        _wait_for(url, driver, 2, 300)
        before = stored_records(url)
        server.stop()
        # down until the driver finds the database gone: a trial on a new gang took 6 s on a
        # slow box, longer than the 5 s it was down for before, and the driver never saw it
        deadline = time.time() + 120
        while time.time() < deadline and not any("stopped answering" in s for s in said):
            time.sleep(0.5)
        server.start()
        out = driver.stdout.read()  # to its end, as the driver exits
        driver.wait(timeout=600)
        reader.join()
        err = "".join(said)
        assert driver.returncode == 0, err[-2000:]
        assert "stopped answering; waiting up to 300 s" in err, err[-3000:]  # progress
        assert "answers again after" in err
        after = stored_records(url)
        assert all(any(a["number"] == b["number"] for a in after) for b in before)
        assert len(_measured_keys(after)) >= 6
        _no_secret(out, err)
    finally:
        server.close()
