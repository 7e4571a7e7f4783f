"""Helpers shared by test modules."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

from autotune.cli import main

SMALL_SEARCH = [
    "search",
    "--model",
    "tests.fixtures.models:Small",
    "--global-batch-size",
    "32",
    "--measured-steps",
    "3",
    "--target-interval",
    "0",
    "--warmup-steps",
    "1",
]
"""A search of a small model with short trials (add --devices, --storage, budgets)."""

FEW: dict[str, Any] = {"warmup_steps": 1, "measured_steps": 2, "target_interval": 0}
"""A trial's shortest window (``TrialOptions`` fields, or ``run_trial``'s keywords): one
warm-up step, two measured, no interval to reach."""


def exit_code(argv: list[str]) -> int | str | None:
    """main's return value, or the code of the SystemExit argparse raises for bad flags."""
    try:
        return main(argv)
    except SystemExit as error:
        return error.code


def cli_here(capsys: Any, *args: str) -> tuple[str, str]:
    """``autotune ARGS`` in this process (a stored study read back: no process start to pay);
    its stdout and stderr. Fails on a non-zero exit."""
    code = exit_code(list(args))
    out, err = capsys.readouterr()
    assert code == 0, f"autotune {' '.join(args)} exited {code}: {err[-2000:]}"
    return out, err


def run_cli(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m autotune.cli ARGS`` in a fresh process, as a user's shell runs it."""
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        capture_output=True,
        text=True,
        check=check,
    )


def stored_records(storage: str, with_running: bool = False) -> list[dict]:
    """Every finished trial's stored record in ``storage`` (a URL), with its number and state;
    ``with_running``: every other trial too (running, or failed without a record), as
    ``{"number", "state"}``."""
    import optuna

    try:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    except Exception:
        return []
    out = []
    for name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        for t in study.get_trials(deepcopy=False):
            record = t.user_attrs.get("autotune:record")
            if record and t.state.is_finished():
                out.append({**record, "number": t.number, "state": t.state.name})
            elif with_running:
                out.append({"number": t.number, "state": t.state.name})
    return out


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a driver started with ``start_new_session``, then sweep up its private Ray (in
    the driver's session)."""
    import os
    import signal
    import time

    import psutil

    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    time.sleep(1)
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == process.pid:
                p.kill()
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            pass


def on_two_gloo_ranks(run: Callable[[int, str, str], None], tmp_path: object) -> Any:
    """What rank 0 of ``run(rank, store_path, out)``, spawned on two processes, saved to ``out``
    (``torch.save``); each rank joins its gloo group by the file store at ``store_path``."""
    import torch
    import torch.multiprocessing as mp

    out = f"{tmp_path}/out.pt"
    mp.spawn(run, args=(f"{tmp_path}/store", out), nprocs=2)
    return torch.load(out)
