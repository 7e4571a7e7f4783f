"""Helpers shared by test modules."""

from __future__ import annotations

from autotune.cli import main


def exit_code(argv: list[str]) -> int | str | None:
    """main's return value, or the code of the SystemExit argparse raises for bad flags."""
    try:
        return main(argv)
    except SystemExit as error:
        return error.code
