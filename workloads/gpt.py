"""A GPT-style language model whose blocks live in an ``nn.ModuleList``, as in GPT-2.

``--model workloads.gpt:gpt_tiny`` (or gpt_small, gpt_medium, gpt2_124m). Batches are dicts
``{"input_ids", "labels"}`` passed as keyword arguments; the model returns an output with
``.loss`` and ``.logits``, like a Hugging Face model. Samples are tokenised from text on every
access by a word-level tokenizer in Python; ``tokenize_rounds`` scales that CPU cost.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 512
    seq_len: int = 64
    width: int = 64
    heads: int = 4
    layers: int = 4
    samples: int = 2048
    tokenize_rounds: int = 1


@dataclass
class LMOutput:
    loss: torch.Tensor
    logits: torch.Tensor


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.ln1 = nn.LayerNorm(config.width)
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        self.ln2 = nn.LayerNorm(config.width)
        self.fc = nn.Linear(config.width, 4 * config.width)
        self.out = nn.Linear(4 * config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        # Explicit attention (not the fused kernel): its seq x seq scores are the activations
        # that activation checkpointing exists to save.
        scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(batch, seq, width)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig | None = None) -> None:
        super().__init__()
        self.workload_config = config = config or GPTConfig()
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.positions = nn.Embedding(config.seq_len, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> LMOutput:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        loss = torch.zeros((), device=x.device)
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return LMOutput(loss=loss, logits=logits)


class TokenizedText(Dataset[dict[str, torch.Tensor]]):
    """Sentences drawn from a fixed vocabulary of words, tokenised on every access."""

    def __init__(self, config: GPTConfig, seed: int = 0) -> None:
        self.config = config
        rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(4000)]
        # word -> id for the most common words; the rest fall back to character ids
        self.word_ids = {w: 256 + i for i, w in enumerate(self.words[: config.vocab - 256])}

    def __len__(self) -> int:
        return self.config.samples

    def _tokenize(self, text: str) -> list[int]:
        ids: list[int] = []
        for word in text.split():
            token = self.word_ids.get(word)
            if token is None:
                ids.extend(ord(c) % 256 for c in word)
            else:
                ids.append(token)
        return ids

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        rng = random.Random(index)
        need = self.config.seq_len + 1
        text = " ".join(rng.choices(self.words, k=need))
        ids: list[int] = []
        for _ in range(max(1, self.config.tokenize_rounds)):
            ids = self._tokenize(text)
        tokens = torch.tensor(ids[:need], dtype=torch.long)
        return {"input_ids": tokens[:-1], "labels": tokens[1:]}


def autotune_dataset(model: GPT) -> TokenizedText:
    return TokenizedText(model.workload_config)


def gpt_tiny() -> GPT:
    return GPT(GPTConfig())


def gpt_small() -> GPT:
    """Long context for its width: activations dominate memory, as checkpointing needs."""
    return GPT(GPTConfig(vocab=1024, seq_len=256, width=128, heads=4, layers=6, samples=4096))


def gpt_long_context() -> GPT:
    """Narrow and long: attention scores dwarf the weights, so checkpointing shows clearly."""
    return GPT(GPTConfig(vocab=512, seq_len=512, width=64, heads=4, layers=6, samples=2048))


def gpt_medium() -> GPT:
    return GPT(GPTConfig(vocab=8192, seq_len=512, width=512, heads=8, layers=8, samples=16384))


def gpt2_124m() -> GPT:
    """GPT-2 small's shape, for a GPU: 124M parameters with GPT-2's tied head; 163M here, where
    the output head is a separate matrix (38.6M)."""
    return GPT(
        GPTConfig(vocab=50304, seq_len=1024, width=768, heads=12, layers=12, samples=200_000)
    )
