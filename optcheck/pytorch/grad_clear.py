"""Gradient flow between optimizer steps (the probe behind OC204, OC207, OC208).

Tensor hooks on the optimizer's parameters (``Tensor.register_hook``: called
with the incoming gradient *before* it is accumulated into ``.grad``) record
which parameters received a fresh gradient since the last ``optimizer.step()``;
optimizer step pre/post hooks (torch ≥ 2.0) look at that once per step:

- ``grad_not_cleared`` (OC204): the first gradient after a step found ``.grad``
  still holding the previous step's (no ``zero_grad()``), and no later gradient
  before the next step found it cleared. Checked on the smallest parameter: one
  ``any()`` over a bias-sized tensor per ``backward()`` until it is settled. The
  second condition keeps GAN loops silent when the discriminator is watched: the
  generator's ``backward()`` flows through D right after ``optimizerD.step()``,
  and ``netD.zero_grad()`` clears that before D's own ``backward()`` (the PyTorch
  DCGAN tutorial's order).
- ``grad_cleared_before_step`` (OC207): gradients flowed in, but by
  ``optimizer.step()`` every parameter that got one has ``.grad`` None or all
  zero (the smallest is looked at first; the others only when it is zero):
  ``zero_grad()`` ran between ``backward()`` and ``step()``.
- ``stale_grad_step`` (OC208): ``optimizer.step()`` ran although no gradient
  flowed in since the previous step while ``.grad`` is set: the same gradients are
  applied twice (``step()`` called twice, or ``backward()`` skipped).

Gradient accumulation over micro-batches and closures (LBFGS) stay silent. Cost:
one Python call per parameter per backward (~2 µs each) and a few checks per
step. An event is recorded at its first occurrence (``step``); from then on
``count`` is the number of optimizer steps at which it happened and
``detail["steps"]`` the number of optimizer steps checked since (both counting
the first). Every later :meth:`drain` hands the event again with its running
numbers, so each snapshot carries them; only a new kind makes :meth:`has_events`
true (the immediate snapshot).
"""

from __future__ import annotations

import torch


class GradClearProbe:
    """Records gradient-flow events for ``optimizer``'s parameters (see module docstring).

    Args:
        optimizer: the optimizer whose ``step()`` delimits training steps.
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.events: list[dict] = []  # kinds first seen since the last drain()
        self._by_kind: dict[str, dict] = {}  # every kind seen, with running numbers
        self._fresh: set[int] = set()
        self._first = False  # the first gradient after a step is still to come
        self._stale = False  # that first gradient found .grad holding the previous step's; no clear seen since
        self._steps = 0
        self._handles = []
        self._params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad and p.is_leaf
                        and not hasattr(p, "to_local")]  # FSDP2 DTensor: reduce-scatter writes .grad, no tensor hook runs (docs/distributed.md)
        if not self._params:
            return
        self._small = min(self._params, key=lambda p: p.numel())
        for p in self._params:
            self._handles.append(p.register_hook(self._hook_for(p)))
        self._handles.append(optimizer.register_step_pre_hook(self._before_step))
        self._handles.append(optimizer.register_step_post_hook(self._after_step))

    def _hook_for(self, p: torch.Tensor):
        pid = id(p)

        def hook(grad: torch.Tensor):
            if p is self._small and (self._first or self._stale):
                g = p.grad
                held = g is not None and bool(g.detach().any())
                if self._first:
                    self._first, self._stale = False, held
                elif not held:  # cleared after a backward() meant for another optimizer
                    self._stale = False
            self._fresh.add(pid)
            return None

        return hook

    def _before_step(self, optimizer, args, kwargs) -> None:
        if not self._fresh:
            return
        fresh = [p for p in self._params if id(p) in self._fresh]
        small = self._small if id(self._small) in self._fresh else fresh[0]
        if all(p.grad is None for p in fresh) or (
                small.grad is not None and not bool(small.grad.detach().any())  # cheap first look, then all:
                and all(p.grad is None or not bool(p.grad.detach().any()) for p in fresh)):  # a dead-ReLU bias is 0
            self._record("grad_cleared_before_step", params=len(fresh))

    def _after_step(self, optimizer, args, kwargs) -> None:
        if self._stale:
            self._record("grad_not_cleared", shape=list(self._small.shape))
        if not self._fresh and self._steps > 0 and self._small.grad is not None:
            self._record("stale_grad_step")
        self._fresh = set()
        self._first, self._stale = True, False
        self._steps += 1
        for ev in self._by_kind.values():  # one more optimizer step checked for every kind seen
            ev["detail"]["steps"] += 1

    def _record(self, kind: str, **detail) -> None:
        ev = self._by_kind.get(kind)
        if ev is None:
            ev = self._by_kind[kind] = {"kind": kind, "step": self._steps + 1, "where": None, "count": 1,
                                        "detail": {**detail, "steps": 0}}
            self.events.append(ev)
        else:
            ev["count"] += 1

    def has_events(self) -> bool:
        """True when a kind not seen before was recorded since the last :meth:`drain`."""
        return bool(self.events)

    def drain(self) -> list[dict]:
        """Every event seen so far, as copies with their running ``count`` and ``detail["steps"]``."""
        self.events = []
        return [{**ev, "detail": dict(ev["detail"])} for ev in self._by_kind.values()]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
