"""Training loops over every ``torch.optim`` optimizer, written as a user writes
them (NOT with optcheck's GPT or helpers): a small regression MLP with a
LayerNorm, synthetic data, ``zero_grad`` / forward / ``backward`` / ``step``.

:func:`train` runs one optimizer with one implementation flag (for-loop,
``foreach=True``, ``fused=True``, ``capturable=True``), plus the odd ones:
``LBFGS`` with its closure, ``SparseAdam`` on sparse embedding gradients, a
``ZeroRedundancyOptimizer`` in a one-process gloo group, updates written by hand
under ``torch.no_grad()``, bf16 parameters, a learning-rate warm-up from 0. The
only optcheck line is marked ``# optcheck``. ``bug`` plants a stalled update:

- ``"rebinding-step"``: a hand-written optimizer that computes ``p = p - lr * g``
  (a new tensor bound to a local name: the parameter never changes);
- ``"scaler-always-inf"``: a ``GradScaler`` that finds inf gradients at every step
  in front of a fused AdamW (the fused kernel is called and skips the update).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from process_group import one_process_group

# name -> (constructor keyword arguments, implementation flags torch.optim accepts for it)
OPTIMIZERS = {
    "SGD": ({"lr": 0.05, "momentum": 0.9}, ("for-loop", "foreach", "fused")),
    "SGD-plain": ({"lr": 0.05}, ("for-loop", "foreach", "fused")),
    "Adam": ({"lr": 1e-2}, ("for-loop", "foreach", "fused", "capturable")),
    "AdamW": ({"lr": 1e-2, "weight_decay": 0.1}, ("for-loop", "foreach", "fused", "capturable")),
    "Adagrad": ({"lr": 0.05}, ("for-loop", "foreach", "fused")),
    "Adadelta": ({"lr": 1.0}, ("for-loop", "foreach", "capturable")),
    "Adamax": ({"lr": 1e-2}, ("for-loop", "foreach", "capturable")),
    "ASGD": ({"lr": 0.05}, ("for-loop", "foreach", "capturable")),
    "NAdam": ({"lr": 1e-2}, ("for-loop", "foreach", "capturable")),
    "RAdam": ({"lr": 1e-2}, ("for-loop", "foreach", "capturable")),
    "RMSprop": ({"lr": 1e-3}, ("for-loop", "foreach", "capturable")),
    "Rprop": ({"lr": 1e-3}, ("for-loop", "foreach", "capturable")),
    "Adafactor": ({"lr": 1e-2}, ("for-loop", "foreach")),
}
FLAG_KWARGS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True},
               "capturable": {"capturable": True}}


def _monitor(model, opt, monitor):
    if monitor is None:
        return contextlib.nullcontext(None)
    import optcheck

    return optcheck.Monitor(model, opt, **monitor)  # optcheck


class Regressor(nn.Module):
    def __init__(self, n_in=16, hidden=32, n_out=4, bias=True):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden, bias=bias)
        self.norm = nn.LayerNorm(hidden, bias=bias)
        self.fc2 = nn.Linear(hidden, n_out, bias=bias)

    def forward(self, x):
        return self.fc2(torch.tanh(self.norm(self.fc1(x))))


def data(n=512, n_in=16, n_out=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n_in, generator=g)
    w = torch.randn(n_in, n_out, generator=g) / 4
    return x, torch.sin(x @ w)


def make_optimizer(name: str, flag: str, params):
    """``torch.optim.<name>(params, **defaults, **flag)``; "SGD-plain" is SGD without
    momentum (no optimizer state at all). Raises what torch raises for a flag it
    refuses (``capturable=True`` on CPU)."""
    kwargs, _ = OPTIMIZERS[name]
    cls = getattr(torch.optim, name.split("-")[0])
    return cls(params, **kwargs, **FLAG_KWARGS[flag])


def _fit(model, opt, x, y, monitor, steps, scaler=None, sched=None):
    """The plain regression loop the optimizers here run: batches of 64, MSE,
    ``zero_grad`` / ``backward`` / ``step`` (through a ``GradScaler`` when given),
    then the LR scheduler's step; returns (losses, the Monitor or None)."""
    losses = []
    with _monitor(model, opt, monitor) as mon:
        for _ in range(steps):
            idx = torch.randint(0, len(x), (64,))
            opt.zero_grad()
            loss = F.mse_loss(model(x[idx]), y[idx])
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            if sched is not None:
                sched.step()
            losses.append(loss.item())
    return losses, mon


