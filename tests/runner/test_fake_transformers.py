"""Hugging Face's causal masks in the memory trace (``fake_transformers``): a decoder without its
key/value cache is traced as its real step runs, and what the shim relies on is pinned."""

from __future__ import annotations

import pytest
import torch

from autotune.bench.traced_step import real_batch_peak
from autotune.runner.fake_memory import trace_step
from autotune.runner.fake_transformers import PACKING_CHECK, own_positions_unpacked
from autotune.runner.workload import WorkloadSpec

masking = pytest.importorskip("transformers.masking_utils")

LLAMA = WorkloadSpec(model="tests.fixtures.gqa_llama:llama")


def test_a_grouped_query_decoder_without_its_cache_is_traced_as_its_real_step_runs() -> None:
    # Traced 8.3% over its real step: the packing check took the fake positions as packed, a
    # mask was built, and each layer repeated its keys and values (Llama-3-8B at 2,048 tokens:
    # 256 MiB a layer), so checkpointing two of its blocks read as costing memory.
    real = real_batch_peak(LLAMA, 4)
    traced = trace_step(LLAMA, 4).total_bytes
    assert abs(traced - real) / real < 0.01
    assert trace_step(LLAMA, 4, checkpoint_segments=1).total_bytes < traced


def test_what_the_shim_relies_on() -> None:
    # The packing check reads a fake tensor as a trace: its positions taken as packed. Should a
    # transformers release answer None for them, the shim has nothing left to do.
    from torch._subclasses.fake_tensor import FakeTensorMode

    check = getattr(masking, PACKING_CHECK)
    assert check(torch.arange(8)[None]) is None  # a real step's own positions: none packed
    with FakeTensorMode():
        positions = torch.arange(8)[None]
        assert check(positions) is not None
        with own_positions_unpacked({"input_ids": positions}):
            assert getattr(masking, PACKING_CHECK)(positions) is None
    assert getattr(masking, PACKING_CHECK) is check  # put back


def test_a_batch_that_gives_its_own_positions_keeps_the_librarys_answer() -> None:
    # Packed sequences come with the positions a collate function made: the mask is theirs.
    check = getattr(masking, PACKING_CHECK)
    with own_positions_unpacked({"input_ids": torch.ones(2), "position_ids": torch.ones(2)}):
        assert getattr(masking, PACKING_CHECK) is check
