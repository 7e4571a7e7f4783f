"""A storage URL's password is never printed: masked in messages, progress and stored values."""

from __future__ import annotations

import pytest

from autotune.cli import main
from autotune.secrets import mask_url, password_of, redact

URL = "postgresql://alice:S3cretPW@127.0.0.1:1/tune"


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (URL, "postgresql://alice:***@127.0.0.1:1/tune"),
        ("postgresql+psycopg2://b:p%40ss:w/rd@h:5432/db", "postgresql+psycopg2://b:***@h:5432/db"),
        ("postgresql://h/db?sslmode=x&password=abc123", "postgresql://h/db?sslmode=x&password=***"),
        ("postgresql://alice@h/db", "postgresql://alice@h/db"),
        ("autotune.db", "autotune.db"),
        ("sqlite:////tmp/a:b@c.db", "sqlite:////tmp/a:b@c.db"),
    ],
)
def test_only_the_password_is_masked(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_a_password_echoed_in_any_form_is_redacted() -> None:
    url = "postgresql://bob:p%40ss@h/db"
    assert password_of(url) == "p%40ss"
    text = redact("FATAL: password authentication failed (p@ss) for p%40ss", url)
    assert "p@ss" not in text and "p%40ss" not in text


@pytest.mark.parametrize("command", ["search", "show", "report", "export"])
def test_no_command_prints_the_password_of_a_storage_it_cannot_open(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "--storage", URL]
    if command == "search":
        argv = [command, "--model", "workloads.gpt:gpt_tiny", "--storage", URL]
    assert main(argv) == 2
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "S3cretPW" not in out
    assert "postgresql://alice:***@127.0.0.1:1/tune" in out
    assert "Traceback" not in out
    assert len(captured.err.strip().splitlines()) == 1
    assert "cannot be opened (OperationalError" in captured.err  # nothing answers on port 1


def test_a_missing_database_driver_names_the_extra_that_brings_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "psycopg", None)  # as where the extra is not installed
    assert main(["show", "--storage", URL]) == 2
    err = capsys.readouterr().err
    assert "S3cretPW" not in err and len(err.strip().splitlines()) == 1
    assert "autotune[postgres]" in err  # the driver is an extra, and it says which
