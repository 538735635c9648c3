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
from optcheck.rules._fixtures import (Invalid, Valid, at, cases, clean, disposed_after_to_dtype, edit, member,
                                      on_device, param, state_of, steps, with_dtype)
from optcheck.rules._events import events
from optcheck.rules._identity import DISPOSED_NEXT, factored, lazy_state, name_of, prestep_finding, state_keys
from optcheck.rules.base import Rule, RuleContext, listing, register
from optcheck.record.snapshot import disposed_members, is_disposed, live_members, members


@register
class OrphanState(Rule):
    """An optimizer-state entry belongs to no param-group member.

    The optimizer holds per-parameter state (moment buffers) under a key that is no
    longer one of its members: memory held for nothing, and the sign that the
    members were swapped under it. On TorchSharp, whose ``AdamW`` re-walks the
    model's current parameters at each step, orphan state goes with members that
    have no state, and the next ``step()`` throws ``KeyNotFoundException``. On
    PyTorch training goes on, but ``optimizer.state_dict()`` (the next checkpoint
    save) raises ``KeyError``: it numbers the state by the members' positions.

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
            next_failure=("TorchSharp: members without state go with it, and the next step() throws "
                          "KeyNotFoundException (OC108)" if not lazy_state(snap) else
                          "training goes on (PyTorch creates state lazily), but the next optimizer.state_dict() "
                          "(a checkpoint save) raises KeyError: the entry's tensor is in no param group"),
            refs=orphans)]


def floating(dtype: str | None) -> bool:
    """A floating dtype name (PyTorch ``float32``/``bfloat16``, TorchSharp ``Float32``...),
    or unknown (None); quantized states are ``uint8``/``int8``, masks ``bool``."""
    return dtype is None or any(w in dtype.lower() for w in ("float", "half", "double"))


def mismatch_next(kinds: set[str], pytorch: bool = True) -> str:
    """OC107's prediction per kind of mismatch (``shape``, ``dtype``, ``device``), as torch 2.13's
    AdamW behaves on them (tests/integration/test_next_failure.py runs each on without optcheck).
    TorchSharp's behaviour on a mismatch alone was not recorded: what is known is said."""
    if not pytorch:
        return ("TorchSharp: the state no longer fits the parameter; its optimizers do not convert state, so "
                "the next step() throws or updates in mixed precision (not recorded for TorchSharp)")
    out = []
    if "shape" in kinds:
        out.append("the state no longer fits the parameter: the next backward() or step() raises a size-mismatch "
                   "RuntimeError, and a fused kernel (AdamW(fused=True)) may write out of bounds and crash the "
                   "process (SIGSEGV or SIGABRT)")
    if "dtype" in kinds:
        out.append("the next step() raises RuntimeError (AdamW: \"expected dtype float for `end` but got dtype "
                   "double\"; fused: \"expected scalar type ...\"); an optimizer that casts on its own updates in "
                   "mixed precision instead")
    if "device" in kinds:
        out.append("the next step() raises RuntimeError: tensors on different devices")
    return "; ".join(out) or "the next step() raises or crashes the process"


