"""The user's code imported and built as a program run alone: research code that parses its
command line as it loads takes its defaults, and its exit is one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.errors import WorkloadError
from autotune.runner.references import resolve_reference
from autotune.runner.workload import load_model

PARSES_AT_IMPORT = """
import argparse
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--hidden", type=int, {default})
args = parser.parse_args()
seen_argv = list(__import__("sys").argv)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, args.hidden)

    def forward(self, x):
        return self.layer(x)


def make():
    late = parser.parse_args()  # a factory that reads the command line too
    return nn.Linear(4, late.hidden)
"""

TOOL_ARGV = ["autotune", "search", "--model", "x:Net", "--devices", "2"]


@pytest.mark.parametrize("form", ["file", "dotted"])
def test_a_module_parsing_its_command_line_at_import_takes_its_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    name = f"parses_at_import_{form}"
    (tmp_path / f"{name}.py").write_text(PARSES_AT_IMPORT.format(default="default=7"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", TOOL_ARGV)
    location = f"{tmp_path}/{name}.py" if form == "file" else name
    module, model = load_model(f"{location}:Net")
    assert model.layer.out_features == 7
    assert module.seen_argv == [str(tmp_path / f"{name}.py") if form == "file" else name]
    _, factory_built = load_model(f"{location}:make")
    assert factory_built.out_features == 7
    assert sys.argv == TOOL_ARGV  # given back after


def test_a_module_that_exits_as_it_loads_is_one_line_and_left_unimported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "needs_args.py").write_text(PARSES_AT_IMPORT.format(default="required=True"))
    monkeypatch.setattr(sys, "argv", TOOL_ARGV)
    for location in (f"{tmp_path}/needs_args.py", "needs_args"):
        monkeypatch.syspath_prepend(str(tmp_path))
        with pytest.raises(WorkloadError) as raised:
            resolve_reference(f"{location}:Net", "--model")
        message = str(raised.value)
        assert "\n" not in message
        assert f"importing {location!r} called sys.exit(2)" in message
        assert "if __name__ ==" in message
        assert not [m for m in sys.modules if "needs_args" in m]
        assert sys.argv == TOOL_ARGV
    # argparse's own line names the user's program, not the tool's flags
    assert "needs_args" in capsys.readouterr().err
