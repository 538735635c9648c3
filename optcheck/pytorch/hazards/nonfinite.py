"""OC501: NaN/Inf in the loss, gradients, parameters and optimizer state (mixin of
:class:`HazardProbes`)."""

from __future__ import annotations

import math
from operator import attrgetter, itemgetter

import torch

from optcheck.pytorch.hazards._tensors import MAX_SAMPLES, _dense
from optcheck.pytorch.probe import l2_norms, state_tensors, uninitialized


def _norms64(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms accumulated in float64 (``torch._foreach_norm``'s ``dtype``, torch >= 2.4;
    per tensor before that)."""
    try:
        return list(torch._foreach_norm(grads, 2, dtype=torch.float64))
    except (TypeError, RuntimeError):
        return [torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads]


_NAME, _PARAM, _GRAD = itemgetter(0), itemgetter(1), attrgetter("grad")


class NonfiniteProbe:
    """Non-finite values (OC501): the ``nonfinite`` event."""

    # Loss and gradients are checked on the device and read at the driver's next snapshot or
    # metrics batch (``self.ledger``, optcheck/pytorch/deferred.py): no host sync per step. The
    # event carries the step the value was made at.
    def _check_loss_finite(self, loss: torch.Tensor, step: int) -> None:
        # a 0-d real loss goes to the ledger as it is: the very tensor a Monitor keeps as the step's loss
        # (check_loss's value), so the ledger copies it once for both (optcheck/pytorch/deferred.py)
        # (each tensor property read once: this runs every step)
        complex_, zero_d = loss.is_complex(), loss.dim() == 0
        t = loss if zero_d and not complex_ else loss.detach().abs() if complex_ else loss.detach()
        scalar = zero_d or t.numel() == 1
        # a scalar loss is itself the flag (no kernel); otherwise isfinite().all() and its first value
        flag = (t if zero_d else t.reshape(())) if scalar else torch.stack((
            torch.isfinite(t).all().to(t.dtype), t.reshape(-1)[0]))
        self.ledger.add(flag, lambda v, step=step, scalar=scalar: self._loss_read(v, step, scalar))

    def _loss_read(self, v: list[float], step: int, scalar: bool) -> None:
        if (math.isfinite(v[0]) if scalar else v[0] == 1.0):
            return
        self._record({"kind": "nonfinite", "step": step, "where": None, "count": 1,
                      "detail": {"what": "loss", "value": v[0] if scalar else v[1]}}, key=("nonfinite", "loss"))

    def _check_grads_finite(self, trainable: list[tuple[str, torch.Tensor]], step: int, force: bool = False) -> None:
        """NaN/Inf in the gradients of ``trainable`` at ``step``: every ``grad_check_every``
        steps (called at the optimizer's step pre-hook: once per step, over the gradients
        every backward of it accumulated), or now when ``force``. One
        ``torch._foreach_norm`` in float64 (a finite float32/16 gradient cannot overflow it,
        so a non-finite norm is a non-finite element), read later."""
        if force or (self.grad_check_every and step % self.grad_check_every == 0):
            have = [(n, g) for n, g in zip(map(_NAME, trainable), map(_GRAD, map(_PARAM, trainable)))
                    if g is not None]
            if have:
                # (per step: no detach per gradient, no device move unless they are on several devices)
                grads = [g if type(g) is torch.Tensor and not g.is_sparse else _dense(g) for _, g in have]
                with torch.no_grad():
                    norms = _norms64(grads)
                    try:
                        norms = torch.stack(norms)
                    except RuntimeError:  # on several devices
                        norms = torch.stack([n.to(grads[0].device) for n in norms])
                self.check_grad_norms(step, [n for n, _ in have], norms)

    def check_grad_norms(self, step: int, names: list[str], norms: torch.Tensor) -> None:
        """NaN/Inf in gradients from their norms (a 1-D device tensor, one per name; the
        soak hands the ones its gradient clipping computed): read at the next snapshot or
        metrics batch, recorded at ``step``."""
        self.ledger.add(norms, lambda v, step=step, names=names: self._grads_read(v, step, names))

    def _grads_read(self, v: list[float], step: int, names: list[str]) -> None:
        bad = [n for n, x in zip(names, v) if not math.isfinite(x)]
        if bad:
            bad = [n for n in bad if n]  # "": a total over every gradient (clip_grad_norm_'s)
            self._record({"kind": "nonfinite", "step": step, "where": None, "count": 1,
                          "detail": {"what": "grad", "params": bad[:MAX_SAMPLES], "n_params": len(bad)}},
                         key=("nonfinite", "grad"))

    def check_grads_before_step(self, step: int, kwargs: dict | None = None, clip=None) -> None:
        """OC501's gradient check as ``optimizer.step()`` of ``step`` is about to write them
        (``optcheck.Monitor``'s step pre-hook; its probes run with ``grad_check_every=0``).

        Checked here rather than after each ``backward()``: a step that does not run writes
        nothing (``GradScaler.step`` skips ``optimizer.step()`` when it found Inf/NaN; fp16
        AMP's first steps overflow by design), and micro-batches cost one check, not one
        each. Not checked when ``kwargs`` carries ``found_inf`` / ``grad_scaler`` (an
        optimizer that unscales itself: GradScaler hands it the overflow flag and the
        step skips itself). When ``clip`` (``monitor_hooks.ClipNorm``) holds the total norm
        ``clip_grad_norm_`` took over every trainable parameter since the last backward,
        that one value is queued instead of the per-tensor norms: a finite total proves
        every gradient finite (a non-finite one then names no parameter)."""
        if kwargs and ("found_inf" in kwargs or "grad_scaler" in kwargs):
            return
        total = getattr(clip, "total", None)
        if clip is not None and isinstance(total, torch.Tensor) and self._clip_covers(clip):
            # the user's clip_grad_norm_ total over every trainable gradient: queued like the norms
            # (read at the next snapshot or metrics batch, no host read now); a non-finite total
            # names no parameter (the per-tensor norms were not kept)
            # (widened to float64 at the read, optcheck.pytorch.deferred.host_values: no kernel per step)
            self.ledger.add(total, lambda v, step=step: self._grads_read(v, step, [""]))
            return
        self._check_grads_finite(self._trainable(), step, force=True)

    def _clip_covers(self, clip) -> bool:
        """``clip`` (``monitor_hooks.ClipNorm``) holds a total over every trainable gradient. Asked
        first about every param-group member, in the list :meth:`_trainable` keeps while the param
        groups hold the same objects: covering them all covers those that require grad, so their
        ``requires_grad`` flags are not read (a map over the parameters a step less, issue 34).
        Else asked about the trainable ones as they are now (a clip over those alone)."""
        flat = self._trainable_flat
        if flat and self._members_unchanged() and clip.covers(flat):
            return True
        self._trainable()  # (sets self._trainable_ps, the parameters that require grad now)
        return clip.covers(self._trainable_ps)

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
        view = getattr(norms, "view", None)  # (the state as the snapshot body read it: not read again)
        entries += [("optimizer_state", p, k, v) for p, k, v in state_tensors(self.optimizer, params, view)]
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
