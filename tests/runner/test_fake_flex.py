"""FlexAttention in the memory trace for a CUDA device (``fake_flex``): dense as CUDA runs it
without torch.compile, fused where the model's own code compiled it; a CPU trace still stops
at its refusal to train on a CPU, as a CPU trial does."""

from __future__ import annotations

import sys

import pytest
import torch

from autotune.bench.traced_step import real_step_peak
from autotune.runner.fake_flex import CudaFlexAttention, compiled_above, flex_kernels
from autotune.runner.fake_memory import TraceError, trace_step
from autotune.runner.workload import WorkloadSpec
from tests.fixtures.flex import HEADS, WIDTH, FlexBlocks

FLEX = WorkloadSpec(model="tests.fixtures.flex:FlexBlocks")
COMPILED = WorkloadSpec(model="tests.fixtures.flex:CompiledFlexBlocks")


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_flex_attention_is_traced_for_cuda_as_its_dense_kernels_hold_a_real_step(amp: str) -> None:
    # FlexAttention refuses to train on a CPU, and the trace's tensors are CPU tensors: a plan
    # for CUDA of a model calling it predicted nothing ("could not be traced"). Without
    # torch.compile CUDA runs its dense kernels; the same kernels on real CPU tensors, the
    # refusal lifted, are the step the trace is held to (its scores included).
    traced = trace_step(FLEX, 8, amp, device_type="cuda")
    assert (traced.flex_dense_calls, traced.flex_fused_calls) == (3, 0)  # one a block
    torch.manual_seed(0)
    real = real_step_peak(
        FlexBlocks(), torch.randn(8, 256, WIDTH), amp=amp, above=CudaFlexAttention
    )
    assert traced.total_bytes == pytest.approx(real, rel=0.01)


def test_flex_attention_the_model_compiled_itself_is_traced_fused_without_scores() -> None:
    # Hugging Face's and torchtitan's models call torch.compile(flex_attention): on CUDA its
    # fused kernel, compiled model or not. Traced dense, a plan counted scores no GPU holds.
    dense = trace_step(FLEX, 8, device_type="cuda")
    fused = trace_step(COMPILED, 8, device_type="cuda")
    assert (fused.flex_dense_calls, fused.flex_fused_calls) == (0, 3)
    scores = 8 * HEADS * 256 * 256 * 4  # one call's float32 scores, the dense kernels' own
    assert fused.total_bytes <= dense.total_bytes - scores
    # a trial that compiles the model runs it fused too: the dense trace knows by how much less
    assert dense.compiled().total_bytes == fused.total_bytes
    assert dense.compiled().backward_bytes == fused.backward_bytes
    assert (dense.compiled().flex_dense_calls, dense.compiled().flex_fused_calls) == (0, 3)
    assert fused.compiled() == fused  # nothing dense to take away

    # twice the sequence: twice the fused kernel's activations, over thrice the dense ones'
    def longer(name: str) -> int:
        spec = WorkloadSpec(model=f"tests.fixtures.flex:{name}")
        return trace_step(spec, 8, device_type="cuda").activations_bytes

    assert longer("long_compiled_flex_blocks") == pytest.approx(
        2 * fused.activations_bytes, rel=0.02
    )
    assert longer("long_flex_blocks") > 3 * dense.activations_bytes


def test_checkpointed_flex_attention_blocks_recompute_it_in_backward_the_same_way() -> None:
    plain = trace_step(FLEX, 8, device_type="cuda")
    checkpointed = trace_step(FLEX, 8, checkpoint_segments=3, device_type="cuda")
    assert checkpointed.flex_dense_calls == 6  # each block's again in backward
    assert checkpointed.activations_bytes < 0.8 * plain.activations_bytes
    compiled = trace_step(COMPILED, 8, checkpoint_segments=3, device_type="cuda")
    assert (compiled.flex_dense_calls, compiled.flex_fused_calls) == (0, 6)


def test_a_cpu_trace_of_flex_attention_stops_as_a_cpu_trial_does() -> None:
    from torch.nn.attention.flex_attention import flex_attention

    with pytest.raises(TraceError, match="FlexAttention does not support backward on CPU"):
        trace_step(FLEX, 8)
    trace_step(FLEX, 8, device_type="cuda")
    q = torch.randn(1, 4, 128, 32, requires_grad=True)  # the refusal is back after the trace
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, q, q)


def test_without_the_private_names_flex_attention_falls_back_to_the_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.runner import fake_flex

    monkeypatch.setattr(fake_flex, "flex_kernels", lambda: None)
    assert not CudaFlexAttention().available
    with pytest.raises(TraceError, match="does not support backward on CPU"):
        trace_step(FLEX, 8, device_type="cuda")


def test_without_the_fake_kernels_a_compiled_call_is_traced_dense(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataclasses import replace

    from autotune.runner import fake_flex

    found = flex_kernels()
    assert found is not None
    monkeypatch.setattr(fake_flex, "flex_kernels", lambda: replace(found, fused={}))
    traced = trace_step(COMPILED, 8, device_type="cuda")
    assert (traced.flex_dense_calls, traced.flex_fused_calls) == (3, 0)


def test_what_the_flex_trace_relies_on() -> None:
    """The front end's names it lifts (its refusal of a CPU input that requires a gradient,
    and the flag that calls the op without ``torch.compile``); the two higher-order ops'
    composite kernels, which CUDA runs without compiling, and their fake kernels; and
    ``torch.compile``'s wrapper, seen in the frames above a call, where a dispatch mode keeps
    dynamo from compiling."""
    import importlib

    from torch.utils._python_dispatch import TorchDispatchMode

    front = importlib.import_module("torch.nn.attention.flex_attention")
    assert front._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG is False
    q = torch.randn(1, 4, 128, 32, requires_grad=True)
    with pytest.raises(NotImplementedError):
        front._validate_device(q, q, q)
    kernels = flex_kernels()
    assert kernels is not None and CudaFlexAttention().available
    assert [k.__name__ for k in kernels.dense.values()] == ["sdpa_dense", "sdpa_dense_backward"]
    assert [k.__name__ for k in kernels.fused.values()] == [
        "flex_attention_fake_impl",
        "flex_attention_backward_fake_tensor_mode",
    ]

    def here() -> bool:
        return compiled_above(sys._getframe())

    class Passing(TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **(kwargs or {}))

    with Passing():
        assert torch.compile(here)() is True
        assert torch.compiler.disable(here)() is False
        assert here() is False


def test_a_parameter_only_the_score_modification_reads_trains() -> None:
    # Called without compiling (as the trace calls it), FlexAttention leaves out of autograd
    # what its score_mod captures, as torch warns; CUDA's compiled front end lifts it and
    # trains it. The trace said the bias was unused (DDP then given find_unused_parameters)
    # and counted no gradient or optimizer state for it.
    from autotune.runner.fake_flex import parameters_read
    from tests.fixtures.flex import LearnedBias

    traced = trace_step(
        WorkloadSpec(model="tests.fixtures.flex:LearnedBias"), 8, device_type="cuda"
    )
    model = LearnedBias()
    every = sum(p.numel() * p.element_size() for p in model.parameters())
    assert traced.unused_parameters == 0
    assert traced.gradient_bytes_full == every
    q = torch.zeros(1, HEADS, 4, WIDTH // HEADS)
    assert [p is model.bias for p in parameters_read(model.score_mod, q)] == [True]
    assert parameters_read(lambda score, *_: score.unsqueeze(0).unsqueeze(0)[0, 0], q) == []
