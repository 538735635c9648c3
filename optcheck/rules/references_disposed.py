"""OC109: the optimizer holds a tensor that was disposed (a reference rule, OC1xx).

TorchSharp frees a tensor's native memory on ``Dispose()``; the .NET object lives on
with an empty handle (``Tensor.IsInvalid``), and every later use of it throws
``InvalidOperationException: Tensor invalid -- empty handle``. The probe records such
a param-group member with ``dtype`` "disposed", ref 0 and no name, shape or data
(``optcheck.record.snapshot.is_disposed``). The other reference rules skip these members, so
handle 0 is never taken for a tensor (26 members "stepped 26 times", "not leaf",
"no state for key 0"). Facts and sources: ``docs/torchsharp.md`` ("Disposed tensors").
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules.base import Rule, RuleContext, listing, register
from optcheck.rules._fixtures import Invalid, Valid, cases, clean, disposed_after_to_dtype, steps
from optcheck.rules._identity import name_of
from optcheck.record.snapshot import disposed_members

EXCEPTION = "System.InvalidOperationException"
#: The text TorchSharp's exception carries (recorded on 0.107.0:
#: ``tests/fixtures/torchsharp/0.107.0-runs/eager-param-list-1000/summary.json``).
EXCEPTION_TEXT = "Tensor invalid -- empty handle"


@register
class DisposedParam(Rule):
    """The optimizer holds a tensor that has been disposed.

    A param-group member's native tensor was freed while the optimizer still holds
    the .NET object: its handle is empty. The next ``optimizer.zero_grad()`` or
    ``step()`` throws ``InvalidOperationException: Tensor invalid -- empty handle``.
    The members are named by the name they had at the last snapshot where they
    were alive.

    Typical cause (TorchSharp 0.107.0): the optimizer was built from a
    materialised list (``model.parameters().ToList()``), then ``model.to(float64)``
    replaced the parameters and disposed the old tensors (recorded on 0.107.0; on
    0.99.6 the same code trained on silently: OC101/OC102). Also: a
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

    @cases
    def VALID():
        return [
            Valid(steps(clean(backend="torchsharp"), 200), "TorchSharp: every member alive"),
        ]

    @cases
    def INVALID():
        return [
            Invalid(disposed_after_to_dtype(), "model.to(float64) after an optimizer built from a list (0.107.0)",
                    step=1000, param="layer0.weight"),
            Invalid(disposed_after_to_dtype()[1:], "without an earlier snapshot: named by position",
                    step=1000, param="group 0 member 0"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        found = disposed_members(ctx.history if ctx.history and ctx.history[-1] is snap else [*ctx.history, snap])
        if not found:
            return []
        gone = [(gi, pos) for gi, pos, _, _ in found]
        names = []
        for gi, pos, old, seen in found:
            name = name_of(seen, old) if old is not None else ""
            names.append(name if name and not name.startswith("<ref") else f"group {gi} member {pos}")
        return [self.finding(
            snap, self.message.format(n=len(gone), names=listing(names)), subjects=names,
            key=",".join(f"{gi}:{pos}" for gi, pos in gone),
            next_failure=f"the next zero_grad() or step() throws {EXCEPTION}: {EXCEPTION_TEXT}.",
            predicted_exception=EXCEPTION,
            # lead_time() calls the prediction exact when this text is in the exception's message
            predicted_key="empty handle",
            groups=[gi for gi, _ in gone], positions=[pos for _, pos in gone],
            former_refs=[old["ref"] if old else None for _, _, old, _ in found])]
