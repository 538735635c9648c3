"""A user's GPT training loop on a GPU, written the way nanoGPT and the Hugging Face
Trainer run it, with the precision, optimizer and compile options they take by default.

Used by ``tests/gpu/test_cuda.py`` (tiny sizes) and ``benchmarks/gpu_check.py`` (GPT-2
small). Nothing here reads a device value on the host inside the loop: batches are drawn
on the device, the losses stay there until the end (one read), and the step time is taken
with CUDA events (read at the end). The model is optcheck's nanoGPT-style GPT
(``optcheck.pytorch.gpt``), built like any user model; the only optcheck line is the
``Monitor`` (``monitor`` not None).

``bug`` plants one ordinary mistake at step ``bug_at``:

- ``nan-loss``: the loss multiplied by NaN at that step (OC501 at that step);
- ``no-zero-grad``: ``zero_grad()`` left out from that step on (OC204);
- ``keep-outputs``: every step's logits appended to a history list from that step on,
  graph and all (``history.append(logits)``, no ``.detach()``): device memory grows by a
  batch of logits a step (OC401 on ``device_allocated_bytes``), the host heap by the graph's
  nodes. (Keeping the *loss* is no device leak: ``backward()`` frees the saved tensors, and
  what stays is the graph's nodes on the host and a 0-d tensor; the first card run named
  that one on the malloc heap);
- ``param-rebind``: ``lm_head.weight`` replaced by a new Parameter after the optimizer
  was built (the optimizer updates the old one: OC101-family).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from optcheck.pytorch.gpt import GPT, GPTConfig

BUGS = ("nan-loss", "no-zero-grad", "keep-outputs", "param-rebind")

#: GPT-2 small: 12 layers, 12 heads, 768 wide, 1024 context, 50,257 tokens, tied head (124 M parameters)
GPT2_SMALL = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257)
TINY = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=256)


@dataclasses.dataclass
class Result:
    losses: list[float]
    step_ms: list[float]  # CUDA-event time of each step (empty on the CPU)
    total_ms: float | None  # CUDA-event time of all steps after ``warmup``
    mon: object | None
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer


def build(sizes: dict, device: str, optim: str = "fused", seed: int = 0):
    """The GPT on ``device`` and its AdamW: ``fused`` (CUDA's fused kernel), ``foreach`` or
    ``loop`` (one tensor at a time); nanoGPT's decay / no-decay groups."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**sizes)).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {"fused": True} if optim == "fused" else {"foreach": optim == "foreach"}
    return model, torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), **kw)


def train(*, sizes: dict = TINY, device: str = "cuda", steps: int = 30, batch: int = 8, optim: str = "fused",
          precision: str = "bf16", compile: bool = False, monitor: dict | None = None, bug: str | None = None,
          bug_at: int = 10, warmup: int = 0, seed: int = 0, model_opt=None) -> Result:
    """Train ``steps`` steps; ``precision`` "fp32", "bf16" (autocast) or "fp16" (autocast and
    ``GradScaler``); ``compile``: ``torch.compile`` (inductor) on the model; ``monitor``: the
    keyword arguments of ``optcheck.Monitor`` (None: no optcheck). ``model_opt``: a (model,
    optimizer) pair to train on (the benchmark's rounds reuse one)."""
    model, opt = model_opt or build(sizes, device, optim, seed)
    T, V = sizes["block_size"], sizes["vocab_size"]
    gen = torch.Generator(device=device).manual_seed(seed)
    fwd = torch.compile(model) if compile else model
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = (lambda: torch.autocast(torch.device(device).type, dtype=dtype)) if dtype else contextlib.nullcontext
    scaler = torch.amp.GradScaler(torch.device(device).type) if precision == "fp16" else None
    cuda = torch.device(device).type == "cuda"
    events = []
    history = []
    losses = []
    mon = None
    if monitor is not None:
        import optcheck

        mon = optcheck.Monitor(fwd, opt, **monitor)
    try:
        for step in range(1, steps + 1):
            if cuda:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                events.append(ev)
            x = torch.randint(0, V, (batch, T), device=device, generator=gen)
            y = torch.roll(x, -1, dims=1)
            if bug == "param-rebind" and step == bug_at:
                model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
            with autocast():
                logits, loss = fwd(x, y)
            if bug == "nan-loss" and step == bug_at:
                loss = loss * float("nan")
            if bug == "keep-outputs" and step >= bug_at:
                history.append(logits)  # outputs kept for later, graph and all: a batch of logits a step
            if scaler is not None:
                if mon is not None:
                    mon.step(loss)  # the unscaled loss (backward sees the scaled one)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            if not (bug == "no-zero-grad" and step >= bug_at):
                opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            events.append(ev)
            ev.synchronize()
    finally:
        if mon is not None:
            mon.close()
    step_ms = [a.elapsed_time(b) for a, b in zip(events, events[1:])]
    total = events[warmup].elapsed_time(events[-1]) if cuda and len(events) > warmup + 1 else None
    values = torch.stack([v.float() for v in losses]).tolist() if losses else []
    return Result(values, step_ms, total, mon, model, opt)
