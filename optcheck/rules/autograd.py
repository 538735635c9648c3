"""Autograd rule OC301: a tensor saved for backward was written in place.

Reads the ``inplace_on_saved`` events of the PyTorch hazard probes
(``optcheck/pytorch/hazards/``).
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._events import events
from optcheck.rules._fixtures import Invalid, Valid, cases, clean, edit, event, steps, with_events
from optcheck.rules.base import Rule, RuleContext, register
from optcheck.wording import describe_inplace  # noqa: F401 - OC301's sentence, shared with the probes


#: After a version-check error predicted at the write (not read from PyTorch's own): the versions it quotes are
#: those the write left; PyTorch checks at backward(), after any later write (issue 46)
PREDICTED_AT_WRITE = (" [versions as this write left them: another in-place write before backward() raises the "
                      "first, and PyTorch names the first written tensor backward() unpacks]")


@register
class InplaceOnSaved(Rule):
    """A tensor autograd saved for backward was written in place before backward used it.

    Autograd keeps the inputs (or outputs) of many ops to compute their gradients,
    and records each one's version counter; an in-place op (``index_copy_``,
    ``masked_fill_``, ``+=``, ``x[i] = …``, ``relu_``, ``out=``) bumps it. PyTorch
    notices only when backward reaches that op, and raises "one of the variables
    needed for gradient computation has been modified by an inplace operation:
    [torch.FloatTensor [1, 1, 512, 512]] is at version 34; expected version 32",
    naming neither the op nor the line (seeds 000, 001). With gradient
    checkpointing the write can happen while backward re-runs the forward.

    The finding names the tensor, the op that saved it with its module and source
    line, and the op that wrote it (``index_copy_``, ``add_``, ``x[...] = ...``, an
    ``out=`` op) with the ``file:line`` of that call in the user's or the library's
    code, the frames that called it and the phase (a module's forward, the loop
    between the forward and ``backward()``, a checkpoint's recompute). The PyTorch
    probes see the write as it happens (a ``__torch_function__`` mode on armed steps;
    on an unarmed step, the step's forward re-run armed); a write they cannot see
    (an op of a C++ extension, ``torch.ops``, a hook inside ``backward()``) is said
    to be unseen, with the window it happened in, never a guessed line
    (docs/hazards.md, "How the writer is found"). The PyTorch probes stop the step
    at the first hook after the write (their saved-tensor hooks switch off
    PyTorch's own check, so the write must never reach backward silently) unless
    ``--allow-inplace`` is given, in which case backward uses the written values.

    Fix: write into a copy (``x = x.clone()`` before the in-place op, or the
    out-of-place form: ``index_copy``, ``masked_fill``, ``x = x + y``); keep caches
    (KV cache, attention mask cache) out of the training forward or ``detach``
    them per step; never advance an index tensor in place while a graph uses it.
    """

    code, symbol, severity, family = "OC301", "inplace-on-saved", "error", "autograd"
    message = ("{tensor} saved by {op} in {saved_module} ({saved_where}) was written in place by {module} "
               "at {where} (version {v0} -> {v1})")  # the text is built by describe_inplace

    @cases
    def VALID():
        return [
            Valid(steps(clean(), 200), "no in-place write of a saved tensor"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((clean(400), with_events(edit(clean(500), phase="pre-step", trigger="hazard"), event(
                "inplace_on_saved", 500, "model.py:36", tensor={"type": "torch.FloatTensor", "shape": [8, 16]},
                saved_version=1, version=2, phase="forward", stopped=True,
                saved_by={"op": "BmmBackward0", "module": "h.0.attn", "where": "model.py:39"},
                written={"module": "h.0.attn", "where": "model.py:36", "code": "k = cache.index_copy_(2, pos, k)"}))),
                "a KV cache written in place while the graph uses it", step=500, param="h.0.attn"),
            Invalid((clean(30), with_events(edit(clean(37), phase="pre-step", trigger="hazard"), event(
                "inplace_on_saved", 37, None, tensor={"type": "torch.FloatTensor", "shape": [32, 16],
                                                      "grad_fn": "Sigmoid", "output_nr": 0},
                saved_version=0, version=1, phase="before backward", stopped=True, found_by="pytorch", armed=False,
                saved_by={"op": None, "module": None, "where": None}, written={"where": None},
                pytorch_error="one of the variables needed for gradient computation has been modified by an "
                              "inplace operation: [torch.FloatTensor [32, 16]], which is output 0 of Sigmoid, "
                              "is at version 1; expected version 0 instead."))),
                "found by PyTorch's own version check on a step the probes ran unarmed", step=37),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        out = []
        for e in events(snap, "inplace_on_saved"):
            d = e.get("detail") or {}
            t, saved, written = d.get("tensor") or {}, d.get("saved_by") or {}, d.get("written") or {}
            msg = describe_inplace(e)
            subjects = list(dict.fromkeys(s for s in (saved.get("module"), written.get("module")) if s))
            out.append(self.finding(
                snap, msg, subjects=subjects, key=f"{saved.get('where')}->{written.get('where')}",
                next_failure=("backward() raises RuntimeError: " + d["pytorch_error"]
                              + ("" if d.get("found_by") == "pytorch" else PREDICTED_AT_WRITE))
                if d.get("pytorch_error")
                else (f"backward() runs the checkpoint's recompute on the written values without an error "
                      f"(PyTorch compares no version counter of {saved.get('argument')}): wrong gradients, "
                      f"silently") if saved.get("kept_by")
                else ("backward() runs on the written values without an error (a non-reentrant checkpoint's "
                      "recompute checks no version counter): wrong gradients, silently")
                if d.get("checkpoint") == "non-reentrant"
                else "backward() raises: one of the variables needed for gradient computation has been modified "
                     "by an inplace operation",
                first_step=e.get("step"), stopped=d.get("stopped"), phase=d.get("phase"),
                saved_by=saved, written=written, tensor=t, count=e.get("count", 1),
                **({"checkpoint": d["checkpoint"]} if d.get("checkpoint") else {}),
                **({"found_by": d["found_by"]} if d.get("found_by") else {})))
        return out
