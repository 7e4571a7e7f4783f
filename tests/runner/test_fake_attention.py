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


SCORES = 8 * 4 * 128 * 128 * 4  # one float32 score per query, key and head: the math path's


def test_grouped_keys_in_float32_hold_the_math_paths_scores_not_the_cpus_flash_kernels() -> None:
    # Without dropout a CPU runs its flash kernel on grouped keys in float32; CUDA, whose flash
    # kernel takes 16 bits only, runs the math path and holds the scores (and the keys and
    # values repeated to every head).
    flash = _activations("AttendsGroupedWithoutDropout", "cpu")
    assert _activations("AttendsGroupedWithoutDropout", "cuda") > flash + SCORES


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_the_math_path_the_code_picks_holds_its_scores_on_cuda_too(amp: str) -> None:
    # sdpa_kernel(SDPBackend.MATH) in the model's code: CUDA runs it as a CPU does, its softmax
    # kept in float32 even under autocast (the math path computes 16-bit inputs in float32)
    fused = _activations("AttendsWithoutDropout", "cuda", amp)
    assert _activations("AttendsMath", "cuda", amp) == _activations("AttendsMath", "cpu", amp)
    if amp == "off":  # the output's log-sum-exp traded for the scores' softmax
        assert _activations("AttendsMath", "cuda", amp) == pytest.approx(fused + SCORES, rel=0.01)
    else:  # and float32 copies of the 16-bit queries, keys and values
        assert _activations("AttendsMath", "cuda", amp) > fused + SCORES


@pytest.mark.parametrize("name", ["AttendsEfficientOnly", "AttendsCudnnOnly", "AttendsFlashOnly"])
def test_a_fused_kernel_the_code_picks_holds_what_the_default_one_does(name: str) -> None:
    assert _activations(name, "cuda", "bf16") == _activations(
        "AttendsWithoutDropout", "cuda", "bf16"
    )


def test_a_float32_step_with_only_16_bit_kernels_enabled_fails_as_on_cuda() -> None:
    from autotune.runner.fake_memory import TraceError

    spec = WorkloadSpec(model="tests.fixtures.traced:AttendsFlashOnly")
    with pytest.raises(TraceError, match=r"no kernel CUDA has enabled.*math path is disabled"):
        trace_step(spec, 8, device_type="cuda")
    # the memory-efficient kernel takes float32 on CUDA; a CPU has none of it
    assert _activations("AttendsEfficientOnly", "cuda") == _activations(
        "AttendsWithoutDropout", "cuda"
    )
    with pytest.raises(TraceError, match="No viable backend"):
        trace_step(WorkloadSpec(model="tests.fixtures.traced:AttendsEfficientOnly"), 8)


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


def test_a_gpu_before_capability_8_runs_bf16_attention_on_the_math_path() -> None:
    # A V100 or a T4 has no flash or cuDNN kernel, and its memory-efficient kernel takes no
    # bf16 (torch's sdp_utils): bf16 attention holds the math path's scores there; fp16 and
    # float32 stay fused.
    from autotune.runner.fake_memory import TraceError
    from autotune.runner.planned_gpu import GPUS, planning

    with planning(GPUS["t4"]):
        t4 = {amp: _activations("AttendsWithoutDropout", "cuda", amp) for amp in ("bf16", "fp16")}
        with pytest.raises(TraceError, match="no kernel CUDA has enabled"):  # none: flash alone
            trace_step(WorkloadSpec(model="tests.fixtures.traced:AttendsFlashOnly"), 8, "fp16",
                       device_type="cuda")  # fmt: skip
    fused = _activations("AttendsWithoutDropout", "cuda", "bf16")  # an H100's, as planned
    assert t4["fp16"] == _activations("AttendsWithoutDropout", "cuda", "fp16") == fused
    assert t4["bf16"] > fused + SCORES
