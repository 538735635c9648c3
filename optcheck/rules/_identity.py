"""How the reference rules (``references.py``, ``references_state.py``,
``references_disposed.py``) tell tensors apart and name them.

Two identities are compared (``optcheck.record.snapshot``): ``ref`` (the key the optimizer
state uses) answers "will the state lookup throw"; ``data_ptr`` answers "is the
optimizer still training the model's tensor". Which one makes a parameter depends on
the backend (:func:`identity_by_ref`, ``docs/parameter-identity.md``); whether a
missing state entry will throw depends on when the optimizer creates its state
(:func:`lazy_state`, ``docs/torchsharp.md``).
"""

from __future__ import annotations

import re
from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules.base import Rule, RuleContext


def name_of(snap: dict, member: dict) -> str:
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


def by_identity(cls: type[Rule]) -> type[Rule]:
    """Class decorator: where a parameter is its ref alone (:func:`identity_by_ref`),
    the rule's ``check`` sees the snapshot without data pointers, so a Parameter that
    merely shares a member's storage is not taken for that member (nor named after it)."""
    check = cls.check

    def checked(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        if identity_by_ref(snap):
            snap = {**snap, "params": [{**p, "data_ptr": None} for p in snap["params"]],
                    "groups": [{**g, "members": [{**m, "data_ptr": None} for m in g.get("members", ())]}
                               for g in snap["groups"]]}
        return check(self, snap, ctx)

    cls.check = checked
    return cls


_ORIGINAL = re.compile(r"^(?:(.*)\.)?parametrizations\.([^.]+)\.original\d*$")


def parametrization(name: str) -> str | None:
    """``fc.parametrizations.weight.original0`` → ``fc.parametrizations.weight``
    (``torch.nn.utils.parametrize`` names the tensors a parametrization computes
    ``fc.weight`` from ``original`` or ``original0``, ``original1``, ...), else None."""
    m = _ORIGINAL.match(name)
    return None if m is None else name[:name.rindex(".")]


def parametrized_into(snap: dict, former: str) -> str | None:
    """The parametrization now standing for the former parameter name ``former``
    (``fc.weight`` → ``fc.parametrizations.weight``), if the model has one."""
    head, _, tail = former.rpartition(".")
    target = f"{head}.parametrizations.{tail}" if head else f"parametrizations.{tail}"
    return target if any(parametrization(p["name"]) == target for p in snap["params"]) else None


LATE = "registered after the optimizer was built"


def former_name(ctx: RuleContext, ref: int) -> str | None:
    """The model's name for ``ref`` in the latest earlier snapshot that had it (a
    parameter replaced since: ``model.fc = nn.Linear(...)`` after the optimizer)."""
    for prev in reversed(ctx.history):  # the current snapshot (last) does not have it: it is stale
        for p in prev.get("params") or ():
            if p.get("ref") == ref:
                return p["name"]
    return None


#: What fails next when the optimizer holds disposed tensors (TorchSharp 0.107.0, recorded in
#: ``tests/fixtures/torchsharp/0.107.0-runs/eager-param-list-1000``).
DISPOSED_NEXT = ("TorchSharp: the optimizer still holds the old, disposed tensors; the next zero_grad() "
                  "or step() throws InvalidOperationException: Tensor invalid -- empty handle (OC109)")


def lazy_state(snap: dict) -> bool:
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


def state_keys(snap: dict) -> set[int] | None:
    state = snap.get("state")
    return None if state is None else {s["ref"] for s in state}


def factored(shape, param_shape) -> bool:
    """True when a state tensor's shape broadcasts to its parameter's, every
    differing dimension being 1: a factored statistic, not a resized parameter."""
    return all(a == b or a == 1 for a, b in zip(shape, param_shape))


def nonempty(ptr: int | None) -> bool:
    return bool(ptr)
