"""Hugging Face models of seventeen families and a speech recogniser's CTC head
(tests/fixtures/hf_zoo.py): each one's repeated blocks are found and its training step is
traced under fake tensors, at a real step's peak, or it says in one line why not."""

from __future__ import annotations

import pytest

from autotune.bench.traced_step import real_batch_peak
from autotune.runner.blocks import block_classes, find_repeated_blocks
from autotune.runner.fake_memory import TraceError, trace_step
from autotune.runner.workload import WorkloadSpec, load_model
from tests.fixtures.hf_zoo import FAMILIES

pytest.importorskip("transformers")

BLOCKS = {
    "qwen2": "Qwen2DecoderLayer", "gpt_neox": "GPTNeoXLayer", "roberta": "RobertaLayer",
    "distilbert": "TransformerBlock", "bart": "BartEncoderLayer,BartDecoderLayer",
    "t5": "T5Block", "whisper": "WhisperEncoderLayer,WhisperDecoderLayer", "vit": "ViTLayer",
    "swin": "SwinStage", "clip": "CLIPEncoderLayer", "wav2vec2": "Wav2Vec2EncoderLayer",
    "wav2vec2_ctc": "Wav2Vec2EncoderLayer", "longformer": "LongformerSelfAttention",
    "mistral": "MistralDecoderLayer", "gpt2": "GPT2Block", "mamba": "MambaBlock",
    "convnext": "ConvNextStage", "deberta_v2": "DebertaV2Layer",
}  # fmt: skip
"""Each family's blocks: those its ``_no_split_modules`` declares, both stacks of an
encoder-decoder (Swin declares its stages)."""
TRACE_STOPS: dict[str, str] = {}
"""Families whose step cannot be traced, and the one line that says why. (Wav2Vec2 was one
until its LayerDrop and SpecAugment were traced, DeBERTa-v2 until the rows its loss keeps by
their labels were, Wav2Vec2's CTC head until its labels' check, their mask and CTC's table of
the longest target were: ``autotune.runner.fake_routing``; Longformer until the values of the
mask it builds were: ``autotune.runner.fake_shadows``.)"""


def _spec(family: str) -> WorkloadSpec:
    return WorkloadSpec(
        model=f"tests.fixtures.hf_zoo:{family}", data=f"tests.fixtures.hf_zoo:data_{family}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_its_blocks_and_a_traced_step(family: str) -> None:
    _, model = load_model(_spec(family).model)
    blocks = find_repeated_blocks(model)
    assert block_classes(blocks) == BLOCKS[family]
    if family in TRACE_STOPS:
        with pytest.raises(TraceError, match=TRACE_STOPS[family]):
            trace_step(_spec(family), 4, "bf16", len(blocks))
        return
    fp32 = trace_step(_spec(family), 4)
    checkpointed = trace_step(_spec(family), 4, "bf16", len(blocks))  # T5: its cache off
    assert fp32.parameters_bytes == sum(
        t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())
    )
    assert 0 < checkpointed.total_bytes < fp32.total_bytes
    # and the trace is a real step's peak (BART and Swin within 0.6%: a transient or two)
    assert fp32.total_bytes == pytest.approx(real_batch_peak(_spec(family), 4), rel=0.01)
