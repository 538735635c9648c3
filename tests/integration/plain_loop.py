"""A plain nanoGPT-style training loop, written the ordinary way and NOT for optcheck:
a byte-level transformer (``nn.TransformerEncoderLayer`` with a causal mask, tied
embedding/head) trained with AdamW on a real text file. ``bug=`` plants one
ordinary mistake. The only optcheck lines are the three marked ``# optcheck``.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyLM(nn.Module):
    def __init__(self, vocab=256, d=32, ctx=32, layers=1, unused_head=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([nn.TransformerEncoderLayer(d, 2, 4 * d, dropout=0.0, batch_first=True)
                                     for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        if unused_head:
            self.aux = nn.Linear(d, vocab)  # defined, never called
        self.register_buffer("causal", torch.triu(torch.full((ctx, ctx), float("-inf")), 1), persistent=False)
        self.detach_middle = False
        self.inplace_sigmoid = False

    def forward(self, idx):
        T = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(T))
        for blk in self.blocks:
            x = blk(x, src_mask=self.causal[:T, :T], is_causal=True)
            if self.detach_middle:
                x = x.detach()
        if self.inplace_sigmoid:
            g = torch.sigmoid(x)
            g.mul_(2.0)  # sigmoid saved its output for backward
            x = x * g
        return self.head(self.norm(x))


def text_tokens() -> torch.Tensor:
    raw = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_bytes()
    return torch.tensor(list(raw), dtype=torch.long)


def train(bug: str | None = None, steps: int = 60, monitor_kwargs: dict | None = None, seed: int = 0):
    """Train; return (losses, monitor). ``monitor_kwargs=None`` runs without optcheck."""
    torch.manual_seed(seed)
    data = text_tokens()
    model = TinyLM(unused_head=(bug == "unused-layer"))
    params = list(model.blocks.parameters()) if bug == "partial-optimizer" else model.parameters()
    lr = 1e4 if bug == "lr-explodes" else 3e-3
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    mon = None
    if monitor_kwargs is not None:
        import optcheck
        mon = optcheck.Monitor(model, opt, **monitor_kwargs)  # optcheck
    history = []
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        ix = torch.randint(0, data.numel() - 33, (8,), generator=g)
        x = torch.stack([data[i:i + 32] for i in ix])
        y = torch.stack([data[i + 1:i + 33] for i in ix])
        if bug == "param-replaced" and step == 20:
            model.norm.weight = nn.Parameter(torch.ones(32))
        if bug == "detach-middle" and step == 10:
            model.detach_middle = True
        if bug == "inplace-saved" and step == 10:
            model.inplace_sigmoid = True
        if bug != "no-zero-grad":
            opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        if bug == "loss-no-grad" and step == 10:
            with torch.no_grad():
                loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        if bug == "zero-grad-before-step":
            opt.zero_grad()
        if bug == "nonleaf-grad-read":
            _ = logits.grad
        if bug != "no-optimizer-step":
            opt.step()
        if bug == "double-step":
            opt.step()
        history.append(loss.item())
    if mon is not None:
        mon.close()  # optcheck
    return history, mon
