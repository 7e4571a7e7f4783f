"""CUDA's fused attention in the memory trace (``fake_attention``): traced for a CUDA device,
``F.scaled_dot_product_attention`` holds its output and a log-sum-exp per query, never the
sequence x sequence scores a CPU's math path keeps with dropout on."""

from __future__ import annotations

import pytest
import torch

from autotune.bench.traced_step import real_step_peak
from autotune.runner.fake_memory import trace_step
from autotune.runner.workload import WorkloadSpec
from tests.fixtures.traced import WIDTH, Attends


def _activations(name: str, device_type: str, amp: str = "off") -> int:
    spec = WorkloadSpec(model=f"tests.fixtures.traced:{name}")
    return trace_step(spec, 8, amp, device_type=device_type).activations_bytes


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_dropout_on_cuda_holds_what_a_fused_kernel_holds_not_the_scores(amp: str) -> None:
    # Without dropout a CPU runs its flash kernel, which saves what CUDA's fused kernels save:
    # the output and a log-sum-exp per query. With dropout it runs the math path.
    fused = _activations("AttendsWithoutDropout", "cpu", amp)
    seed = 16  # and dropout's random seed and offset, two int64 scalars
    assert _activations("Attends", "cuda", amp) == fused + seed
    assert _activations("Attends", "cpu", amp) > 1.5 * fused  # scores, softmax, dropout mask
    # twice the sequence: twice the fused kernel's activations, nearly thrice the math path's
    assert _activations("AttendsLong", "cuda", amp) == pytest.approx(2 * fused, rel=0.01)
    assert _activations("AttendsLong", "cpu", amp) > 2.5 * _activations("Attends", "cpu", amp)


def test_the_cpu_trace_is_still_a_real_cpu_step() -> None:
    traced = trace_step(WorkloadSpec(model="tests.fixtures.traced:Attends"), 8)
    model = Attends()
    torch.manual_seed(0)
    assert traced.total_bytes == pytest.approx(
        real_step_peak(model, torch.randn(8, 128, WIDTH)), rel=0.01
    )


def test_a_boolean_mask_becomes_the_additive_bias_cuda_makes_of_it() -> None:
    bias = 8 * 1 * 128 * 128 * 4  # one float32 per mask entry, saved for backward
    padded = _activations("AttendsPadded", "cuda")
    assert padded == _activations("Attends", "cuda") + bias


def test_grouped_keys_are_fused_in_low_precision_and_left_to_math_in_float32() -> None:
    # CUDA's flash kernel alone takes grouped keys and values, in 16 bits only.
    assert _activations("AttendsGrouped", "cuda") == _activations("AttendsGrouped", "cpu")
    assert _activations("AttendsGrouped", "cuda", "bf16") < 0.6 * _activations(
        "AttendsGrouped", "cpu", "bf16"
    )


def test_checkpointed_blocks_recompute_their_attention_as_cuda_does() -> None:
    # Backward recomputes a checkpointed block's forward, where a function mode is not active:
    # the CPU's path there saved other tensors than the forward had ("A different number of
    # tensors was saved"), and every checkpointed configuration stopped.
    spec = WorkloadSpec(model="tests.fixtures.traced:Encoder")
    plain = trace_step(spec, 4, device_type="cuda")
    checkpointed = trace_step(spec, 4, checkpoint_segments=4, device_type="cuda")
    assert checkpointed.activations_bytes < 0.6 * plain.activations_bytes
    assert plain.activations_bytes < 0.9 * trace_step(spec, 4).activations_bytes  # the CPU's
    # and the kernel is gone once the trace is: a real CPU call takes the CPU's path again
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.1).sum().backward()
    assert q.grad is not None


