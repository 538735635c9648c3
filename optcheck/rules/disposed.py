"""OC109: the optimizer holds a tensor that was disposed (a reference rule, OC1xx).

TorchSharp frees a tensor's native memory on ``Dispose()``; the .NET object lives on
with an empty handle (``Tensor.IsInvalid``), and every later use of it throws
``InvalidOperationException: Tensor invalid -- empty handle``. The probe records such
a param-group member with ``dtype`` "disposed", ref 0 and no name, shape or data
(``optcheck.snapshot.is_disposed``). The other reference rules skip these members, so
handle 0 is never taken for a tensor (26 members "stepped 26 times", "not leaf",
"no state for key 0"). Facts and sources: ``docs/torchsharp.md`` ("Disposed tensors").
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules.base import Rule, RuleContext, listing, register
from optcheck.rules.references import _name_of
from optcheck.snapshot import is_disposed

EXCEPTION = "System.InvalidOperationException"
#: The text TorchSharp's exception carries (recorded on 0.107.0:
#: ``tests/fixtures/torchsharp/0.107.0-runs/eager-param-list-1000/summary.json``).
EXCEPTION_TEXT = "Tensor invalid -- empty handle"


def _group_members(snap: dict, gi: int) -> list[dict] | None:
    for i, g in enumerate(snap.get("groups") or ()):
        if g.get("index", i) == gi:
            return list(g.get("members") or ())
    return None


def former_name(ctx: RuleContext, gi: int, pos: int) -> str | None:
    """The name the member at position ``pos`` of group ``gi`` had in the latest earlier
    snapshot where it was alive and the group had the same length (a materialised
    parameter list keeps its order), or None."""
    current = _group_members(ctx.history[-1], gi) if ctx.history else None
    for prev in reversed(ctx.history[:-1]):
        ms = _group_members(prev, gi)
        if ms is None or current is None or len(ms) != len(current) or pos >= len(ms):
            continue
        m = ms[pos]
        if is_disposed(m):
            continue
        name = _name_of(prev, m)
        return None if name.startswith("<ref") else name
    return None


@register
class DisposedParam(Rule):
    """The optimizer holds a tensor that has been disposed.

    A param-group member's native tensor was freed while the optimizer still holds
    the .NET object: its handle is empty. The next ``optimizer.zero_grad()`` or
    ``step()`` throws ``InvalidOperationException: Tensor invalid -- empty handle``.
    The members are named by the name they had at the last snapshot where they
    were alive.

    Typical cause (TorchSharp 0.107.0): the optimizer was built from a
    materialised list (``model.parameters().ToList()``), then ``model.to(dtype)``
    or ``model.to(device)`` replaced the parameters and disposed the old tensors
    (on 0.99.6 the same code trained on silently: OC101/OC102). Also: a
    parameter created inside a ``DisposeScope`` that was not moved out of it, or an
    explicit ``Dispose()`` of a parameter.

    Fix: convert the model (``to(dtype)``, ``to(device)``) before building the
    optimizer, or rebuild the optimizer afterwards; build optimizers from
    ``model.parameters()`` rather than a list copied earlier; ``MoveToOuterDisposeScope``
    any parameter created inside a scope.
    """

    code, symbol, severity, family = "OC109", "disposed-param", "error", "references"
    message = ("{n} optimizer member(s) are disposed tensors (empty handle); the next zero_grad() "
               "or step() throws InvalidOperationException: {names}")

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        gone = []
        for i, g in enumerate(snap["groups"]):
            gi = g.get("index", i)
            for pos, m in enumerate(g.get("members") or ()):
                if is_disposed(m):
                    gone.append((gi, pos))
        if not gone:
            return []
        names = [former_name(ctx, gi, pos) or f"group {gi} member {pos}" for gi, pos in gone]
        return [self.finding(
            snap, self.message.format(n=len(gone), names=listing(names)), subjects=names,
            key=",".join(f"{gi}:{pos}" for gi, pos in gone),
            next_failure=f"the next zero_grad() or step() throws {EXCEPTION}: {EXCEPTION_TEXT}.",
            predicted_exception=EXCEPTION,
            # lead_time() calls the prediction exact when this text is in the exception's message
            predicted_key="empty handle",
            groups=[gi for gi, _ in gone], positions=[pos for _, pos in gone])]
