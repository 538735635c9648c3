"""Gradients left over from the previous optimizer step (OC204's probe).

The first backward after each ``optimizer.step()`` should find the parameters'
``.grad`` empty or zero (``zero_grad()`` before ``backward()``, or after
``step()``). A tensor hook on one small parameter the optimizer holds — called
with the incoming gradient *before* it is accumulated into ``.grad``
(``Tensor.register_hook``) — checks that once per step: one ``any()`` over a
bias-sized tensor, well under a microsecond. Gradient accumulation over several
micro-batches stays silent: only the first backward after a step is checked.
"""

from __future__ import annotations

import torch


class GradClearProbe:
    """Records a ``grad_not_cleared`` event when gradients were not cleared between steps.

    Args:
        optimizer: the optimizer whose ``step()`` delimits training steps
            (needs ``register_step_post_hook``, torch ≥ 2.0).

    The event (schema-1 Event) is recorded at the first occurrence; later ones
    only raise its ``count``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.events: list[dict] = []
        self._event: dict | None = None
        self._fresh = False
        self._steps = 0
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad and p.is_leaf]
        self._handles = []
        if not params:
            return
        self._param = min(params, key=lambda p: p.numel())
        self._handles.append(self._param.register_hook(self._on_grad))
        self._handles.append(optimizer.register_step_post_hook(self._after_step))

    def _after_step(self, optimizer, args, kwargs) -> None:
        self._fresh = True
        self._steps += 1

    def _on_grad(self, grad: torch.Tensor):
        if not self._fresh:
            return None
        self._fresh = False
        g = self._param.grad
        if g is not None and bool(g.detach().any()):
            if self._event is None:
                self._event = {"kind": "grad_not_cleared", "step": self._steps + 1, "where": None, "count": 1,
                               "detail": {"shape": list(self._param.shape)}}
                self.events.append(self._event)
            else:
                self._event["count"] += 1
        return None

    def has_events(self) -> bool:
        return bool(self.events)

    def drain(self) -> list[dict]:
        out, self.events = self.events, []
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
