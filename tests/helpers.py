"""Helpers shared by test modules."""

from __future__ import annotations

import subprocess
import sys

from autotune.cli import main


def exit_code(argv: list[str]) -> int | str | None:
    """main's return value, or the code of the SystemExit argparse raises for bad flags."""
    try:
        return main(argv)
    except SystemExit as error:
        return error.code


def run_cli(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m autotune.cli ARGS`` in a fresh process, as a user's shell runs it."""
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        capture_output=True,
        text=True,
        check=check,
    )
