"""Hugging Face's causal masks in the memory trace (``fake_transformers``): a decoder builds the
mask its real step builds, no more, and what the shim relies on is pinned."""

from __future__ import annotations

import pytest
import torch

from autotune.bench.traced_step import real_batch_peak
from autotune.runner.fake_memory import trace_step
from autotune.runner.fake_shadows import Shadows
from autotune.runner.fake_transformers import TRACING_CHECK, values_read_where_known
from autotune.runner.workload import WorkloadSpec

masking = pytest.importorskip("transformers.masking_utils")

MODEL = "tests.fixtures.gqa_llama:llama"


@pytest.mark.parametrize("data", [None, "data_unpadded", "data_padded"])
def test_a_grouped_query_decoder_is_traced_with_the_mask_its_real_step_builds(
    data: str | None,
) -> None:
    # Without its cache (None: positions the model counts itself) or beside an attention mask
    # of ones, the library read the fake tensors as a compiler's trace and built a mask the
    # real step does not: each layer repeated its keys and values, 8.3% over the real step
    # here (Llama-3-8B at 2,048 tokens: 256 MiB a layer). With padding, both build it.
    spec = WorkloadSpec(model=MODEL, data=f"tests.fixtures.gqa_llama:{data}" if data else None)
    real = real_batch_peak(spec, 4)
    traced = trace_step(spec, 4).total_bytes
    assert abs(traced - real) / real < 0.01
    if data is None:  # checkpointing a block saves memory, as it does on the real step
        assert trace_step(spec, 4, checkpoint_segments=1).total_bytes < traced


def test_what_the_shim_relies_on() -> None:
    # The library asks is_tracing before it reads a tensor, and a fake tensor answers yes.
    # Should a transformers release read fake tensors otherwise, this says what to look at.
    from torch._subclasses.fake_tensor import FakeTensorMode

    check = getattr(masking, TRACING_CHECK)
    shadows, values = Shadows(), torch.ones(2, 8).numpy()
    with FakeTensorMode():
        known, unknown = torch.ones(2, 8), torch.ones(2, 8)
        assert shadows.seed(known, values, "made")
        assert check(known) and check(unknown)
        with values_read_where_known(shadows):
            assert not getattr(masking, TRACING_CHECK)(known)  # its values: the shadow's
            assert getattr(masking, TRACING_CHECK)(unknown)  # a trace's, mask and all
    assert getattr(masking, TRACING_CHECK) is check  # put back
