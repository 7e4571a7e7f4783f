"""A sparse mixture-of-experts decoder written by hand, Mixtral's way: each token routed to two of
eight experts (``torch.topk``), each expert's tokens gathered with ``torch.where`` and added
back with ``index_add_``, a load-balancing auxiliary loss, a dict output with ``loss``.
``--model examples/moe.py:MoEDecoder`` (about 8.5M parameters, 128-token sequences)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

VOCAB, SEQ, DIM, HEADS, EXPERTS, TOP_K, LAYERS = 2048, 128, 192, 4, 8, 2, 4


class Expert(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


class SparseMoE(nn.Module):
    def __init__(self, dim: int, n_experts: int, top_k: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim, 2 * dim) for _ in range(n_experts))
        self.top_k = top_k
        self.aux_loss = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        flat = x.reshape(-1, d)
        logits = self.gate(flat)
        probs = F.softmax(logits, dim=-1, dtype=torch.float)
        weights, selected = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        # load balancing (Switch Transformer): fraction routed times mean probability
        mask = F.one_hot(selected, len(self.experts)).sum(dim=1).float()
        self.aux_loss = len(self.experts) * (mask.mean(0) * probs.mean(0)).sum()
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(selected == e)
            if token.numel() == 0:
                continue
            y = expert(flat[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out.reshape(b, s, d)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(DIM)
        self.moe = SparseMoE(DIM, EXPERTS, TOP_K)

    def forward(self, x: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        out: torch.Tensor = x + self.moe(self.ln2(x))
        return out


class MoEDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(SEQ, DIM))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        s = input_ids.shape[1]
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool, device=input_ids.device), 1)
        x = self.embed(input_ids) + self.pos[:s]
        for block in self.blocks:
            x = block(x, causal)
        logits = self.head(self.norm(x))
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
        aux = sum(block.moe.aux_loss for block in self.blocks if isinstance(block, Block))
        return {"loss": ce + 0.01 * aux, "logits": logits}


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 2048

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


autotune_dataset = Tokens
autotune_global_batch_size = 32
