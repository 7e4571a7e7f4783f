"""Hugging Face models built from their configs (no download), for trying autotune on models
nobody here wrote: ``--model examples/hf_models.py:gpt2_small`` (``gpt2_small_1k`` on
1,024-token sequences; also ``bert_base``, ``llama_small``, and the ``_tiny`` sizes for a quick
look; ``mixtral_tiny``, a mixture of experts). Needs the ``trainers`` extra
(``pip install -e ".[trainers]"``, which brings transformers).

Batches are dicts of random token ids passed as keyword arguments with ``labels``, so each
model returns its own ``.loss``: the speed and memory of training, not of learning anything.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

SEQ_LEN = 256


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Random token ids and labels of one sequence length, generated per sample."""

    def __init__(self, vocab: int, seq_len: int = SEQ_LEN, samples: int = 4096) -> None:
        self.vocab, self.seq_len, self.samples = vocab, seq_len, samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(
            0, self.vocab, (self.seq_len,), generator=torch.Generator().manual_seed(index)
        )
        return {"input_ids": ids, "labels": ids.clone()}


def autotune_dataset(model: Any) -> Tokens:
    return Tokens(model.config.vocab_size, getattr(model, "autotune_seq_len", SEQ_LEN))


def gpt2_small() -> Any:
    """GPT-2 small (124M), the library's own attention (PyTorch's fused SDPA kernels)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(attn_implementation="sdpa"))  # type: ignore[call-arg]


def gpt2_small_1k() -> Any:
    """GPT-2 small on sequences of its full context, 1,024 tokens: the shape of llm.c's GPT-2
    small run (modded-nanogpt ``records/track_1_short/2024-10-13_llmc``), for comparing
    tokens per second with it."""
    model = gpt2_small()
    model.autotune_seq_len = model.config.n_positions
    return model


def gpt2_tiny() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    # GPT-2's token ids 50256 lie outside this vocabulary (transformers warns on each build)
    config = GPT2Config(
        n_layer=4, n_head=4, n_embd=256, vocab_size=8192, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config)


def bert_base() -> Any:
    """BERT base (110M) with its masked-language-model head."""
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig())


def bert_tiny() -> Any:
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(
        BertConfig(
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=1024,
            vocab_size=8192,
        )
    )


def llama_small() -> Any:
    """A Llama of about 200M parameters: 12 layers of width 1024, grouped-query attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=12,
            num_attention_heads=16,
            num_key_value_heads=4,
            vocab_size=32000,
        )
    )


def llama_tiny() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            hidden_size=256,
            intermediate_size=704,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=8192,
        )
    )


def mixtral_tiny(experts: str = "grouped_mm") -> Any:
    """A mixture of eight experts, two per token, in two layers. Its experts multiply with
    ``torch._grouped_mm`` (Hugging Face's default), or with ``experts="eager"`` loop over the
    experts, routing tokens with ``torch.where`` (``mixtral_tiny_eager``)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    model = MixtralForCausalLM(
        MixtralConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=8,
            num_experts_per_tok=2,
            vocab_size=512,
        )
    )
    model.config._experts_implementation = experts
    return model


def mixtral_tiny_eager() -> Any:
    return mixtral_tiny("eager")
