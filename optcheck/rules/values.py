"""Value rule OC501: NaN or Inf in the loss, the gradients, the parameters or the optimizer state.

Reads the ``nonfinite`` events of the PyTorch hazard probes and, so that it also
works on any recorded stream and on TorchSharp, the snapshot's own ``loss`` and
params' ``grad_norm`` (written as "nan"/"inf" strings by ``optcheck.record.snapshot.dumps``).
"""

from __future__ import annotations

import math
from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._events import dated_at_cause, events, names
from optcheck.rules._fixtures import Invalid, Valid, cases, clean, edit, event, steps, with_events, with_params
from optcheck.rules.base import Rule, RuleContext, register
from optcheck.record.snapshot import to_float


def _nonfinite(value) -> bool:
    try:
        x = to_float(value)
    except (TypeError, ValueError):
        return False
    return x is not None and not math.isfinite(x)


@register
class NonFinite(Rule):
    """NaN or Inf in the loss, the gradients, the parameters or the optimizer state.

    One non-finite gradient is enough: AdamW turns it into NaN moments and NaN
    parameters at the next ``step()``, and every later loss is NaN (gradient
    clipping does not help: the total norm is NaN too). The finding says where it
    was seen first — loss, gradients (with the parameter names), parameters or
    optimizer state — and at which step.

    Fix: look at the first step reported (learning rate, a division by a zero
    norm, ``log`` of 0, an overflow in float16 without loss scaling, bad input
    data); skip steps with non-finite gradients (``GradScaler`` does) or lower the
    learning rate.

    Adam and AdamW on float16 parameters (``model.half()`` without float32
    master weights) meet it at the first step: the default ``eps=1e-8`` is 0 in
    float16 (its smallest subnormal is 6e-8), and ``(1 - beta2) * grad**2``
    underflows to 0 for any gradient below about 5e-3, so such an element
    becomes ``-inf`` or ``inf`` and an element whose gradient is 0 becomes NaN
    (0 / 0; measured on torch 2.13, both the for-loop and foreach paths).
    The finding is true. Keep float32 weights (``torch.autocast``, or
    bfloat16) or raise ``eps`` to about 1e-4.
    """

    code, symbol, severity, family = "OC501", "non-finite", "error", "values"
    message = "non-finite {what} at step {step}{extra}"

    @cases
    def VALID():
        return [
            Valid(steps(clean(), 200), "finite loss and gradients"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((clean(200),
                     with_events(clean(300), event("nonfinite", 297, what="grad", params=["layer0.weight"]))),
                    "a NaN gradient seen by the probes (dated at its step, read at 300)", step=297,
                    param="layer0.weight"),
            Invalid((clean(200), edit(clean(300), loss="nan")), "a recorded stream whose loss is NaN", step=300,
                    param="loss"),
            Invalid((clean(200), with_params(clean(300), grad_norm="inf")), "an infinite gradient norm", step=300,
                    param="layer0.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        found: dict[str, tuple[int, list[str]]] = {}
        for e in events(snap, "nonfinite"):
            d = e.get("detail") or {}
            what = d.get("what", "value")
            if what not in found:
                found[what] = (e.get("step", snap["step"]), list(d.get("params") or []))
        if "loss" not in found and _nonfinite(snap.get("loss")):
            found["loss"] = (snap["step"], [])
        bad = [p["name"] for p in snap.get("params", ()) if _nonfinite(p.get("grad_norm"))]
        if bad and "grad" not in found:
            found["grad"] = (snap["step"], bad)
        out = []
        for what, (step, params) in found.items():
            extra = f" in {len(params)} parameter(s): {names(params)}" if params else ""
            f = self.finding(
                snap, self.message.format(what=what.replace("_", " "), step=step, extra=extra),
                subjects=params or [what], key=what,
                next_failure="the next optimizer step writes NaN into the parameters; every later loss is NaN",
                what=what, first_step=step, params=params)
            out.append(dated_at_cause(f, step))
        return out
