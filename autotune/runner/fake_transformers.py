"""Hugging Face's causal masks, for the memory trace's fake tensors.

A decoder of ``transformers`` (Llama, Mistral, Qwen2, Gemma: ``masking_utils.create_causal_mask``)
builds no mask where it need not: SDPA's ``is_causal`` then masks, and a model with grouped
key/value heads passes ``enable_gqa`` rather than repeating its keys and values for every query
head. Without a key/value cache (``use_cache=False``: a training config's, or any checkpointed
run's, since checkpointing turns the cache off) it first asks whether the batch packs several
sequences into one row, by reading the position ids (``find_packed_sequence_indices``); a fake
tensor reads to it as a trace being compiled, whose values it cannot read, so it takes the
sequences as packed and builds the mask, and every layer then repeats its keys and values. A
real step, reading the positions the model made itself (0, 1, 2, ...), finds nothing packed and
builds none. Traced so, Llama-3-8B at 2,048 tokens held 256 MiB a layer more than its real step
at micro-batch 4, and checkpointing two of its 32 blocks read as costing memory.

While ``own_positions_unpacked(batch)`` is entered, positions the model made itself are taken as
a real step finds them: none packed. A batch that gives its own ``position_ids`` (packed
sequences, made by a collate function) keeps the library's answer, mask and all. Nothing is
imported here: where the model did not import ``transformers.masking_utils``, nothing is done.
``tests/runner/test_fake_transformers.py`` pins what is relied on.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

PACKING_CHECK = "find_packed_sequence_indices"
"""The function of ``transformers.masking_utils`` that reads the position ids for packing."""


@contextlib.contextmanager
def own_positions_unpacked(batch: Any) -> Iterator[None]:
    """Within it, ``transformers``' packing check answers "none packed" for fake position ids
    where ``batch`` gives none of its own (a mapping without ``position_ids``)."""
    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, PACKING_CHECK, None)
    given = isinstance(batch, Mapping) and "position_ids" in batch
    if original is None or given:
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensor  # imports torch

    def unpacked(position_ids: Any) -> Any:
        if isinstance(position_ids, FakeTensor):
            return None  # positions the model counted itself: one sequence a row
        return original(position_ids)

    setattr(masking, PACKING_CHECK, unpacked)
    try:
        yield
    finally:
        setattr(masking, PACKING_CHECK, original)
