"""Optimizer-state rules OC103, OC107, OC108 (family "references"): does the optimizer
state belong to the param-group members, and match them?

OC103 and OC108 compare the state's keys with the members' refs (the key the state
lookup uses); OC107 compares each state tensor's shape and dtype with its member's.
Whether a member without state is a crash depends on when the optimizer creates
state (``_identity.lazy_state``: lazily at the first step on PyTorch, at
construction on TorchSharp, ``docs/torchsharp.md``). Members disposed since
(TorchSharp 0.107) are OC109's (``references_disposed.py``) and skipped here.
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._fixtures import (Invalid, Valid, at, cases, clean, disposed_after_to_dtype, edit, member, param,
                                      state_of, steps, with_dtype)
from optcheck.rules._identity import factored, lazy_state, name_of, prestep_finding, state_keys
from optcheck.rules.base import Rule, RuleContext, listing, register
from optcheck.snapshot import disposed_members, live_members


@register
class OrphanState(Rule):
    """An optimizer-state entry belongs to no param-group member.

    The optimizer holds per-parameter state (moment buffers) under a key that is no
    longer one of its members: memory held for nothing, and the sign that the
    members were swapped under it. On TorchSharp, whose ``AdamW`` re-walks the
    model's current parameters at each step, orphan state goes with members that
    have no state, and the next ``step()`` throws ``KeyNotFoundException``.

    State of a member that has been disposed since (TorchSharp: the optimizer still
    holds the dead tensor) is not an orphan: OC109 reports those members.

    Fix: do not replace the tensors of a built optimizer; rebuild it and load its
    state by parameter name.
    """

    code, symbol, severity, family = "OC103", "orphan-state", "error", "references"
    message = "{n} optimizer-state entries belong to no param-group member"

    @cases
    def VALID():
        return [
            Valid(steps(clean(), 200), "state for the members only"),
            Valid(disposed_after_to_dtype(), "TorchSharp: the state of members disposed since is OC109's"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((edit(clean(), add_params=[param("gone.weight", 4242)],
                          add_members=[member(param("gone.weight", 4242))],
                          add_state=[state_of(param("gone.weight", 4242))]),
                     edit(at(clean(), 200), add_state=[state_of(param("gone.weight", 4242))])),
                    "a member removed from its group, its state left behind", step=200, param="gone.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        keys = state_keys(snap)
        if keys is None:
            return []
        mrefs = {m["ref"] for _, m in live_members(snap)}
        # state of a member disposed since (the optimizer still holds it) is OC109's, not an orphan
        history = ctx.history if ctx.history and ctx.history[-1] is snap else [*ctx.history, snap]
        mrefs |= {old["ref"] for _, _, old, _ in disposed_members(history) if old is not None}
        orphans = sorted(k for k in keys if k not in mrefs)
        if not orphans:
            return []
        prev_names = {}
        if ctx.previous is not None:
            prev_names = {p["ref"]: p["name"] for p in ctx.previous["params"]}
        names = [prev_names.get(k, f"<ref {k}>") for k in orphans]
        return [self.finding(
            snap, self.message.format(n=len(orphans)) + (": " + listing(names) if prev_names else ""),
            subjects=names, key=",".join(map(str, orphans)),
            next_failure="the state is never used again; where the optimizer looks up state for its "
                         "current members, that lookup fails",
            refs=orphans)]


@register
class StateMismatch(Rule):
    """An optimizer-state tensor's shape or dtype differs from its parameter's.

    Moment buffers (``exp_avg``, ``exp_avg_sq``) must match the parameter
    elementwise. A mismatch means the parameter was converted or resized after the
    optimizer created its state (``model.double()`` / ``model.to(dtype)`` after the
    first step, a resized embedding) or the wrong state was loaded: the next
    ``step()`` raises a dtype/shape error, or silently mixes precisions.
    Scalar entries (``step``) are ignored, and so are factored statistics whose
    shape broadcasts to the parameter's (``torch.optim.Adafactor``'s ``row_var``
    of shape (m, 1) and ``col_var`` of shape (1, n) for an (m, n) weight).

    Fix: convert or resize the model before building the optimizer, or rebuild
    it; load optimizer state that belongs to this model.
    """

    code, symbol, severity, family = "OC107", "state-mismatch", "error", "references"
    message = "{n} optimizer-state tensor(s) of {m} parameter(s) do not match their parameter: {names}"

    @cases
    def VALID():
        return [
            Valid(steps(clean(), 200), "moments of the parameters' shape and dtype"),
            Valid((edit(clean(), state=[{"ref": 1000 + i, "step": 1, "tensors": {
                "row_var": {"shape": [4, 1], "dtype": "float32"}, "col_var": {"shape": [1, 4], "dtype": "float32"}}}
                for i in range(3)]),), "Adafactor's factored statistics (m, 1) and (1, n)"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((with_dtype(clean(), "float64"),), "model.double() after the optimizer made its state",
                    step=100, param="layer0.weight"),
            Invalid((edit(clean(), state=[{**state_of(param("layer0.weight", 1000)),
                                           "tensors": {"exp_avg": {"shape": [6, 4], "dtype": "float32"}}}]),),
                    "state of a resized parameter", step=100, param="layer0.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        if not snap.get("state"):
            return []
        by_ref = {m["ref"]: m for _, m in live_members(snap)}
        bad = []
        for s in snap["state"]:
            m = by_ref.get(s["ref"])
            if m is None or "shape" not in m:
                continue
            for key, t in (s.get("tensors") or {}).items():
                shape, dtype = t.get("shape"), t.get("dtype")  # schema 1: {"shape", "dtype"}, both optional
                if not shape:  # a scalar (step counter), or no shape recorded
                    continue
                if len(shape) == len(m["shape"]) and list(shape) != list(m["shape"]) \
                        and not factored(shape, m["shape"]):
                    bad.append((m, key, f"shape {shape} vs {m['shape']}"))
                elif list(shape) == list(m["shape"]) and dtype and m.get("dtype") and \
                        dtype.lower() != m["dtype"].lower():
                    bad.append((m, key, f"dtype {dtype} vs {m['dtype']}"))
        if not bad:
            return []
        names = sorted({name_of(snap, m) for m, _, _ in bad})
        return [self.finding(
            snap, self.message.format(n=len(bad), m=len(names), names=listing(names)), subjects=names,
            key=",".join(f"{m['ref']}:{k}" for m, k, _ in bad),
            next_failure="the next step() raises a dtype/shape mismatch, or updates in mixed precision",
            mismatches=[{"name": name_of(snap, m), "state": k, "what": w} for m, k, w in bad])]


@register
class MissingState(Rule):
    """A param-group member has no optimizer state where the optimizer expects it.

    Optimizers that create state at construction and look it up at every step
    (TorchSharp: ``_state[param.handle]`` in ``AdamW.step`` before the null-grad
    check; ``docs/torchsharp.md``) throw when a member has no state: the next ``step()``
    raises ``KeyNotFoundException`` with the decimal handle of the first such
    member. PyTorch creates state lazily, so this rule is silent there. On a live
    TorchSharp run the worker's own pre-step check (``ProbeCore.PreStepProblems``,
    the same check ``PreStepGuard`` runs in C# loops) decides, and the snapshot carries
    its result in ``prestep_findings`` (``docs/dotnet.md``).

    Fix: build the optimizer after every change to the model's parameters
    (``Module.to``, ``load``, assigning or registering a ``Parameter``).
    """

    code, symbol, severity, family = "OC108", "missing-state", "error", "references"
    message = "{n} optimizer member(s) have no state; next step() throws KeyNotFoundException for key {key}: {names}"

    @cases
    def VALID():
        return [
            Valid((edit(clean(), state=clean()["state"][1:]),),
                  "PyTorch creates state lazily, at a member's first step"),
            Valid(steps(clean(backend="torchsharp"), 200), "TorchSharp: state for every member"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((edit(clean(backend="torchsharp"), state=clean(backend="torchsharp")["state"][1:]),),
                    "TorchSharp: a member without state (its step() will throw)", step=100, param="layer0.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        pre = prestep_finding(snap, self.code)
        if pre is not None:  # TorchSharp: the worker's own pre-step check decided (ProbeCore.PreStepProblems)
            if not pre:
                return []
            by_ref = {m["ref"]: m for _, m in live_members(snap)}
            refs = [int(r) for r in pre["refs"]]
            names = [name_of(snap, by_ref[r]) if r in by_ref else n for r, n in zip(refs, pre["names"])]
            first = pre.get("predicted_key") or refs[0]
        else:
            keys = state_keys(snap)
            if keys is None or lazy_state(snap):
                return []
            missing = [m for _, m in live_members(snap) if m["ref"] not in keys]
            if not missing:
                return []
            names = [name_of(snap, m) for m in missing]
            refs = [m["ref"] for m in missing]
            first = refs[0]
        return [self.finding(
            snap, self.message.format(n=len(refs), key=first, names=listing(names)), subjects=names,
            key=",".join(str(r) for r in refs),
            next_failure=f"the next step() throws KeyNotFoundException: The given key '{first}' "
                         f"was not present in the dictionary.",
            predicted_exception="System.Collections.Generic.KeyNotFoundException",
            predicted_key=str(first), refs=refs)]
