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


def test_the_module_a_compiled_model_wraps_is_read_and_remembered() -> None:
    net = torch.nn.Linear(2, 2)
    compiled = torch.compile(net)
    assert compile_state.compiled_module(compiled) is net  # OptimizedModule._orig_mod
    assert compile_state.was_compiled(net)
    assert compile_state.compiled_module(net) is None
    assert not compile_state.was_compiled(torch.nn.Linear(2, 2))


@pytest.mark.slow  # about 11-19 s: the wrapped module compiled in a trial
def test_a_factorys_compiled_model_is_trained_as_the_module_it_wraps() -> None:
    # torch.compile(Net()) from the factory: checkpointing patched blocks under the compiled
    # graph (one-off: 690 ms a step against 4 uncompiled), and --compile failed every trial
    # ("'function' object has no attribute 'parameters'")
    from autotune.api import run_trial
    from autotune.runner.workload import load_model
    from autotune.search.model_facts import own_compile
    from tests.fixtures.precompiled import Net

    reference = "tests.fixtures.precompiled:model"
    assert isinstance(load_model(reference)[1], Net)
    assert (own_compile(reference) or "").startswith("the model's factory compiles it")
    assert own_compile("tests.fixtures.precompiled:Net") is None
    few = {"warmup_steps": 1, "measured_steps": 2, "target_interval": 0}
    config = {"global_batch_size": 8, "compile": "default", "checkpoint_segments": 2}
    result = run_trial(reference, config, input_shape=(16,), **few)
    assert result.status == "ok", result.message


def test_what_a_model_compiles_itself_runs_eagerly_under_the_tools_own_modes() -> None:
    # Under a dispatch mode (the trace's, FlopCounterMode) dynamo compiles nothing, and a
    # fullgraph compile raised; the code it skipped then stayed skipped in the process.
    from torch.utils.flop_counter import FlopCounterMode

    compiled = torch.compile(lambda x: x.cos() * 2, fullgraph=True)
    with FlopCounterMode(display=False), compile_state.eager_compiles():
        assert compiled(torch.ones(3)).tolist() == [2 * torch.ones(1).cos().item()] * 3
    before = compile_state.compiled_graphs()
    compiled(torch.ones(3))  # and it compiles when the tool's modes are gone
    assert compile_state.compiled_since(before) == 1


def test_a_model_compiling_its_own_blocks_is_checked_and_named_as_written() -> None:
    # A search of it said "loss: not told whether it couples ... found no compiled frames",
    # and named its blocks OptimizedModule (the wrapper), in its lines and FSDP's exports
    from autotune.runner.workload import WorkloadSpec
    from autotune.search.coupled import loss_coupling
    from autotune.search.model_facts import fsdp_block_classes, repeated_blocks

    spec = WorkloadSpec(model="tests.fixtures.precompiled:CompilesItsBlocks", input_shape=(16,))
    assert loss_coupling(spec) is False  # its mean square is a mean over the samples
    assert repeated_blocks(spec) == (2, "Block")
    assert fsdp_block_classes(spec.model) == "Block"


def test_the_bf16_forward_check_compiles_nothing_and_says_nothing_of_flex_attention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # FSDP's bf16 check runs a real forward: a model's own compiled blocks were compiled for it
    # in bf16 (seconds a block), and torch's note that FlexAttention ran uncompiled, the tool's
    # doing, was printed in the middle of a plan's progress lines
    import warnings

    import torch.nn.attention.flex_attention as flex_front

    from autotune.runner.bf16_forward import bf16_forward_error
    from tests.fixtures.flex import WIDTH as FLEX_WIDTH
    from tests.fixtures.flex import FlexBlocks
    from tests.fixtures.precompiled import WIDTH, CompilesItsBlocks

    monkeypatch.setattr(flex_front, "_WARNINGS_SHOWN", set())  # said once a process
    before = compile_state.compiled_graphs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert bf16_forward_error(CompilesItsBlocks(), torch.randn(2, WIDTH), None) is None
        assert bf16_forward_error(FlexBlocks(), torch.randn(2, 128, FLEX_WIDTH), None) is None
    assert compile_state.compiled_since(before) == 0
    assert not [w for w in caught if "without torch.compile" in str(w.message)]
