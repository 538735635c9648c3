"""The autograd seed failures 000–004 (listed in ``optcheck/scenarios.py``) as scenarios
``--inject NAME@STEP`` can plant.

Each ``fn(trainer, step) -> {"call": ...}`` changes the running
:class:`optcheck.pytorch.train.Trainer` from that step on the way the real bug
changes a training loop: module ``forward`` methods replaced on the instance,
or ``trainer.extra_forward`` hooks ``f(trainer, logits, loss) -> loss``. The
``without_optcheck`` outcome of each is measured by
``tests/integration/test_seeds_pytorch.py`` (hazard probes off).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from optcheck.pytorch.scenario_registry import implements


# -- kv-cache-inplace (seed 000) -------------------------------------------------
def _attention_with_kv_cache(attn, model):
    """litgpt-style attention: k and v go into a per-batch KV cache with
    ``index_copy_`` at ``model.input_pos``, and attention reads the whole cache."""

    def forward(x):
        B, T, C = x.size()
        nh, hs = attn.n_head, C // attn.n_head
        q, k, v = attn.c_attn(x).split(attn.n_embd, dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nh, hs).transpose(1, 2)
        v = v.view(B, T, nh, hs).transpose(1, 2)
        input_pos = model.input_pos
        cache_k, cache_v = attn.kv_cache  # (B, nh, S, hs)
        k = cache_k.index_copy_(2, input_pos, k)  # the KV-cache update of a decode step, in place
        v = cache_v.index_copy_(2, input_pos, v)
        S = k.size(2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, S)
        allowed = attn.mask.index_select(2, input_pos)[:, :, :, :S]  # (1, 1, T, S)
        att = F.softmax(att.masked_fill(~allowed, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return attn.resid_dropout(attn.c_proj(y))

    return forward


def _gpt_forward_with_kv_cache(model):
    """A training forward that runs the sequence as prefill (tokens 0..T-2) plus one
    decode step (token T-1) through the KV cache, advancing ``input_pos`` in place
    afterwards as a generation loop does (``input_pos.add_(1)``)."""

    def forward(idx, targets=None):
        B, T = idx.size()
        for block in model.h:  # a fresh cache per batch (litgpt: set_kv_cache)
            a = block.attn
            shape = (B, a.n_head, T, a.n_embd // a.n_head)
            a.kv_cache = (torch.zeros(shape, device=idx.device), torch.zeros(shape, device=idx.device))
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # on CUDA: seed 000's torch.cuda.LongTensor
        tok = model.drop(model.wte(idx) + model.wpe(pos))  # (B, T, C)
        model.input_pos = torch.arange(T - 1, device=idx.device)  # prefill
        x1 = tok[:, : T - 1]
        for block in model.h:
            x1 = block(x1)
        model.input_pos = input_pos = torch.tensor([T - 1], device=idx.device)  # decode the last token
        x2 = tok[:, T - 1:]
        for block in model.h:
            x2 = block(x2)
        input_pos.add_(1)  # next position, ready for the next token
        logits = model.lm_head(model.ln_f(torch.cat([x1, x2], dim=1)))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    return forward


@implements("kv-cache-inplace")
def kv_cache_inplace(trainer, step: int) -> dict:
    model = trainer.model
    for block in model.h:
        block.attn.forward = _attention_with_kv_cache(block.attn, model)
    model.forward = _gpt_forward_with_kv_cache(model)
    return {"call": "training forward with input_pos: k = cache_k.index_copy_(2, input_pos, k) in every "
                    "attention, then input_pos.add_(1)"}


# -- mask-inplace (seed 001) -----------------------------------------------------
def _attention_with_shared_mask(attn, model):
    """Attention whose probabilities are multiplied by a cached float mask shared by
    every layer (``model.mask_cache``, (1, 1, T, T)); after use the layer re-applies
    the causal pattern to the cache in place (``masked_fill_``, idempotent, so it
    looks harmless), ready for the next layer."""

    def forward(x):
        B, T, C = x.size()
        nh, hs = attn.n_head, C // attn.n_head
        q, k, v = attn.c_attn(x).split(attn.n_embd, dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)
        k = k.view(B, T, nh, hs).transpose(1, 2)
        v = v.view(B, T, nh, hs).transpose(1, 2)
        causal = attn.mask[:, :, :T, :T]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~causal, float("-inf"))
        keep = model.mask_cache[:, :, :T, :T]  # cached float mask, saved for backward by the product below
        att = F.softmax(att, dim=-1) * keep
        keep.masked_fill_(~causal, 0.0)  # refresh the cached mask in place for the next layer
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return attn.resid_dropout(attn.c_proj(y))

    return forward


def _checkpointed(block, use_reentrant: bool = True):
    """Gradient checkpointing as HF ``gradient_checkpointing_enable()`` did it by default:
    the block's forward re-run in backward (``use_reentrant=True``; ``False`` is the form
    PyTorch now recommends, which runs on saved-tensor hooks of its own)."""
    inner = block.forward

    def forward(x):
        return torch.utils.checkpoint.checkpoint(inner, x, use_reentrant=use_reentrant)

    return forward


@implements("mask-inplace")
def mask_inplace(trainer, step: int, use_reentrant: bool = True) -> dict:
    model = trainer.model
    T = model.config.block_size
    dev = model.wte.weight.device
    model.register_buffer("mask_cache", torch.tril(torch.ones(T, T, device=dev)).view(1, 1, T, T), persistent=False)
    for block in model.h:
        block.attn.forward = _attention_with_shared_mask(block.attn, model)
        block.forward = _checkpointed(block, use_reentrant)
    return {"call": "att = softmax(att) * mask_cache; mask_cache.masked_fill_(~causal, 0.0) in every attention, "
                    f"blocks under torch.utils.checkpoint(use_reentrant={use_reentrant})"}


# -- fp32-cast-nograd (seed 002) ---------------------------------------------------
def _norm_fp32_nograd(ln):
    """Qwen2RMSNorm-style: normalise in float32 "for stability", but the cast and the
    normalisation run where autograd is not recording."""

    def forward(x):
        input_dtype = x.dtype
        with torch.no_grad():
            h = x.to(torch.float32)  # seed 002: this came out with requires_grad=False
            h = F.layer_norm(h, ln.weight.shape, ln.weight, ln.bias, 1e-5)
        return h.to(input_dtype)

    return forward


@implements("fp32-cast-nograd")
def fp32_cast_nograd(trainer, step: int) -> dict:
    model = trainer.model
    norms = [b.ln_1 for b in model.h] + [b.ln_2 for b in model.h] + [model.ln_f]
    for ln in norms:
        ln.forward = _norm_fp32_nograd(ln)
    return {"call": f"every LayerNorm ({len(norms)}): with torch.no_grad(): h = x.to(torch.float32); "
                    f"h = layer_norm(h, ...)"}


# -- detached-loss (seed 004) --------------------------------------------------------
@implements("detached-loss")
def detached_loss(trainer, step: int) -> dict:
    model = trainer.model
    inner = model.forward

    def forward(idx, targets=None):
        with torch.no_grad():  # the training step runs without grad recording (Lightning 2.0.3 + HF T5)
            return inner(idx, targets)

    model.forward = forward
    return {"call": "model forward (logits and loss) run under torch.no_grad() although every parameter "
                    "requires grad"}


# -- nonleaf-grad-read (seed 003's warning) ----------------------------------------------
def _read_logits_grad(trainer, logits, loss):
    g = logits.grad  # logging the logits' gradient: a non-leaf tensor, always None (and a UserWarning)
    trainer.last_logits_grad = g
    return loss


@implements("nonleaf-grad-read")
def nonleaf_grad_read(trainer, step: int) -> dict:
    trainer.extra_forward.append(_read_logits_grad)
    return {"call": "logits.grad read every step (logits is not a leaf)"}
