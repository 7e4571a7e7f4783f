"""Hugging Face's causal masks, for the memory trace's fake tensors.

A decoder of ``transformers`` (Llama, Mistral, Qwen2, Gemma: ``masking_utils.create_causal_mask``)
builds no mask where it need not: SDPA's ``is_causal`` then masks, and a model with grouped
key/value heads passes ``enable_gqa`` rather than repeating its keys and values for every query
head. Whether it need not, it decides by reading values: an attention mask of ones (a tokenizer's,
with no padding) masks nothing, and, without a key/value cache (``use_cache=False``: a training
config's, or any checkpointed run's, since checkpointing turns the cache off), position ids that
count up in each row pack no second sequence into it. Before reading a tensor it asks
``is_tracing(tensor)``, which a fake tensor answers yes, as a compiler's trace whose values
cannot be read; so the trace built the mask a real step does not build, and every layer repeated
its keys and values. Traced so, a tiny grouped-query Llama held 8.3% more than its real step, and
Llama-3-8B at 2,048 tokens 256 MiB a layer more at micro-batch 4, where checkpointing two of its
32 blocks read as costing memory.

While ``values_read_where_known(shadows)`` is entered, a fake tensor whose values the trace knows
(``fake_shadows``: positions the model counted from constants, the batch's own attention mask)
is one the library may read, as a real step reads it; one whose values it does not know stays a
trace's, mask and all. Nothing is imported here: where the model did not import
``transformers.masking_utils``, nothing is done. ``tests/runner/test_fake_transformers.py`` pins
what is relied on.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

TRACING_CHECK = "is_tracing"
"""The name ``transformers.masking_utils`` asks before it reads a tensor's values."""


@contextlib.contextmanager
def values_read_where_known(shadows: Any) -> Iterator[None]:
    """Within it, ``transformers.masking_utils`` reads a fake tensor that has a shadow
    (``shadows``: ``fake_shadows.Shadows``) as it reads a real one."""
    from unittest import mock

    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, TRACING_CHECK, None)
    if original is None:
        yield
        return

    def is_tracing(tensor: Any = None) -> Any:
        if tensor is not None and shadows.get(tensor) is not None:
            return original()  # compiling or scripting still count; its values are known
        return original(tensor)

    with mock.patch.object(masking, TRACING_CHECK, is_tracing):
        yield
