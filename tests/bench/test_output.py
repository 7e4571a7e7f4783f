"""A benchmark's results file: its folder made, written whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.bench.output import write_json, write_whole


def test_the_results_land_in_a_folder_that_did_not_exist(tmp_path: Path) -> None:
    path = write_json(tmp_path / "new" / "deeper" / "r.json", {"rows": [1, 2]})
    assert json.loads(path.read_text()) == {"rows": [1, 2]}
    assert not list(path.parent.glob("*.writing"))


def test_a_failed_write_leaves_the_last_whole_version(tmp_path: Path) -> None:
    path = write_json(tmp_path / "r.json", {"rows": [1]})
    with pytest.raises(TypeError):
        write_json(path, {"rows": object()})  # not JSON: fails before a byte is written
    assert json.loads(path.read_text()) == {"rows": [1]}


def test_a_write_is_renamed_into_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_whole(tmp_path / "r.txt", "old\n")

    def interrupted(self: Path, text: str) -> int:
        with self.open("w") as file:
            file.write(text[:2])  # half of it, then stopped
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_whole(path, "new text\n")
    assert path.read_text() == "old\n"
