"""torch's ``CausalBias`` masks in the memory trace (``fake_bias``): built beneath the fake mode,
as a real step builds them, they trace the step SDPA's ``is_causal`` traces."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention.bias import CausalBias, causal_lower_right, causal_upper_left

from autotune.bench.traced_step import real_step_peak
from autotune.runner.fake_bias import causal_biases
from autotune.runner.fake_memory import trace_step
from autotune.runner.workload import WorkloadSpec
from tests.fixtures.traced import WIDTH, AttendsBiased

BIASED = WorkloadSpec(model="tests.fixtures.traced:AttendsBiased")
CAUSAL = WorkloadSpec(model="tests.fixtures.traced:Attends")


def test_torch_cannot_build_a_causal_bias_under_a_fake_mode() -> None:
    # Why the module exists: the day this passes no more, ``causal_biases`` can go.
    with FakeTensorMode(), pytest.raises(RuntimeError, match="FakeTensor"):
        causal_lower_right(8, 8)


def test_a_causal_bias_is_built_under_a_fake_mode_as_a_real_step_builds_it() -> None:
    real = causal_lower_right(8, 16)
    with causal_biases(), FakeTensorMode() as mode:
        bias = causal_lower_right(8, 16)
        upper = causal_upper_left(8, 16)
        query = mode.from_tensor(torch.randn(2, 4, 8, 32))
        key, value = (mode.from_tensor(torch.randn(2, 4, 16, 32)) for _ in range(2))
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=bias)
    assert type(bias) is CausalBias and type(upper) is CausalBias
    assert (bias.variant, bias.seq_len_q, bias.seq_len_kv) == (real.variant, 8, 16)
    assert torch.Tensor.size(bias) == torch.Tensor.size(real)  # torch's own quirk, kept
    assert out.shape == (2, 4, 8, 32)
    with FakeTensorMode(), pytest.raises(RuntimeError):  # left as it was
        causal_lower_right(8, 8)
    assert "__new__" not in CausalBias.__dict__


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_a_model_masked_by_a_causal_bias_traces_as_one_masked_by_is_causal(
    device_type: str,
) -> None:
    # "could not be traced" before, for either device: a search fell back to the fit
    biased = trace_step(BIASED, 8, device_type=device_type)
    assert biased.total_bytes == trace_step(CAUSAL, 8, device_type=device_type).total_bytes


def test_the_biased_trace_holds_a_real_step_of_the_model() -> None:
    torch.manual_seed(0)
    real = real_step_peak(AttendsBiased(), torch.randn(8, 128, WIDTH))
    assert trace_step(BIASED, 8).total_bytes == pytest.approx(real, rel=0.01)


def test_a_meta_forward_counts_the_biased_models_operations_as_the_causal_ones() -> None:
    # the coupling check's guard against a forward too large to run (None before: uncounted)
    from torch.utils.data import default_collate

    from autotune.search import coupled, meta_build

    def flops(spec: WorkloadSpec) -> int | None:
        batch = default_collate(list(meta_build.read_samples(spec, 2) or ()))
        built = meta_build.meta_model(spec.model)
        assert built is not None
        return coupled._meta_forward_flops(built[1], batch)

    assert flops(BIASED) == flops(CAUSAL) and flops(CAUSAL)
