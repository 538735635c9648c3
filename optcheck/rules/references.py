"""Reference rules OC101, OC102, OC104–OC106: do the model's parameters and the param
groups still talk about the same tensors? (State rules OC103, OC107, OC108 are in
``references_state.py``, OC109 in ``references_disposed.py``.)

Each rule compares the model's parameters with the param-group members of one
snapshot and, for OC104, with the previous snapshot. Two identities are compared
(``optcheck.record.snapshot``, ``_identity.py``): ``ref`` answers "will the state lookup
throw"; ``data_ptr`` answers "is the optimizer still training the model's tensor".
Comparing handles alone is wrong on TorchSharp: after ``model.to(Float64)`` with an
eager optimizer, 29 handles change but 27 still share the model's data
(``tests/fixtures/torchsharp/torchsharp-0.99.6-eager-to-float64.jsonl``,
``docs/torchsharp.md``). A disposed member (TorchSharp 0.107: handle 0, no data) is
OC109's alone: these rules skip it, so its handle 0 is never read as a tensor.
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._fixtures import DISPOSED, Invalid, Valid, at, cases, clean, edit, member, param, state_of, steps
from optcheck.rules._identity import (DISPOSED_NEXT, LATE, by_identity, former_name, lazy_state, name_of, nonempty,
                                      parametrization, parametrized_into, prestep_finding, state_keys)
from optcheck.rules.base import Rule, RuleContext, listing, register
from optcheck.record.snapshot import is_disposed, live_members, members


def held_under(snap: dict, name: str) -> str | None:
    """The name under which the optimizer steps the model's current parameter ``name``, when that
    tensor is a member of the optimizer under another name (a weight re-tied to another one)."""
    cur = next((p for p in snap["params"] if p["name"] == name), None)
    if cur is None:
        return None
    for _, m in live_members(snap):
        if m["ref"] == cur["ref"] or (nonempty(m.get("data_ptr")) and m.get("data_ptr") == cur["data_ptr"]):
            other = name_of(snap, m)
            return other if other != name else next(
                (p["name"] for p in snap["params"] if p["ref"] == cur["ref"] and p["name"] != name), other)
    return None


def stale_next(names: list[str], tied: dict, lazy: bool) -> str:
    """OC101's prediction: the stale tensors get no gradient; each model parameter of those names
    either is another member (tied: it trains, under that name) or in no param group (OC102)."""
    old = ("the optimizer's old tensors get no gradient: PyTorch skips them, or moves them by their old "
           "momentum while .grad is kept as zeros" if lazy else
           "TorchSharp: the next step() throws, KeyNotFoundException for a member without state (OC108) or "
           "InvalidOperationException for a disposed one (OC109)")
    trains = [f"{n} is now {tied[n]}'s tensor, which the optimizer steps (it still trains, through {tied[n]})"
              for n in names if n in tied]
    idle = [n for n in names if n not in tied]
    parts = [old] + trains
    if idle:
        parts.append(f"{listing(idle)} of the model {'is' if len(idle) == 1 else 'are'} in no param group and never "
                     f"train{'s' if len(idle) == 1 else ''} (OC102): the loss stops improving there, nothing raises")
    return "; ".join(parts)


@register
@by_identity
class StaleParam(Rule):
    """A param-group member is no longer one of the model's parameters.

    The optimizer holds a tensor that the model's forward no longer uses: neither
    its ref nor its data pointer is among ``model.named_parameters()``. That dead
    tensor gets no gradient (PyTorch skips it, or moves it by its old momentum
    while ``.grad`` is kept as zeros). The model's parameter of that name either is
    another member (a weight re-tied to another one: it still trains, through that
    member) or in no param group (OC102: it never trains, the loss stalls silently);
    where the optimizer re-walks the model (TorchSharp), the state lookup of the
    replacement throws. The prediction says which, per name.

    Typical causes: ``model.load_state_dict(sd, assign=True)``, tying weights, or
    applying ``parametrizations.weight_norm`` after the optimizer was built.

    On a live TorchSharp run the worker's own pre-step check
    (``ProbeCore.PreStepProblems``, the check ``PreStepGuard`` runs in C# loops)
    decides which members are stale, and the snapshot carries its result in
    ``prestep_findings`` (``docs/dotnet.md``); this rule names them.

    Fix: do every change to the model's parameters before building the optimizer,
    or rebuild the optimizer (and reload its state) after the change.
    """

    code, symbol, severity, family = "OC101", "stale-param", "error", "references"
    message = "optimizer steps {n} tensor(s) the model no longer uses: {names}"

    @cases
    def VALID():
        return [
            Valid(steps(clean(), 200, 300), "a consistent model and optimizer"),
            Valid((edit(clean(backend="torchsharp"), params={1: param("layer1.weight", 5555, 11001)}),),
                  "TorchSharp: a new handle on the member's data still trains it"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((edit(clean(), params={1: param("layer1.weight", 5555, 6666)}),),
                    "the model's parameter replaced after the optimizer was built", step=100, param="layer1.weight"),
            Invalid((edit(clean(), params={1: param("layer1.weight", 5555, 11001)}),),
                    "PyTorch: a new Parameter on the old one's storage is another leaf", step=100,
                    param="layer1.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        pre = prestep_finding(snap, self.code)
        if pre is not None:  # TorchSharp: the worker's own pre-step check decided (ProbeCore.PreStepProblems)
            by_ref = {m["ref"]: (gi, m) for gi, m in live_members(snap)}
            stale = [by_ref.get(int(r)) or (None, {"ref": int(r), "name": n})
                     for r, n in zip(pre.get("refs") or (), pre.get("names") or ())]
        else:
            refs = {p["ref"] for p in snap["params"]}
            ptrs = {p["data_ptr"] for p in snap["params"] if nonempty(p["data_ptr"])}
            stale = [(gi, m) for gi, m in live_members(snap)
                     if m["ref"] not in refs and not (nonempty(m.get("data_ptr")) and m["data_ptr"] in ptrs)]
        if not stale:
            return []
        names, shown, tied = [], [], {}
        for _, m in stale:
            name = label = name_of(snap, m)
            if name.startswith("<ref"):
                former = former_name(ctx, m["ref"])
                if former:
                    name, via = former, parametrized_into(snap, former)
                    label = (f"{former} (replaced by the parametrization {via}, {LATE})" if via
                             else f"{former} (replaced)")
                else:
                    label = name
            names.append(name)
            shown.append(label)
            other = held_under(snap, name)
            if other:
                tied[name] = other
        return [self.finding(
            snap, self.message.format(n=len(stale), names=listing(shown)), subjects=names,
            key=",".join(str(m["ref"]) for _, m in stale),
            next_failure=stale_next(names, tied, lazy_state(snap)),
            groups=[gi for gi, _ in stale], refs=[m["ref"] for _, m in stale], tied=tied)]


@register
@by_identity
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

    On a live TorchSharp run the worker's pre-step check (``ProbeCore.PreStepProblems``)
    decides, as for OC101; its result is the snapshot's ``prestep_findings``.

    Fix: build the optimizer after the model is final, or ``add_param_group`` for
    the new parameter (with its state); freeze it (``requires_grad_(False)``) if it
    is not meant to train.
    """

    code, symbol, severity, family = "OC102", "untracked-param", "error", "references"
    message = "{n} trainable parameter(s) in no param group, never updated: {names}"
    #: an optimizer of :data:`OUTSIDE_GROUPS`: it updates the model's parameters itself (issue 46)
    message_outside = ("{n} trainable parameter(s) in no param group of {opt}, which updates the model's "
                       "parameters from model.named_parameters() itself (so they may still train, outside its "
                       "param groups): {names}")

    @cases
    def VALID():
        return [
            Valid(steps(clean(), 200), "every trainable parameter in a group"),
            Valid((edit(clean(), add_params=[param("frozen.w", 7778, rg=False)]),), "a frozen parameter in no group"),
            Valid((edit(clean(), add_params=[{**param("head.w", 7779), "trained_by": "Adam"}]),),
                  "a parameter another optimizer trains (Muon + AdamW, a GAN's two optimizers)"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((edit(clean(), add_params=[param("extra.gain", 7777, shape=(4,))]),),
                    "a parameter registered after the optimizer was built", step=100, param="extra.gain"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        pre = prestep_finding(snap, self.code)
        if pre is not None:  # TorchSharp: the worker's own pre-step check decided (ProbeCore.PreStepProblems)
            by_ref = {p["ref"]: p for p in snap["params"]}
            lost = [by_ref.get(int(r)) or {"ref": int(r), "name": n}
                    for r, n in zip(pre.get("refs") or (), pre.get("names") or ())]
        else:
            mrefs = {m["ref"] for _, m in live_members(snap)}
            mptrs = {m["data_ptr"] for _, m in live_members(snap) if nonempty(m.get("data_ptr"))}
            lost = [p for p in snap["params"] if p["requires_grad"] and p["ref"] not in mrefs
                    and not (nonempty(p["data_ptr"]) and p["data_ptr"] in mptrs)
                    and not p.get("trained_by")]  # another optimizer's (optcheck/pytorch/other_optimizers.py)
        if not lost or not snap["groups"]:
            return []
        names = [p["name"] for p in lost]
        via = sorted({v for v in map(parametrization, names) if v})
        why = (f" (the originals of the parametrization{'s' if len(via) > 1 else ''} {listing(via)}, {LATE})"
               if via else "")
        opt = (snap.get("optimizer") or {}).get("type")
        outside = opt in OUTSIDE_GROUPS  # it updates the model's parameters itself: "never updated" would be false
        return [self.finding(
            snap, (self.message_outside if outside else self.message).format(n=len(lost), opt=opt,
                                                                             names=listing(names)) + why,
            subjects=names, key=",".join(f"{p['name']}@{p['ref']}" for p in lost),
            next_failure=(f"nothing raises; {opt} steps what its walk over model.named_parameters() finds (state "
                          f"it keeps by name, as AdaLomo's, is the old parameter's or missing), but they are not "
                          f"among the parameters it was built with: its param groups, what a checkpoint of it or a "
                          f"second optimizer built from them sees") if outside
            else "these parameters keep their initial values for the rest of the run",
            refs=[p["ref"] for p in lost])]


#: optimizers that update every parameter of the model they were given, walking
#: ``model.named_parameters()`` in their gradient hooks, not their param groups (``lomo_optim``'s
#: ``Lomo``/``AdaLomo``, pytorch-optimizer's ``LOMO``/``AdaLOMO``): a parameter in no param
#: group of theirs still trains (issue 46: a replaced layer moved 0.30 over 60 steps)
OUTSIDE_GROUPS = frozenset({"Lomo", "AdaLomo", "LOMO", "AdaLOMO"})


@register
class RefChurn(Rule):
    """A parameter's ref changed between snapshots and the optimizer did not follow.

    The model's parameter of the same name is a new object (new ``id`` on PyTorch,
    new ``Tensor.Handle`` on TorchSharp), and the optimizer neither holds state for
    the new ref nor steps the same data under another ref. This is the precursor
    of seed 003's crash: TorchSharp keys optimizer state by handle, so the next
    ``step()`` throws ``KeyNotFoundException``; PyTorch holds the old object, which
    gets no gradient, and the new one never trains.

    A changed ref whose data pointer is still stepped by the optimizer (TorchSharp
    native modules converted in place) is not reported: that tensor still trains.

    Fix: change dtype/device or load weights before building the optimizer, or
    rebuild the optimizer afterwards.
    """

    code, symbol, severity, family = "OC104", "ref-churn", "error", "references"
    message = "{n} parameter(s) changed identity since step {prev}, the optimizer did not follow: {names}"

    @cases
    def VALID():
        return [
            Valid((clean(100), clean(200, first_ref=1050)), "a resumed job: a new model and a new optimizer over it"),
            Valid(steps(clean(backend="torchsharp"), 200), "TorchSharp: the same handles at every snapshot"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((clean(100), edit(at(clean(100), 200), params={0: param("layer0.weight", 9999, 8888)})),
                    "a parameter replaced between two snapshots", step=200, param="layer0.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        prev = ctx.previous
        if prev is None:
            return []
        before = {p["name"]: p for p in prev["params"]}
        keys = state_keys(snap)
        lazy = lazy_state(snap)

        def usable(m: dict) -> bool:
            return lazy or keys is None or m["ref"] in keys

        tracked_refs = {m["ref"] for _, m in live_members(snap) if usable(m)}
        tracked_ptrs = {m["data_ptr"] for _, m in live_members(snap) if usable(m) and nonempty(m.get("data_ptr"))}
        churned = []
        for p in snap["params"]:
            old = before.get(p["name"])
            if old is None or old["ref"] == p["ref"]:
                continue
            if p["ref"] in tracked_refs or (nonempty(p["data_ptr"]) and p["data_ptr"] in tracked_ptrs):
                continue
            churned.append((old, p))
        if not churned:
            return []
        names = [p["name"] for _, p in churned]
        same_data = [p["name"] for old, p in churned if old["data_ptr"] == p["data_ptr"]]
        return [self.finding(
            snap, self.message.format(n=len(churned), prev=prev["step"], names=listing(names)),
            subjects=names, key=",".join(f"{p['name']}@{p['ref']}" for _, p in churned),
            next_failure=(DISPOSED_NEXT if any(is_disposed(m) for _, m in members(snap)) else
                          "TorchSharp: the next step() throws KeyNotFoundException for the first new handle"
                          if not lazy else
                          "nothing raises: the optimizer holds the old tensors, which get no gradient (it skips "
                          "them, or moves them by their old momentum while .grad is kept as zeros), and the "
                          "model's new tensors of these names are in no param group: they never train"),
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

    @cases
    def VALID():
        return [
            Valid(steps(clean(), 200), "every member a leaf"),
            Valid((edit(clean(backend="torchsharp"), members={0: DISPOSED}),),
                  "a disposed member is OC109's, not a non-leaf"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((edit(clean(), members={2: {"is_leaf": False}}),), "a member that is the result of an op",
                    step=100, param="layer2.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        bad = [m for _, m in live_members(snap) if m.get("is_leaf") is False]
        if not bad:
            return []
        names = [name_of(snap, m) for m in bad]
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

    @cases
    def VALID():
        return [
            Valid(steps(clean(backend="torchsharp"), 200), "every tensor once"),
            Valid((edit(clean(backend="torchsharp"), add_params=[param("lm_head.weight", 3333, 11000)]),),
                  "TorchSharp: a tied weight with two handles, given to the optimizer once"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((edit(clean(backend="torchsharp"), add_params=[param("lm_head.weight", 3333, 11000)],
                          add_members=[member(param("lm_head.weight", 3333, 11000))],
                          add_state=[state_of(param("lm_head.weight", 3333, 11000))]),),
                    "TorchSharp: a tied weight's two handles both in the optimizer", step=100, param="lm_head.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        seen: dict[tuple, list[tuple[int, dict]]] = {}
        for gi, m in live_members(snap):
            ident = ("ptr", m["data_ptr"]) if nonempty(m.get("data_ptr")) else ("ref", m["ref"])
            seen.setdefault(ident, []).append((gi, m))
        out = []
        for ident, dup in seen.items():
            if len(dup) < 2:
                continue
            names = sorted({name_of(snap, m) for _, m in dup} | {
                p["name"] for p in snap["params"] if ident[0] == "ptr" and p["data_ptr"] == ident[1]})
            out.append(self.finding(
                snap, self.message.format(k=len(dup), names=listing(names)), subjects=names,
                key=f"{ident[0]}:{ident[1]}",
                next_failure=("each step() updates the tensor once per time it is listed (TorchSharp: one state "
                              "per handle, so separate moment estimates; PyTorch: one state keyed by the tensor, "
                              "whose step count advances as many times): an effectively larger, unscheduled "
                              "learning rate, nothing raises"),
                groups=[gi for gi, _ in dup], refs=[m["ref"] for _, m in dup]))
        return out
