"""Reference rules OC101–OC108 (OC109 in ``disposed.py``): do the model, the param groups and the optimizer
state still talk about the same tensors?

Each rule compares up to three sets of one snapshot — the model's parameters,
the param-group members and the optimizer-state keys — and, for OC104, the
model's parameters against the previous snapshot. Two identities are compared
(``optcheck.snapshot``): ``ref`` (the key the optimizer state uses) answers "will
the state lookup throw"; ``data_ptr`` answers "is the optimizer still training
the model's tensor". Comparing handles alone is wrong on TorchSharp: after
``model.to(Float64)`` with an eager optimizer, 29 handles change but 27 still share
the model's data (``tests/fixtures/torchsharp/torchsharp-0.99.6-eager-to-float64.jsonl``,
``docs/torchsharp.md``). A disposed member (TorchSharp 0.107: handle 0, no data) is
OC109's alone: these rules skip it, so its handle 0 is never read as a tensor.
"""

from __future__ import annotations

import re
from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules.base import Rule, RuleContext, listing, register
from optcheck.snapshot import disposed_members, is_disposed, live_members, members


def _name_of(snap: dict, member: dict) -> str:
    """Best name for a param-group member: its own, the model's by ref, by data_ptr, or its ref."""
    if member.get("name"):
        return member["name"]
    for p in snap["params"]:
        if p["ref"] == member["ref"]:
            return p["name"]
    for p in snap["params"]:
        if member.get("data_ptr") and p["data_ptr"] == member["data_ptr"]:
            return p["name"]
    return f"<ref {member['ref']}>"


def identity_by_ref(snap: dict) -> bool:
    """True when a parameter is its ref alone, False when tensors sharing a data
    pointer are one parameter (``docs/parameter-identity.md``).

    Comparing data pointers is wrong on PyTorch: the Parameter object is the
    autograd leaf that gets ``.grad`` and the key of the optimizer state, and
    ``nn.Parameter(t)`` shares ``t``'s storage, so a new Parameter on the old one's
    data (``weight_norm`` applied after the optimizer) gets the gradients while the
    optimizer steps the old object. On TorchSharp refs are wrappers: two handles of
    one native tensor share its gradient. Read from the snapshot's
    ``optimizer.identity`` ("ref" | "data"), else from the backend."""
    opt = snap.get("optimizer") or {}
    if "identity" in opt:
        return opt["identity"] == "ref"
    return snap.get("backend") == "pytorch"


