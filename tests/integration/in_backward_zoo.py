"""Training loops whose optimizer steps inside backward, written as their sources
write them (NOT for optcheck): a character-level model trained on real text (the
standard library's ``textwrap.py``), predicting each byte from the four before it.

Contracts (:data:`CONTRACTS`):

- ``recipe`` / ``recipe-fused``: PyTorch's tutorial "How to save memory by fusing the
  optimizer step into the backward pass": ``{p: torch.optim.AdamW([p]) ...}``, each
  stepped and zeroed from its parameter's post-accumulate-grad hook; the Monitor
  is given that dict (``fused=True``: PyTorch's fused kernel, which bumps no version
  counter);
- ``torchtune``: torchtune's ``optimizer_in_bwd`` (``register_optim_in_bwd_hooks``
  and the ``OptimizerInBackwardWrapper`` keyed by parameter name, re-written here
  as torchtune's ``torchtune/training/memory.py`` has them: torchtune itself is not
  installed); the Monitor is given the wrapper;
- ``fused-hook`` / ``fused-hook-inplace``: a LOMO-style SGD update written in the
  test, inside a post-accumulate-grad hook, no ``step()`` anywhere: through
  ``p.data`` as LOMO writes it (no version bump), or in place under ``no_grad``;
- ``optimi`` / ``optimi-step`` / ``optimi-accumulation``: ``optimi.AdamW(...,
  gradient_release=True)`` and ``prepare_for_gradient_release`` as optimi's README
  shows: backward only; with the ``step()``/``zero_grad()`` an existing loop still
  calls; with gradient accumulation into the optimizer state over 4 micro-batches
  (``optimizer_accumulation``);
- ``lomo``: ``lomo_optim.Lomo(model, lr)`` and ``fused_backward(loss, lr)``.

``bug`` plants a fault in the user's own code (:data:`BUGS`), at step ``at``.
:func:`train` returns ``(losses, mon)``; the only optcheck line is marked ``# optcheck``.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

CONTEXT, BATCH, LR = 4, 32, 1e-2
CONTRACTS = ("recipe", "recipe-fused", "torchtune", "fused-hook", "fused-hook-inplace", "optimi", "optimi-step",
             "optimi-accumulation", "lomo")
#: bug -> what it does, before the forward of step ``at`` unless said otherwise
BUGS = {
    "layer-replaced": "model.head = nn.Linear(...): the optimizers hold the old head",
    "replaced-mid-step": "the head replaced between the forward and backward() of step `at`",
    "dtype-changed": "model.double() once the optimizer state exists",
    "no-zero-grad-in-hook": "the hook steps but never zero_grad(): gradients pile up (from step 1)",
    "hook-removed": "the head's step hooks removed (a 'freeze' that forgot requires_grad_(False))",
    "rebinding-update": "the fused hook writes `p = p - lr * g` (a new tensor bound to a local name; from step 1)",
    "no-release-hooks": "prepare_for_gradient_release never called: nothing steps (from step 1)",
    "unused-layer": "an auxiliary head in the optimizer that the forward never uses (from step 1)",
}


def text() -> torch.Tensor:
    raw = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_bytes()
    return torch.tensor(list(raw), dtype=torch.long)


class CharModel(nn.Module):
    def __init__(self, emb: int = 16, hidden: int = 64, aux: bool = False):
        super().__init__()
        self.emb = nn.Embedding(256, emb)
        self.fc = nn.Linear(CONTEXT * emb, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, 256)
        self.aux = nn.Linear(hidden, 8) if aux else None  # planned auxiliary head, never wired in

    def forward(self, x):
        h = self.emb(x).flatten(1)
        return self.head(torch.tanh(self.norm(self.fc(h))))


def batch(data: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    i = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=g)
    x = torch.stack([data[j:j + CONTEXT] for j in i.tolist()])
    return x, data[i + CONTEXT]


# -- PyTorch's recipe and torchtune's, as their sources write them -------------------------------
def recipe(model: nn.Module, fused: bool = False, zero_grad: bool = True) -> tuple[dict, dict]:
    """The tutorial: one AdamW per parameter, stepped from its post-accumulate-grad hook.
    Returns ``(optimizer_dict, hook handles by parameter)``."""
    optimizer_dict = {p: torch.optim.AdamW([p], lr=LR, foreach=False, fused=fused) for p in model.parameters()}

    def optimizer_hook(parameter) -> None:
        optimizer_dict[parameter].step()
        if zero_grad:
            optimizer_dict[parameter].zero_grad()

    handles = {p: p.register_post_accumulate_grad_hook(optimizer_hook) for p in model.parameters()}
    return optimizer_dict, handles


class OptimizerInBackwardWrapper:
    """torchtune's checkpoint wrapper (``torchtune/training/memory.py``): optimizers by parameter name."""

    def __init__(self, optim_map: dict):
        self.optim_map = optim_map

    def state_dict(self) -> dict:
        return {p: opt.state_dict() for p, opt in self.optim_map.items()}

    def get_optim_key(self, key: str):
        return list(self.optim_map.values())[0].param_groups[0][key]