def train(name="AdamW", flag="for-loop", bug=None, monitor=None, steps=120, seed=0, dtype=torch.float32,
          warmup=None):
    """One optimizer, one implementation flag. ``warmup``: "linear" (lr from 0 over
    the first 100 steps, ``LambdaLR``) or "delayed" (lr 0 for 30 steps, then on).
    Returns ``(losses, mon)``."""
    torch.manual_seed(seed)
    x, y = data(seed=seed)
    model = Regressor().to(dtype)
    x, y = x.to(dtype), y.to(dtype)
    if bug == "scaler-always-inf":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        scaler = torch.amp.GradScaler("cpu", init_scale=float("inf"))  # a scale that every step finds inf with
    else:
        opt = make_optimizer(name, flag, model.parameters())
        scaler = None
    sched = None
    if warmup == "linear":
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 100))
    elif warmup == "delayed":
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.0 if s < 30 else 1.0)
    return _fit(model, opt, x, y, monitor, steps, scaler=scaler, sched=sched)


def train_lbfgs(monitor=None, steps=120, seed=0):
    """Full-batch LBFGS with a closure (several forward/backward per ``step``)."""
    torch.manual_seed(seed)
    x, y = data(seed=seed)
    model = Regressor()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=2, history_size=10)
    losses = []
    with _monitor(model, opt, monitor) as mon:
        for _ in range(steps):
            def closure():
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                return loss

            losses.append(opt.step(closure).item())
    return losses, mon


class Bag(nn.Module):
    """Embedding bag regression with sparse gradients (SparseAdam needs them)."""

    def __init__(self, n_items=200, dim=8):
        super().__init__()
        self.emb = nn.Embedding(n_items, dim, sparse=True)

    def forward(self, idx):
        return self.emb(idx).sum(-1)


def train_sparse_adam(monitor=None, steps=120, seed=0):
    """SparseAdam: each step touches only the rows in its batch."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(200, generator=g)
    model = Bag()
    opt = torch.optim.SparseAdam(model.parameters(), lr=0.05)
    losses = []
    with _monitor(model, opt, monitor) as mon:
        for _ in range(steps):
            idx = torch.randint(0, 200, (32,), generator=g)
            opt.zero_grad()
            loss = F.mse_loss(model(idx), target[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, mon




def train_muon(monitor=None, steps=120, seed=0):
    """Muon (2-D parameters only): a bias-free MLP without LayerNorm."""
    torch.manual_seed(seed)
    x, y = data(seed=seed)
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.Tanh(), nn.Linear(32, 4, bias=False))
    opt = torch.optim.Muon(model.parameters(), lr=0.02)
    return _fit(model, opt, x, y, monitor, steps)


def train_zero(monitor=None, steps=120, seed=0):
    """``ZeroRedundancyOptimizer`` over AdamW, one rank (a single-GPU debug run of a DDP script)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.manual_seed(seed)
    x, y = data(seed=seed)
    with one_process_group():
        model = Regressor()
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
        return _fit(model, opt, x, y, monitor, steps)


class ByHand(torch.optim.Optimizer):
    """A hand-written SGD, as in tutorials; ``style`` is how the update is written:
    "add" (``p.add_(g, alpha=-lr)``), "copy" (``p.copy_(p - lr * g)``), "data"
    (``p.data -= lr * g``: its own version counter, the values move), or the bug
    "rebinding" (``p = p - lr * g``: a new tensor bound to a local name)."""

    def __init__(self, params, lr=0.05, style="add"):
        super().__init__(params, {"lr": lr})
        self.style = style

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if self.style == "add":
                    p.add_(p.grad, alpha=-group["lr"])
                elif self.style == "copy":
                    p.copy_(p - group["lr"] * p.grad)
                elif self.style == "data":
                    p.data -= group["lr"] * p.grad
                else:
                    p = p - group["lr"] * p.grad  # noqa: PLW2901 - the planted bug
        return None


def train_by_hand(style="add", monitor=None, steps=120, seed=0):
    """Updates written by hand under ``torch.no_grad()`` (see :class:`ByHand`)."""
    torch.manual_seed(seed)
    x, y = data(seed=seed)
    model = Regressor()
    opt = ByHand(model.parameters(), lr=0.05, style=style)
    return _fit(model, opt, x, y, monitor, steps)
