"""OC501: NaN/Inf in the loss, gradients, parameters and optimizer state (mixin of
:class:`HazardProbes`)."""

from __future__ import annotations

import math

import torch

from optcheck.pytorch.hazards._tensors import MAX_SAMPLES, _dense


class NonfiniteProbe:
    """Non-finite values (OC501): the ``nonfinite`` event."""

    def _check_loss_finite(self, loss: torch.Tensor, step: int) -> None:
        # a scalar loss: one read of its value (one op, not isfinite + all + read)
        finite = math.isfinite(loss.item()) if loss.numel() == 1 and not loss.is_complex() else \
            bool(torch.isfinite(loss.detach()).all())
        if not finite:
            self._record({"kind": "nonfinite", "step": step, "where": None, "count": 1,
                          "detail": {"what": "loss", "value": float(loss.detach().float().reshape(-1)[0])}},
                         key=("nonfinite", "loss"))

    def _check_grads_finite(self, trainable: list[tuple[str, torch.Tensor]], step: int) -> None:
        if self.grad_check_every and step % self.grad_check_every == 0:
            grads = [_dense(p.grad) for _, p in trainable if p.grad is not None]
            if grads and not bool(torch.stack(torch._foreach_norm(grads)).isfinite().all()):
                bad = [n for n, p in trainable
                       if p.grad is not None and not bool(torch.isfinite(_dense(p.grad)).all())]
                self._record({"kind": "nonfinite", "step": step, "where": None, "count": 1,
                              "detail": {"what": "grad", "params": bad[:MAX_SAMPLES], "n_params": len(bad)}},
                             key=("nonfinite", "grad"))

    def _check_state(self) -> None:
        tensors, names = [], []
        for n, p in self._trainable():
            tensors.append(_dense(p.detach()))  # _dense: FSDP2 DTensor -> local shard, no collective
            names.append(("param", n))
            for k, v in self.optimizer.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0:
                    tensors.append(_dense(v))
                    names.append(("optimizer_state", f"{n}:{k}"))
        if not tensors:
            return
        with torch.no_grad():
            ok = bool(torch.stack([x.float() for x in torch._foreach_norm(tensors)]).isfinite().all())
        if ok:
            return
        bad: dict[str, list[str]] = {}
        for (what, name), t in zip(names, tensors):
            if not bool(torch.isfinite(t).all()):
                bad.setdefault(what, []).append(name)
        for what, lst in bad.items():
            self._record({"kind": "nonfinite", "step": self._step, "where": None, "count": 1,
                          "detail": {"what": what, "params": lst[:MAX_SAMPLES], "n_params": len(lst)}},
                         key=("nonfinite", what))
