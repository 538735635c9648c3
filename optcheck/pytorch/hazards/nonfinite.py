"""OC501: NaN/Inf in the loss, gradients, parameters and optimizer state (mixin of
:class:`HazardProbes`)."""

from __future__ import annotations

import math

import torch

from optcheck.pytorch.hazards._tensors import MAX_SAMPLES, _dense
from optcheck.pytorch.probe import l2_norms, state_tensors, uninitialized


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

    def _check_grads_finite(self, trainable: list[tuple[str, torch.Tensor]], step: int, force: bool = False) -> None:
        """NaN/Inf in the gradients of ``trainable`` at ``step``: every ``grad_check_every``
        steps, or now when ``force``."""
        if force or (self.grad_check_every and step % self.grad_check_every == 0):
            grads = [_dense(p.grad) for _, p in trainable if p.grad is not None]
            if grads and not bool(torch.stack(torch._foreach_norm(grads)).isfinite().all()):
                bad = [n for n, p in trainable
                       if p.grad is not None and not bool(torch.isfinite(_dense(p.grad)).all())]
                self._record({"kind": "nonfinite", "step": step, "where": None, "count": 1,
                              "detail": {"what": "grad", "params": bad[:MAX_SAMPLES], "n_params": len(bad)}},
                             key=("nonfinite", "grad"))

    #: ``drain(norms)`` takes the snapshot body's norms (``optcheck.pytorch.probe.Norms``)
    wants_norms = True

    def _check_state(self, norms: dict | None = None) -> None:
        """NaN/Inf in the trainable parameters and their floating optimizer state, found
        from one L2 norm per tensor: a finite norm proves every element finite. The norms
        come from ``norms`` (``optcheck.pytorch.probe.Norms`` of the snapshot body taken
        just before: those tensors are not read again); those it lacks are taken here,
        one ``torch._foreach_norm`` per device and dtype (``probe.l2_norms``). Only a
        tensor whose norm is NaN/Inf is read again, element by element (``isfinite``):
        a finite float32 tensor whose sum of squares overflows (values ~1e20 over 1,000
        elements) has an infinite norm and is no finding."""
        trainable = self._trainable()
        params = [p for _, p in trainable if not uninitialized(p)]  # a lazy module's, before its first forward
        names = {id(p): n for n, p in trainable}
        entries = [("param", p, None, p) for p in params]  # (what, parameter, state key, tensor)
        entries += [("optimizer_state", p, k, v) for p, k, v in state_tensors(self.optimizer, params)]
        known = norms or {}
        got = [known.get(("value", id(p)) if k is None else ("state", id(p), k)) for _, p, k, _ in entries]
        missing = [i for i, x in enumerate(got) if x is None]
        if missing:  # _dense: an FSDP2 DTensor's local shard, a sparse tensor's values
            with torch.no_grad():
                got_here = torch.stack(l2_norms([_dense(entries[i][3].detach()) for i in missing])).tolist()
            for i, x in zip(missing, got_here):
                got[i] = x
        bad: dict[str, list[str]] = {}
        for (what, p, k, t), x in zip(entries, got):
            if not math.isfinite(x) and not bool(torch.isfinite(_dense(t.detach())).all()):
                bad.setdefault(what, []).append(names[id(p)] if k is None else f"{names[id(p)]}:{k}")
        for what, lst in bad.items():
            self._record({"kind": "nonfinite", "step": self._step, "where": None, "count": 1,
                          "detail": {"what": what, "params": lst[:MAX_SAMPLES], "n_params": len(lst)}},
                         key=("nonfinite", what))
