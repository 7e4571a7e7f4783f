"""Pins the private counter ``autotune.runner.compile_state`` reads, and its fallback."""

from __future__ import annotations

import sys

import pytest
import torch

from autotune.runner import compile_state


def test_the_count_grows_by_each_graph_compiled_and_survives_a_reset() -> None:
    before = compile_state.compiled_graphs()
    assert before is not None  # torch still keeps dynamo's counter where this module reads it
    compiled = torch.compile(lambda x: x.sin() + 1, backend="eager")
    compiled(torch.ones(3))
    assert compile_state.compiled_since(before) == 1
    compiled(torch.ones(3))  # the same shapes: no graph compiled again
    assert compile_state.compiled_since(before) == 1
    compile_state.reset()  # drops the caches, not the count a trial took before it
    assert compile_state.compiled_since(before) == 1
    compiled(torch.ones(3))
    assert compile_state.compiled_since(before) == 2


def test_an_unreadable_counter_is_unknown_not_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo.utils as dynamo_utils

    monkeypatch.setattr(dynamo_utils, "counters", {})  # a release that keeps it elsewhere
    assert compile_state.compiled_graphs() is None
    assert compile_state.compiled_since(3) is None and compile_state.compiled_since(None) is None


def test_reset_imports_nothing_where_nothing_compiled() -> None:
    import subprocess

    code = (
        "import sys, torch; from autotune.runner import compile_state; compile_state.reset(); "
        "print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
