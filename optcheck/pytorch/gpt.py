"""A nanoGPT-style decoder: the model every PyTorch soak trains.

Small classes in reading order (after karpathy/nanoGPT ``model.py``):
``LayerNorm``, ``CausalSelfAttention``, ``MLP``, ``Block``, ``GPTConfig``, ``GPT``.
Parameter names follow GPT-2's (``wte``, ``wpe``, ``h.N.ln_1``, ``h.N.attn.c_attn``,
``h.N.attn.c_proj``, ``h.N.ln_2``, ``h.N.mlp.c_fc``, ``h.N.mlp.c_proj``, ``ln_f``,
``lm_head``) without nanoGPT's ``transformer.`` prefix; the TorchSharp GPT in
``dotnet/`` uses the same names so runs align name by name.

Attention is written out (q·kᵀ/√d, causal mask buffer, softmax, ·v) rather than
``scaled_dot_product_attention``: TorchSharp 0.99 has no SDPA and the two backends
must compute the same thing (``docs/torchsharp.md``, "Parity with PyTorch").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm(nn.Module):
    """LayerNorm with plain ``Parameter`` fields and an optional bias (nanoGPT's own).

    Plain fields are the kind TorchSharp's ``Module.to(dtype)`` rebuilds as new
    non-leaf tensors (``docs/torchsharp.md``), so both backends carry the same trap.
    """

    def __init__(self, ndim: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: "GPTConfig"):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        mask = torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, config.block_size, config.block_size), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()  # batch, sequence length, embedding width
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: "GPTConfig"):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: "GPTConfig"):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


@dataclass
class GPTConfig:
    block_size: int = 64  # context length T
    vocab_size: int = 256  # byte tokens
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    dropout: float = 0.0  # 0 keeps backends and runs bit-comparable
    bias: bool = True  # biases in Linear and LayerNorm, like GPT-2
    tie_weights: bool = True  # lm_head and wte share one tensor (GPT-2)


class GPT(nn.Module):
    """Decoder-only transformer. ``forward(idx (B, T) int64, targets (B, T) | None)``
    returns ``(logits (B, T, vocab), loss scalar | None)``."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            # one tensor for input embedding and output head: the optimizer sees it once
            self.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.size()
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def configure_optimizers(self, lr: float, weight_decay: float, betas: tuple[float, float],
                             eps: float = 1e-8, fused: bool = False) -> torch.optim.AdamW:
        """AdamW with nanoGPT's groups: weight decay on tensors with ``dim() >= 2``
        (matmul weights, embeddings), none on biases and LayerNorm gains. Groups are
        built from ``named_parameters()`` so they carry ``param_names`` (torch ≥ 2.6)."""
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        decay = [(n, p) for n, p in named if p.dim() >= 2]
        no_decay = [(n, p) for n, p in named if p.dim() < 2]
        if _named_groups_supported():
            groups = [{"params": decay, "weight_decay": weight_decay},
                      {"params": no_decay, "weight_decay": 0.0}]
        else:
            groups = [{"params": [p for _, p in decay], "weight_decay": weight_decay},
                      {"params": [p for _, p in no_decay], "weight_decay": 0.0}]
        if fused:  # CUDA's fused kernel (the soak on a GPU; docs/gpu.md)
            return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=False)


def _named_groups_supported() -> bool:
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 6)
