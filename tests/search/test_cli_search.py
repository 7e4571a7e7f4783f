"""`autotune search / export / show` as a user runs them, including a kill and a resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.config import load_config
from tests.helpers import SMALL_SEARCH, cli_here, exit_code, kill_tree, stored_records

pytestmark = pytest.mark.usefixtures("probe_cache")

SEARCH = [*SMALL_SEARCH, "--devices", "2", "--quiet"]
DEFAULT_COLLATE = "torch.utils.data:default_collate"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--memory-budget", "lots"], "'lots' is not a size"),
        (["--memory-budget", "1.5"], "neither a fraction in (0, 1] nor a number of bytes"),
        (["--space", "nope"], "--space 'nope' is neither a file nor a built-in space"),
        (["--storage", "nosuchdb://x/y"], "--storage 'nosuchdb://x/y' cannot be opened"),
        (["--time-budget", "soon"], "time_budget_s='soon': 'soon' is not a duration; use e.g."),
        (["--trials", "0"], "trials=0"),
        (  # samples of different lengths, stacked by torch's default_collate
            ["--model", "tests.fixtures.padded:Tagger", "--collate", DEFAULT_COLLATE],
            "the DataLoader cannot make a batch of the dataset's first samples: RuntimeError: "
            "stack expects each tensor to be equal size",
        ),
        (["--collate", "tests.fixtures.models:NOT_CALLABLE"], "expected a callable collate"),
        (  # 256 samples: the loaders drop a partial batch, so no step could be made
            ["--global-batch-size", "512"],
            "the dataset holds 256 samples, fewer than one global batch of 512: no step could be "
            "made of an epoch; use --global-batch-size 256 or less, or a larger dataset",
        ),
        (  # clip_grad_norm_ takes no sparse gradient: every trial would fail its first step
            ["--model", "tests.fixtures.sparse:OneLookup", "--max-grad-norm", "1"],
            "max_grad_norm=1: torch's clip_grad_norm_ takes no sparse gradients",
        ),
        (  # a global batch two ranks cannot split: every configuration invalid
            ["--global-batch-size", "7"],
            "global batch 7 does not split evenly over 2 devices: use a multiple of 2 (such as 8)",
        ),
    ],
)
def test_bad_search_input_is_one_line(
    extra: list[str], expected: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert exit_code([*SEARCH, "--storage", str(tmp_path / "s.db"), *extra]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s.db").exists()  # bad input leaves no empty study database


@pytest.mark.parametrize(
    "stop",
    [
        "sigterm to the driver",
        # the default run keeps one stop (~55 s each): the others' resume is the same code
        pytest.param("sigkill to every process", marks=pytest.mark.slow),
        pytest.param("sigterm to every process", marks=pytest.mark.slow),
    ],
)
def test_a_stopped_search_resumes_without_losing_or_rerunning_trials(
    stop: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kill``, ``timeout`` or a scheduler's stop: the search ends as on Ctrl-C, with one line
    and 143, not Ray's stack trace and an abort (134), and leaves no Ray process behind. Sent
    to every process of the job at once (Slurm's ``scancel``), its raylet is gone before the
    driver shuts its gangs down: that shutdown waited for it forever. Killed outright, its
    running trials are left in the storage as running. Each way, the same command resumes it:
    nothing that finished is lost or measured again."""
    import signal

    db = tmp_path / "s.db"
    argv = [
        sys.executable,
        "-m",
        "autotune.cli",
        *SEARCH,
        "--space",
        "quick",
        "--trials",
        "4",
        "--top-k",
        "2",
        "--race-rounds",
        "2",
        "--storage",
        str(db),
        "--out",
        str(tmp_path / "best.yaml"),
    ]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    first = subprocess.Popen(
        argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 240
    while time.time() < deadline and first.poll() is None:
        if (
            sum(
                r["role"] in ("baseline", "search") and r["status"] == "ok"
                for r in stored_records(f"sqlite:///{db}")
            )
            >= 2
        ):
            break
        time.sleep(0.5)
    assert first.poll() is None, "the search ended before it could be stopped"
    if stop == "sigkill to every process":
        first.stderr.close()  # type: ignore[union-attr]
        kill_tree(first)
    else:
        if stop == "sigterm to every process":
            os.killpg(first.pid, signal.SIGTERM)
        else:
            first.send_signal(signal.SIGTERM)
        try:
            _, err = first.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            kill_tree(first)
            raise
        lines = err.decode().strip().splitlines()
        assert first.returncode == 143, lines[-5:]
        assert lines[-1] == (
            f"autotune: stopped by SIGTERM: the trials that finished are stored in {db}; the "
            "same command resumes the search (--new-study starts it afresh)"
        )
        assert not any("SIGTERM received" in line for line in lines)
        # idle Ray workers whose raylet went first end on their own (5-12 s here)
        deadline = time.time() + 30
        while (left := _in_session(first.pid)) and time.time() < deadline:
            time.sleep(1)
        for p in left:
            p.kill()
        assert not left, f"left running: {[' '.join(p.cmdline())[:120] for p in left]}"
    before = stored_records(f"sqlite:///{db}")
    assert len([r for r in before if r["status"] == "ok"]) >= 2

    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert second.returncode == 0, second.stderr[-2000:]
    after = stored_records(f"sqlite:///{db}")
    # nothing completed is lost
    assert all(
        any(a["number"] == b["number"] and a["status"] == b["status"] for a in after)
        for b in before
    )
    # nothing completed is measured again
    measured = [
        json.dumps(r["config"], sort_keys=True)
        for r in after
        if r["role"] in ("baseline", "search") and r["status"] == "ok"
    ]
    assert len(measured) == len(set(measured))
    assert load_config(tmp_path / "best.yaml").global_batch_size == 32
    assert "stored in" in second.stdout and "speed-up" in second.stdout
    if stop != "sigterm to the driver":
        return

    # export and show read the stored study (in this process: their own launch is test_cli's)
    for fmt, check in (
        ("yaml", "global_batch_size: 32"),
        ("json", '"global_batch_size": 32'),
    ):
        out, _ = cli_here(capsys, "export", "--storage", str(db), "--format", fmt)
        assert check in out
    command = tmp_path / "launch.sh"
    cli_here(capsys, "export", "--storage", str(db), "--format", "torchrun", "--out", str(command))
    written = tmp_path / "autotune-best.yaml"
    assert f"--config {written}" in command.read_text()
    assert load_config(written) == load_config(tmp_path / "best.yaml")
    shown, _ = cli_here(capsys, "show", "--storage", str(db))
    assert "baseline" in shown and "verify" in shown
    shown, _ = cli_here(capsys, "show", "--storage", str(db), "--json")
    data = json.loads(shown)
    assert [t["number"] for t in data["trials"]] == [r["number"] for r in after]
    assert data["recommendation"]["config"] == load_config(tmp_path / "best.yaml").model_dump(
        mode="json"
    )

    page_path = tmp_path / "report.html"
    cli_here(capsys, "report", "--storage", str(db), "--out", str(page_path),
             "--train-samples", "1000000", "--price-per-device-hour", "2.5")  # fmt: skip
    page = page_path.read_text()
    assert page.count("<svg") == 2 and '<tr class="winner">' in page
    assert "Time and cost to train" in page and "device-hours" in page
    assert "Which knobs mattered" in page


def _in_session(sid: int) -> list:
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                found.append(p)
        except (psutil.Error, ProcessLookupError):
            continue
    return found