@register
class StateMismatch(Rule):
    """An optimizer-state tensor no longer matches its parameter: it was shaped and
    typed like the parameter, and now its shape or dtype differs, or it sits on
    another device.

    Moment buffers (``exp_avg``, ``exp_avg_sq``) match the parameter elementwise. A
    mismatch that appears means the parameter was converted or resized after the
    optimizer created its state (``model.double()`` / ``model.half()`` /
    ``model.to(dtype)`` after the first step, a resized embedding), or the wrong state
    was loaded: the next ``backward()`` or ``step()`` raises a dtype/shape error (torch
    2.13's AdamW); with a fused kernel a shape mismatch can crash the process
    (``resize_token_embeddings`` then ``AdamW(fused=True)`` on CPU: SIGSEGV or
    SIGABRT); an optimizer that casts on its own mixes precisions. Found two ways: the state tensor matched its parameter in an earlier
    snapshot and no longer does, or the parameter changed shape or dtype since it was
    first seen and the state still has the old one. A state tensor on another device
    than its parameter is a finding whenever seen.

    State *meant* to differ is not a finding (``docs/optimizers.md``): scalars
    (``step``), factored statistics (Adafactor's and CAME's row/column moments),
    preconditioners (Shampoo's ``[n, n]``, SOAP's and Kron's lists), low-rank
    projections (GaLore), quantized states (bitsandbytes' ``uint8`` plus per-block
    scales) — none of them was ever shaped and typed like the parameter. On the
    first snapshot the rule sees (no history: ``optcheck check`` of one snapshot, a
    Monitor created mid-run) it falls back to the shape of the state alone: a
    floating tensor of the parameter's shape and another floating dtype, or of its
    rank and another shape that does not broadcast to it.

    An optimizer swapped in mid-run (OC209) starts its state's history afresh: its
    state is judged against itself, not against the old optimizer's keys.

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
            Valid((clean(), at(edit(clean(), state=[{"ref": 1000 + i, "step": 1, "tensors": {
                "GG.0": {"shape": [4, 4], "dtype": "float32"}, "proj": {"shape": [2, 4], "dtype": "float32"},
                "state1": {"shape": [4, 4], "dtype": "uint8"}, "absmax1": {"shape": [1], "dtype": "float32"}}}
                for i in range(3)]), 200)),
                  "preconditioners, low-rank projections and 8-bit states, never shaped like the parameter"),
            Valid(steps(on_device(clean(), "cuda:0", state_keys_left_on_cpu=("step",)), 200),
                  "AdamW's step counter, a 0-d tensor, kept on the CPU beside parameters on a GPU (not "
                  "capturable, not fused: PyTorch's design)"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((with_dtype(clean(), "float64"),), "model.double() after the optimizer made its state",
                    step=100, param="layer0.weight"),
            Invalid((edit(clean(), state=[{**state_of(param("layer0.weight", 1000)),
                                           "tensors": {"exp_avg": {"shape": [6, 4], "dtype": "float32"}}}]),),
                    "state of a resized parameter", step=100, param="layer0.weight"),
            Invalid((clean(), at(with_dtype(clean(), "float16"), 200)),
                    "model.half() after the state was made, seen against the run's history",
                    step=200, param="layer0.weight"),
            Invalid((on_device(clean(), "cuda:0", state_keys_left_on_cpu=("step", "exp_avg", "exp_avg_sq")),),
                    "model.cuda() after the state was made: the moments left on the CPU", step=100,
                    param="layer0.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        memo = ctx.memo.setdefault(self.code, {})
        first_seen = memo.setdefault("members", {})  # ref -> (shape, dtype) when first seen with a shape
        like = memo.setdefault("like", set())  # (ref, state key) once shaped and typed like its member
        if events(snap, "optimizer_switched"):  # another optimizer's state from here on (OC209): its own history
            like.clear()
        fresh = not memo.get("checked")  # no earlier snapshot: judge by the state's shape alone
        memo["checked"] = True
        by_ref = {m["ref"]: m for _, m in live_members(snap)}
        devices = {p["ref"]: p.get("device") for p in snap.get("params") or ()}
        bad = []
        for s in snap.get("state") or ():
            m = by_ref.get(s["ref"])
            if m is None or not m.get("shape"):
                continue
            mshape, mdtype = list(m["shape"]), (m.get("dtype") or "").lower() or None
            before = first_seen.get(s["ref"])
            for key, t in (s.get("tensors") or {}).items():
                what = self._mismatch(t, mshape, mdtype, devices.get(s["ref"]), (s["ref"], key), like, before, fresh)
                if what:
                    bad.append((m, key, what))
        for m in by_ref.values():
            if m.get("shape"):  # a lazy module's parameter has none before its first forward
                first_seen.setdefault(m["ref"], (list(m["shape"]), (m.get("dtype") or "").lower() or None))
        if not bad:
            return []
        names = sorted({name_of(snap, m) for m, _, _ in bad})
        return [self.finding(
            snap, self.message.format(n=len(bad), m=len(names), names=listing(names)), subjects=names,
            key=",".join(f"{m['ref']}:{k}" for m, k, _ in bad),
            next_failure=(DISPOSED_NEXT if any(is_disposed(m) for _, m in members(snap)) else
                          mismatch_next({w.split(" ")[0] for _, _, w in bad}, lazy_state(snap))),
            mismatches=[{"name": name_of(snap, m), "state": k, "what": w} for m, k, w in bad])]

    @staticmethod
    def _mismatch(t: dict, mshape: list, mdtype: str | None, mdevice: str | None, key: tuple, like: set,
                  before: tuple | None, fresh: bool) -> str | None:
        """Why state tensor ``t`` (schema 1: shape, dtype, optional device) no longer
        matches its member (``mshape``/``mdtype``, ``before``: as first seen), or None."""
        shape, dtype, device = t.get("shape"), (t.get("dtype") or "").lower() or None, t.get("device")
        if device and mdevice and device != mdevice:
            if device == "cpu" and shape is not None and not list(shape):
                # a 0-d tensor on the CPU (a step counter): PyTorch's Adam, AdamW, NAdam, RAdam, Adagrad,
                # RMSprop and others keep `step` there on purpose unless `capturable` (or `fused`) is set
                # (docs/optimizers.md, OC107): no mismatch
                return None
            return f"device {device} vs {mdevice}"
        if shape is None:
            return None
        shape = list(shape)
        same_dtype = dtype is None or mdtype is None or dtype == mdtype
        if shape == mshape and same_dtype:
            like.add(key)
            return None
        if not shape:  # a scalar (step counter)
            return None
        what = f"shape {shape} vs {mshape}" if shape != mshape else f"dtype {dtype} vs {mdtype}"
        if key in like:  # it was shaped and typed like its parameter
            return what
        if before is not None and before != (mshape, mdtype) and shape == before[0] \
                and (dtype is None or before[1] is None or dtype == before[1]):
            return what  # the parameter changed since it was first seen; its state did not
        if fresh and floating(dtype) and floating(mdtype):
            if shape == mshape or (len(shape) == len(mshape) and not factored(shape, mshape)):
                return what
        return None


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