def test_the_private_efficient_attention_op_runs_and_differentiates_on_fake_tensors() -> None:
    """What ``fake_attention`` relies on: the memory-efficient kernel's op takes CPU fake
    tensors (its fake kernel), with a bias and dropout, and gives the output's shape and a
    backward."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = (torch.randn(2, 4, 64, 32, requires_grad=True) for _ in range(3))
        bias = torch.zeros(2, 1, 64, 64).expand(2, 4, 64, 64)
        output, logsumexp, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, True, 0.1, False, scale=None
        )
        assert output.shape == q.shape and logsumexp.shape[:2] == (2, 4)
        output.sum().backward()
        assert q.grad is not None and q.grad.shape == q.shape


FLEX = WorkloadSpec(model="tests.fixtures.flex:FlexBlocks")


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_flex_attention_is_traced_for_cuda_as_its_dense_kernels_hold_a_real_step(amp: str) -> None:
    # FlexAttention refuses to train on a CPU, and the trace's tensors are CPU tensors: a plan
    # for CUDA of a model calling it predicted nothing ("could not be traced"). Without
    # torch.compile CUDA runs its dense kernels; the same kernels on real CPU tensors, the
    # refusal lifted, are the step the trace is held to (its scores included).
    from autotune.runner.fake_attention import EagerFlexAttention
    from tests.fixtures.flex import WIDTH as FLEX_WIDTH
    from tests.fixtures.flex import FlexBlocks

    traced = trace_step(FLEX, 8, amp, device_type="cuda")
    assert traced.flex_attention_calls == 3  # one a block
    torch.manual_seed(0)
    real = real_step_peak(
        FlexBlocks(), torch.randn(8, 256, FLEX_WIDTH), amp=amp, above=EagerFlexAttention
    )
    assert traced.total_bytes == pytest.approx(real, rel=0.01)


def test_checkpointed_flex_attention_blocks_recompute_it_in_backward() -> None:
    plain = trace_step(FLEX, 8, device_type="cuda")
    checkpointed = trace_step(FLEX, 8, checkpoint_segments=3, device_type="cuda")
    assert checkpointed.flex_attention_calls == 6  # each block's again in backward
    assert checkpointed.activations_bytes < 0.8 * plain.activations_bytes


def test_a_cpu_trace_of_flex_attention_stops_as_a_cpu_trial_does() -> None:
    from torch.nn.attention.flex_attention import flex_attention

    from autotune.runner.fake_memory import TraceError

    with pytest.raises(TraceError, match="FlexAttention does not support backward on CPU"):
        trace_step(FLEX, 8)
    trace_step(FLEX, 8, device_type="cuda")
    q = torch.randn(1, 4, 128, 32, requires_grad=True)  # the refusal is back after the trace
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, q, q)


def test_without_the_private_names_flex_attention_falls_back_to_the_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.runner import fake_attention
    from autotune.runner.fake_memory import TraceError

    monkeypatch.setattr(fake_attention, "_flex_kernels", lambda: None)
    assert not fake_attention.EagerFlexAttention().available
    with pytest.raises(TraceError, match="does not support backward on CPU"):
        trace_step(FLEX, 8, device_type="cuda")


def test_what_eager_flex_attention_relies_on() -> None:
    """The front end's names it lifts (its refusal of a CPU input that requires a gradient, and
    the flag that calls the op without ``torch.compile``), and the two higher-order ops'
    composite kernels, which CUDA runs without compiling."""
    import importlib

    from autotune.runner.fake_attention import EagerFlexAttention, _flex_kernels

    front = importlib.import_module("torch.nn.attention.flex_attention")
    assert front._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG is False
    q = torch.randn(1, 4, 128, 32, requires_grad=True)
    with pytest.raises(NotImplementedError):
        front._validate_device(q, q, q)
    kernels = _flex_kernels()
    assert kernels is not None and len(kernels[2]) == 2
    assert [kernel.__name__ for kernel in kernels[2].values()] == [
        "sdpa_dense",
        "sdpa_dense_backward",
    ]
    assert EagerFlexAttention().available