def register_optim_in_bwd_hooks(model: nn.Module, optim_dict: dict) -> None:
    """torchtune's hook registration (``torchtune/training/memory.py``)."""

    def optim_step(param) -> None:
        optim_dict[param].step()
        optim_dict[param].zero_grad()

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(optim_step)


class FusedSGD(torch.optim.Optimizer):
    """A LOMO-style update written by hand: SGD applied in each parameter's
    post-accumulate-grad hook, the gradient freed at once; there is no ``step()``.
    ``write``: "data" (``p.data.add_``, as LOMO writes) or "inplace" (``p.add_`` under
    ``no_grad``); ``rebind``: the bug ``p = p - lr * g``."""

    def __init__(self, params, lr: float = LR, write: str = "data", rebind: bool = False):
        super().__init__(params, {"lr": lr})
        self.write, self.rebind = write, rebind
        for group in self.param_groups:
            for p in group["params"]:
                p.register_post_accumulate_grad_hook(self._update)

    def _update(self, p: torch.Tensor) -> None:
        lr = self.param_groups[0]["lr"]
        g, p.grad = p.grad, None  # the gradient is freed at once: LOMO's memory saving
        with torch.no_grad():
            if self.rebind:
                p = p - lr * g  # noqa: PLW2901 - the planted bug: a new tensor, the parameter never moves
            elif self.write == "data":
                p.data.add_(g, alpha=-lr)
            else:
                p.add_(g, alpha=-lr)


# -- the loop -------------------------------------------------------------------------------------
def train(contract: str, bug: str | None = None, at: int = 25, monitor: dict | None = None, steps: int = 40,
          seed: int = 0):
    """Train ``steps`` training steps under ``contract`` (micro-batches of accumulation
    included in one); ``monitor``: ``optcheck.Monitor`` keyword arguments (None: without
    optcheck). Returns ``(losses, mon)``; a RuntimeError the loop raised (a dtype change the
    optimizer cannot take) ends it early: the Monitor's ``with`` records it as the run's crash."""
    torch.manual_seed(seed)
    data, g = text(), torch.Generator().manual_seed(seed)
    model = CharModel(aux=bug == "unused-layer")
    handles: dict = {}
    if contract in ("recipe", "recipe-fused"):
        opt, handles = recipe(model, fused=contract == "recipe-fused", zero_grad=bug != "no-zero-grad-in-hook")
    elif contract == "torchtune":
        optim_dict = {p: torch.optim.AdamW([p], lr=LR) for p in model.parameters()}
        register_optim_in_bwd_hooks(model, optim_dict)
        opt = OptimizerInBackwardWrapper({n: optim_dict[p] for n, p in model.named_parameters()})
    elif contract.startswith("fused-hook"):
        opt = FusedSGD(model.parameters(), write="inplace" if contract.endswith("inplace") else "data",
                       rebind=bug == "rebinding-update")
    elif contract.startswith("optimi"):
        import optimi

        opt = optimi.AdamW(model.parameters(), lr=LR, gradient_release=True)
        if bug != "no-release-hooks":
            optimi.prepare_for_gradient_release(model, opt)
    elif contract == "lomo":
        import lomo_optim

        opt = lomo_optim.Lomo(model, lr=LR)
    else:
        raise ValueError(contract)
    losses: list[float] = []
    try:
        with _monitor(model, opt, monitor) as mon:
            for step in range(1, steps + 1):
                _step(contract, bug, step, at, model, opt, handles, data, g, losses)
    except RuntimeError:
        if monitor is None:
            raise  # (the Monitor's `with` recorded it as the run's crash)
    return losses, mon


def _monitor(model, opt, monitor):
    import contextlib

    if monitor is None:
        return contextlib.nullcontext(None)
    import optcheck

    return optcheck.Monitor(model, opt, **monitor)  # optcheck


def _step(contract, bug, step, at, model, opt, handles, data, g, losses) -> None:
    """One training step (``accumulate`` micro-batches under optimi's accumulation)."""
    accumulate = 4 if contract == "optimi-accumulation" else 1
    if step == at and bug == "layer-replaced":
        model.head = nn.Linear(64, 256)
    if step == at and bug == "dtype-changed":
        model.double()
    if step == at and bug == "hook-removed":
        handles[model.head.weight].remove()
        handles[model.head.bias].remove()
    for micro in range(accumulate):
        x, y = batch(data, g)
        loss = F.cross_entropy(model(x), y) / accumulate
        if step == at and bug == "replaced-mid-step" and micro == 0:
            model.head = nn.Linear(64, 256)  # after the forward, before backward()
        if contract == "optimi-accumulation":
            opt.optimizer_accumulation = micro != accumulate - 1
        if contract == "lomo":
            opt.fused_backward(loss, LR)
        else:
            loss.backward()
        if contract == "optimi-step":
            opt.step()
            opt.zero_grad()
    losses.append(loss.item() * accumulate)
