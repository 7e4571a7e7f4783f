"""CUDA's autocast policy on the trace's CPU tensors (``autotune.runner.fake_autocast``): what
it changes, that it changes nothing once left, and that its op lists are the installed torch's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from autotune.runner import fake_autocast
from autotune.runner.fake_autocast import cuda_policy
from autotune.runner.fake_memory import trace_step
from autotune.runner.workload import WorkloadSpec

HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"


def _dtypes() -> dict[str, torch.dtype]:
    x = torch.randn(4, 8)
    linear = torch.nn.Linear(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear(x)
        return {
            "linear": y.dtype,
            "layer_norm": torch.nn.functional.layer_norm(y, (8,)).dtype,
            "softmax": y.softmax(-1).dtype,
            "softmax asked for bf16": torch.softmax(y, -1, dtype=torch.bfloat16).dtype,
            "sum": y.sum().dtype,
            "sum over a dim": y.sum(0).dtype,
            "pow": (y**2).dtype,
            "a mask's sum": (y > 0).sum().dtype,
            "mv": torch.mv(x, x[0]).dtype,
        }


def test_under_the_policy_cpu_autocast_keeps_in_float32_what_cuda_autocast_does() -> None:
    cpu = _dtypes()
    with cuda_policy():
        cuda = _dtypes()
    assert cpu == {
        "linear": torch.bfloat16,
        "layer_norm": torch.bfloat16,
        "softmax": torch.bfloat16,
        "softmax asked for bf16": torch.bfloat16,
        "sum": torch.bfloat16,
        "sum over a dim": torch.bfloat16,
        "pow": torch.bfloat16,
        "a mask's sum": torch.int64,
        "mv": torch.float32,  # not on CPU autocast's list
    }
    assert cuda == {
        **cpu,
        "layer_norm": torch.float32,
        "softmax": torch.float32,
        "sum": torch.float32,
        "sum over a dim": torch.float32,
        "pow": torch.float32,
        "mv": torch.bfloat16,  # on CUDA's
    }
    assert _dtypes() == cpu  # left: CPU autocast as it was


def test_gradients_flow_through_the_policys_kernels() -> None:
    x = torch.randn(4, 8, requires_grad=True)
    with cuda_policy(), torch.autocast("cpu", dtype=torch.bfloat16):
        torch.nn.functional.layer_norm(x @ x.T, (4,)).softmax(-1).sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32


def _header_list(macro: str) -> set[str]:
    text = HEADER.read_text()
    start = text.index(f"#define {macro}(_)")
    body = text[start : text.index("\n\n", start)]
    entries = re.findall(r"_\(([A-Za-z0-9_]+)(?:,\s*([A-Za-z0-9_]+))?\)", body)
    return {f"{op}.{overload}" if overload else op for op, overload in entries}


@pytest.mark.skipif(not HEADER.exists(), reason="this torch ships no ATen headers")
def test_the_op_lists_are_the_installed_torchs() -> None:
    # As this torch's CUDA autocast takes them: 2.11's header has no rms_norm in its fp32 list,
    # and its CUDA autocast no kernel for it (one more op in a header fails here: copy it in).
    def taken(names: list[str]) -> set[str]:
        return {name for name in names if fake_autocast.cuda_autocasts(name)}

    assert taken(fake_autocast.FP32) == _header_list("AT_FORALL_FP32")
    assert taken(fake_autocast.FP32_RESULT) == _header_list("AT_FORALL_FP32_SET_OPT_DTYPE")
    assert taken(fake_autocast.LOWER_PRECISION) == _header_list("AT_FORALL_LOWER_PRECISION_FP")


def test_an_op_cuda_autocast_has_no_kernel_for_gets_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert all(fake_autocast.cuda_autocasts(n) for n in ("layer_norm", "softmax.int", "mm"))
    real = fake_autocast.cuda_autocasts
    monkeypatch.setattr(fake_autocast, "cuda_autocasts", lambda n: n != "rms_norm" and real(n))
    names = {name for name, _ in fake_autocast._kernels()}
    assert "rms_norm" not in names and "layer_norm" in names


def test_ops_cpu_autocast_already_has_a_kernel_for_are_left_to_it() -> None:
    listed = fake_autocast.FP32 + fake_autocast.FP32_RESULT + fake_autocast.LOWER_PRECISION
    here = [name for name in listed if fake_autocast.cuda_autocasts(name)]  # this torch's ops
    with_kernel = {
        name
        for name in here
        if torch._C._dispatch_has_kernel_for_dispatch_key(
            fake_autocast._op(name).name(), "AutocastCPU"
        )
    }
    assert with_kernel == set(fake_autocast.CPU_COVERED) & set(here)


def test_a_cuda_trace_counts_the_float32_scores_cuda_autocast_saves() -> None:
    # gpt_tiny softmaxes its own attention scores: under CUDA autocast the softmax's float32
    # output is saved for backward beside the bf16 copy the next matmul casts and saves; under
    # CPU autocast one bf16 tensor serves both. Measured on an H200 (GPT-2 small, micro-batch
    # 32): 65.4 GB allocated, 42.7 GB traced under CPU's policy, 62.3 GB under CUDA's.
    spec = WorkloadSpec(model="workloads.gpt:gpt_tiny")
    batch, heads, seq, layers = 8, 4, 64, 4
    scores_fp32 = layers * batch * heads * seq * seq * 4
    cpu = trace_step(spec, batch, "bf16")
    cuda = trace_step(spec, batch, "bf16", device_type="cuda")
    assert cuda.total_bytes - cpu.total_bytes == scores_fp32
    assert (
        trace_step(spec, batch).total_bytes
        == trace_step(spec, batch, device_type="cuda").total_bytes
    )


def _traced(name: str, amp: str, device_type: str = "cuda") -> int:
    spec = WorkloadSpec(model=f"tests.fixtures.traced:{name}")
    return trace_step(spec, 4096, amp, device_type=device_type).total_bytes


@pytest.mark.parametrize("model", ["CudaFp32Region", "CudaFp32Decorated"])
def test_a_region_the_model_keeps_in_float32_on_cuda_is_traced_in_float32(model: str) -> None:
    # On a CPU without CUDA torch disables the region: a bf16 trial's trace for CUDA ran it in
    # bf16, half the activations a GPU holds (the CPU trial runs it so, and its trace too)
    assert _traced(model, "bf16") == _traced("Stack", "off")
    assert _traced(model, "bf16", "cpu") == _traced("Stack", "bf16", "cpu")


def test_a_function_custom_fwd_keeps_in_float32_on_cuda_is_traced_in_float32() -> None:
    # custom_fwd(device_type="cuda", cast_inputs=float32) asked is_autocast_enabled("cuda"),
    # False on the trace's CPU autocast, and cast only tensors on CUDA: traced with the bf16
    # input it came with, half what a GPU saves
    assert callable(getattr(torch.amp.autocast_mode, "_cast", None))  # private, relied on
    decorated = _traced("SwishesDecoratedFp32", "bf16")
    assert decorated == _traced("SwishesInFp32Region", "bf16") > _traced("Swishes", "bf16")
    # on a CPU the decorator does nothing, as in the CPU trial
    assert _traced("SwishesDecoratedFp32", "bf16", "cpu") == _traced("Swishes", "bf16", "cpu")


def test_the_models_own_cuda_autocast_is_traced_in_its_precision() -> None:
    assert _traced("OwnCudaBf16", "off") == _traced("Stack", "bf16") < _traced("Stack", "off")


def test_autocast_is_torchs_own_again_after_the_regions() -> None:
    from torch.amp.autocast_mode import autocast

    own = (autocast.__init__, autocast.__enter__, autocast.__exit__)
    before = torch.autocast("cuda", enabled=False)  # made beforehand, as a decorator is
    with fake_autocast.cuda_regions():
        with torch.autocast("cuda", dtype=torch.bfloat16) as region:
            assert region.device == "cpu" and torch.is_autocast_enabled("cpu")
            assert torch.get_autocast_dtype("cpu") == torch.bfloat16
            assert torch.is_autocast_enabled("cuda") and torch.is_autocast_enabled()  # the CPU's
            assert torch.get_autocast_dtype("cuda") == torch.bfloat16
            with before:
                assert before.device == "cpu" and not torch.is_autocast_enabled("cpu")
            assert torch.is_autocast_enabled("cpu")
        assert not torch.is_autocast_enabled("cpu")
    assert before.device == "cuda"
    assert (autocast.__init__, autocast.__enter__, autocast.__exit__) == own
    assert torch.autocast("cpu").device == "cpu"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # CUDA's own answers again
        assert not torch.is_autocast_enabled("cuda")
        assert torch.get_autocast_dtype("cuda") == torch.float16