def _by_identity(cls: type[Rule]) -> type[Rule]:
    """Class decorator: where a parameter is its ref alone (:func:`identity_by_ref`),
    the rule's ``check`` sees the snapshot without data pointers, so a Parameter that
    merely shares a member's storage is not taken for that member (nor named after it)."""
    check = cls.check

    def by_identity(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        if identity_by_ref(snap):
            snap = {**snap, "params": [{**p, "data_ptr": None} for p in snap["params"]],
                    "groups": [{**g, "members": [{**m, "data_ptr": None} for m in g.get("members", ())]}
                               for g in snap["groups"]]}
        return check(self, snap, ctx)

    cls.check = by_identity
    return cls


_ORIGINAL = re.compile(r"^(?:(.*)\.)?parametrizations\.([^.]+)\.original\d*$")


def _parametrization(name: str) -> str | None:
    """``fc.parametrizations.weight.original0`` → ``fc.parametrizations.weight``
    (``torch.nn.utils.parametrize`` names the tensors a parametrization computes
    ``fc.weight`` from ``original`` or ``original0``, ``original1``, ...), else None."""
    m = _ORIGINAL.match(name)
    return None if m is None else name[:name.rindex(".")]


def _parametrized_into(snap: dict, former: str) -> str | None:
    """The parametrization now standing for the former parameter name ``former``
    (``fc.weight`` → ``fc.parametrizations.weight``), if the model has one."""
    head, _, tail = former.rpartition(".")
    target = f"{head}.parametrizations.{tail}" if head else f"parametrizations.{tail}"
    return target if any(_parametrization(p["name"]) == target for p in snap["params"]) else None


_LATE = "registered after the optimizer was built"


def _former_name(ctx: RuleContext, ref: int) -> str | None:
    """The model's name for ``ref`` in the latest earlier snapshot that had it (a
    parameter replaced since: ``model.fc = nn.Linear(...)`` after the optimizer)."""
    for prev in reversed(ctx.history):  # the current snapshot (last) does not have it: it is stale
        for p in prev.get("params") or ():
            if p.get("ref") == ref:
                return p["name"]
    return None


#: What fails next when the optimizer holds disposed tensors (TorchSharp 0.107.0, recorded in
#: ``tests/fixtures/torchsharp/0.107.0-runs/eager-param-list-1000``).
_DISPOSED_NEXT = ("TorchSharp: the optimizer still holds the old, disposed tensors; the next zero_grad() "
                  "or step() throws InvalidOperationException: Tensor invalid -- empty handle (OC109)")


def _lazy_state(snap: dict) -> bool:
    """True when the optimizer creates per-parameter state at its first step (PyTorch);
    False when it creates it at construction and looks it up at every step (TorchSharp,
    ``AdamW.step``: ``_state[param.handle]`` before the null-grad check, ``docs/torchsharp.md``)."""
    opt = snap.get("optimizer") or {}
    if "state_init" in opt:
        return opt["state_init"] == "lazy"
    return snap.get("backend") != "torchsharp"


def prestep_finding(snap: dict, code: str) -> dict | None:
    """The TorchSharp worker's own pre-step result for ``code``: the entry of the snapshot's
    ``prestep_findings`` (``ProbeCore.PreStepProblems``, dotnet/Probe/ProbeCore.cs, run in
    the worker right before the step; ``docs/dotnet.md``), ``{}`` when that check ran and
    found no such problem, None when the snapshot carries no such check (PyTorch, recorded
    TorchSharp fixtures, runs written before it): then the rule derives the finding itself."""
    found = snap.get("prestep_findings")
    if snap.get("backend") != "torchsharp" or not isinstance(found, list):
        return None
    return next((f for f in found if isinstance(f, dict) and f.get("code") == code), {})


def _state_keys(snap: dict) -> set[int] | None:
    state = snap.get("state")
    return None if state is None else {s["ref"] for s in state}


def _factored(shape, param_shape) -> bool:
    """True when a state tensor's shape broadcasts to its parameter's, every
    differing dimension being 1: a factored statistic, not a resized parameter."""
    return all(a == b or a == 1 for a, b in zip(shape, param_shape))


def _nonempty(ptr: int | None) -> bool:
    return bool(ptr)


@register
@_by_identity
class StaleParam(Rule):
    """A param-group member is no longer one of the model's parameters.

    The optimizer holds a tensor that the model's forward no longer uses: neither
    its ref nor its data pointer is among ``model.named_parameters()``. Every
    ``step()`` updates that dead tensor; the model's replacement never trains and
    the loss stalls silently (PyTorch, TorchSharp with an eagerly built parameter
    list), or, where the optimizer re-walks the model, the state lookup of the
    replacement throws.

    Typical causes: ``model.load_state_dict(sd, assign=True)``, tying weights, or
    applying ``parametrizations.weight_norm`` after the optimizer was built.

    Fix: do every change to the model's parameters before building the optimizer,
    or rebuild the optimizer (and reload its state) after the change.
    """

    code, symbol, severity, family = "OC101", "stale-param", "error", "references"
    message = "optimizer steps {n} tensor(s) the model no longer uses: {names}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        refs = {p["ref"] for p in snap["params"]}
        ptrs = {p["data_ptr"] for p in snap["params"] if _nonempty(p["data_ptr"])}
        stale = [(gi, m) for gi, m in live_members(snap)
                 if m["ref"] not in refs and not (_nonempty(m.get("data_ptr")) and m["data_ptr"] in ptrs)]
        if not stale:
            return []
        names, shown = [], []
        for _, m in stale:
            name = label = _name_of(snap, m)
            if name.startswith("<ref"):
                former = _former_name(ctx, m["ref"])
                if former:
                    name, via = former, _parametrized_into(snap, former)
                    label = (f"{former} (replaced by the parametrization {via}, {_LATE})" if via
                             else f"{former} (replaced)")
                else:
                    label = name
            names.append(name)
            shown.append(label)
        return [self.finding(
            snap, self.message.format(n=len(stale), names=listing(shown)), subjects=names,
            key=",".join(str(m["ref"]) for _, m in stale),
            next_failure="these tensors keep being stepped while the model's own parameters of the "
                         "same names get no updates: the loss stops improving without an error",
            groups=[gi for gi, _ in stale], refs=[m["ref"] for _, m in stale])]


@register
@_by_identity
class UntrackedParam(Rule):
    """A trainable model parameter is in no param group.

    The model has a parameter with ``requires_grad`` whose ref and data pointer are
    both absent from every param group: it receives gradients but is never
    updated.

    Typical causes: a parameter replaced or added after the optimizer was built
    (``load_state_dict(..., assign=True)``, a new ``nn.Parameter`` assigned to a
    module, ``register_parameter`` late); an optimizer built from a filtered list
    that missed it. On TorchSharp, ``Module.to(dtype)`` rebuilds plain
    ``Parameter`` fields as new tensors that the eager parameter list misses.

    Fix: build the optimizer after the model is final, or ``add_param_group`` for
    the new parameter (with its state); freeze it (``requires_grad_(False)``) if it
    is not meant to train.
    """

    code, symbol, severity, family = "OC102", "untracked-param", "error", "references"
    message = "{n} trainable parameter(s) in no param group, never updated: {names}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        mrefs = {m["ref"] for _, m in live_members(snap)}
        mptrs = {m["data_ptr"] for _, m in live_members(snap) if _nonempty(m.get("data_ptr"))}
        lost = [p for p in snap["params"] if p["requires_grad"] and p["ref"] not in mrefs
                and not (_nonempty(p["data_ptr"]) and p["data_ptr"] in mptrs)]
        if not lost or not snap["groups"]:
            return []
        names = [p["name"] for p in lost]
        via = sorted({v for v in map(_parametrization, names) if v})
        why = (f" (the originals of the parametrization{'s' if len(via) > 1 else ''} {listing(via)}, {_LATE})"
               if via else "")
        return [self.finding(
            snap, self.message.format(n=len(lost), names=listing(names)) + why, subjects=names,
            key=",".join(f"{p['name']}@{p['ref']}" for p in lost),
            next_failure="these parameters keep their initial values for the rest of the run",
            refs=[p["ref"] for p in lost])]


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

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        keys = _state_keys(snap)
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
class RefChurn(Rule):
    """A parameter's ref changed between snapshots and the optimizer did not follow.

    The model's parameter of the same name is a new object (new ``id`` on PyTorch,
    new ``Tensor.Handle`` on TorchSharp), and the optimizer neither holds state for
    the new ref nor steps the same data under another ref. This is the precursor
    of seed 003's crash: TorchSharp keys optimizer state by handle, so the next
    ``step()`` throws ``KeyNotFoundException``; PyTorch keeps stepping the old
    object and the new one never trains.

    A changed ref whose data pointer is still stepped by the optimizer (TorchSharp
    native modules converted in place) is not reported: that tensor still trains.

    Fix: change dtype/device or load weights before building the optimizer, or
    rebuild the optimizer afterwards.
    """

    code, symbol, severity, family = "OC104", "ref-churn", "error", "references"
    message = "{n} parameter(s) changed identity since step {prev}, the optimizer did not follow: {names}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        prev = ctx.previous
        if prev is None:
            return []
        before = {p["name"]: p for p in prev["params"]}
        keys = _state_keys(snap)
        lazy = _lazy_state(snap)

        def usable(m: dict) -> bool:
            return lazy or keys is None or m["ref"] in keys

        tracked_refs = {m["ref"] for _, m in live_members(snap) if usable(m)}
        tracked_ptrs = {m["data_ptr"] for _, m in live_members(snap) if usable(m) and _nonempty(m.get("data_ptr"))}
        churned = []
        for p in snap["params"]:
            old = before.get(p["name"])
            if old is None or old["ref"] == p["ref"]:
                continue
            if p["ref"] in tracked_refs or (_nonempty(p["data_ptr"]) and p["data_ptr"] in tracked_ptrs):
                continue
            churned.append((old, p))
        if not churned:
            return []
        names = [p["name"] for _, p in churned]
        same_data = [p["name"] for old, p in churned if old["data_ptr"] == p["data_ptr"]]
        return [self.finding(
            snap, self.message.format(n=len(churned), prev=prev["step"], names=listing(names)),
            subjects=names, key=",".join(f"{p['name']}@{p['ref']}" for _, p in churned),
            next_failure=(_DISPOSED_NEXT if any(is_disposed(m) for _, m in members(snap)) else
                          "TorchSharp: the next step() throws KeyNotFoundException for the first new handle"
                          if not lazy else
                          "the optimizer keeps stepping the old tensors; these parameters stop training"),
            old_refs=[o["ref"] for o, _ in churned], new_refs=[p["ref"] for _, p in churned],
            same_data=same_data)]


@register
class NonleafParam(Rule):
    """An optimizer member is not a leaf tensor.

    Autograd populates ``.grad`` only on leaves; a non-leaf member never gets a
    gradient, so the optimizer never moves it, and reading its ``.grad`` prints
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed"
    (seed 003). On TorchSharp 0.100.x (and for plain ``Parameter`` fields in
    0.99.6), ``Module.to(dtype)`` rebuilds parameters as ``param.to(dtype)``:
    non-leaf results of an op (TorchSharp #1148; ``docs/torchsharp.md``).

    Fix: convert the model before building the optimizer; create parameters with
    ``Parameter(tensor)`` (a leaf), not as the result of an op.
    """

    code, symbol, severity, family = "OC105", "nonleaf-param", "error", "references"
    message = "{n} optimizer member(s) are not leaf tensors and never get a gradient: {names}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        bad = [m for _, m in live_members(snap) if m.get("is_leaf") is False]
        if not bad:
            return []
        names = [_name_of(snap, m) for m in bad]
        return [self.finding(
            snap, self.message.format(n=len(bad), names=listing(names)), subjects=names,
            key=",".join(str(m["ref"]) for m in bad),
            next_failure="their .grad stays empty (with a warning on every read); they never train",
            refs=[m["ref"] for m in bad])]


@register
class DuplicateParam(Rule):
    """One tensor is stepped twice: in two param groups, or twice in one.

    Found by data pointer, not by ref: TorchSharp's obvious weight tying
    (``lm_head.weight = wte.weight``) registers two parameters with two handles on
    one tensor, so AdamW keeps two moment estimates and applies two updates per
    step to the tied weight (``tests/fixtures/torchsharp/torchsharp-0.99.6-tied.jsonl``,
    ``docs/torchsharp.md``).

    Fix: give the optimizer each tensor once (deduplicate by data pointer /
    storage); in TorchSharp tie by sharing one ``Parameter`` registered once.
    """

    code, symbol, severity, family = "OC106", "duplicate-param", "error", "references"
    message = "tensor stepped {k} times per step by the optimizer: {names}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        seen: dict[tuple, list[tuple[int, dict]]] = {}
        for gi, m in live_members(snap):
            ident = ("ptr", m["data_ptr"]) if _nonempty(m.get("data_ptr")) else ("ref", m["ref"])
            seen.setdefault(ident, []).append((gi, m))
        out = []
        for ident, dup in seen.items():
            if len(dup) < 2:
                continue
            names = sorted({_name_of(snap, m) for _, m in dup} | {
                p["name"] for p in snap["params"] if ident[0] == "ptr" and p["data_ptr"] == ident[1]})
            out.append(self.finding(
                snap, self.message.format(k=len(dup), names=listing(names)), subjects=names,
                key=f"{ident[0]}:{ident[1]}",
                next_failure="the tensor gets several updates per step with separate moment estimates "
                             "(an effectively larger, unscheduled learning rate)",
                groups=[gi for gi, _ in dup], refs=[m["ref"] for _, m in dup]))
        return out


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
                shape = t["shape"] if isinstance(t, dict) else t
                dtype = t.get("dtype") if isinstance(t, dict) else None
                if not shape:  # scalar (step counter)
                    continue
                if len(shape) == len(m["shape"]) and list(shape) != list(m["shape"]) \
                        and not _factored(shape, m["shape"]):
                    bad.append((m, key, f"shape {shape} vs {m['shape']}"))
                elif list(shape) == list(m["shape"]) and dtype and m.get("dtype") and \
                        dtype.lower() != m["dtype"].lower():
                    bad.append((m, key, f"dtype {dtype} vs {m['dtype']}"))
        if not bad:
            return []
        names = sorted({_name_of(snap, m) for m, _, _ in bad})
        return [self.finding(
            snap, self.message.format(n=len(bad), m=len(names), names=listing(names)), subjects=names,
            key=",".join(f"{m['ref']}:{k}" for m, k, _ in bad),
            next_failure="the next step() raises a dtype/shape mismatch, or updates in mixed precision",
            mismatches=[{"name": _name_of(snap, m), "state": k, "what": w} for m, k, w in bad])]


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

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        pre = prestep_finding(snap, self.code)
        if pre is not None:  # TorchSharp: the worker's own pre-step check decided (ProbeCore.PreStepProblems)
            if not pre:
                return []
            by_ref = {m["ref"]: m for _, m in live_members(snap)}
            refs = [int(r) for r in pre["refs"]]
            names = [_name_of(snap, by_ref[r]) if r in by_ref else n for r, n in zip(refs, pre["names"])]
            first = pre.get("predicted_key") or refs[0]
        else:
            keys = _state_keys(snap)
            if keys is None or _lazy_state(snap):
                return []
            missing = [m for _, m in live_members(snap) if m["ref"] not in keys]
            if not missing:
                return []
            names = [_name_of(snap, m) for m in missing]
            refs = [m["ref"] for m in missing]
            first = refs[0]
        return [self.finding(
            snap, self.message.format(n=len(refs), key=first, names=listing(names)), subjects=names,
            key=",".join(str(r) for r in refs),
            next_failure=f"the next step() throws KeyNotFoundException: The given key '{first}' "
                         f"was not present in the dictionary.",
            predicted_exception="System.Collections.Generic.KeyNotFoundException",
            predicted_key=str(first), refs=refs)]
