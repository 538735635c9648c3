"""VALID and INVALID examples of the rules, in the manner of Instagram's Fixit.

Every rule class carries ``VALID`` and ``INVALID``: lists of :class:`Valid` and
:class:`Invalid` cases, each a short sequence of schema-1 snapshots (or, for a rule
over two runs such as OC601, a pair of loss trajectories). One generic test
(``tests/unit/test_rule_fixtures.py``) runs the whole catalogue on every case: a
``Valid`` case must give no finding of the rule's code, an ``Invalid`` case a finding
of that code at ``step`` (naming ``param`` among its subjects, when given). The
catalogue test requires at least one of each per rule.

The builders below make small, valid snapshots with no torch (rules are torch-free
and so are their examples). Every builder returns a new dict; none changes its
argument. The cases are built on first access (:class:`cases`), not at import.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable

from optcheck.record.snapshot import SCHEMA, validate


@dataclass(frozen=True)
class Valid:
    """A case on which the rule must stay silent.

    Attributes:
        snaps: the snapshot sequence (schema 1, oldest first), fed to a fresh engine.
        note: what the case shows, in a few words (the test id).
        config: ``RuleConfig`` fields to override for this case.
        losses: for a rule over two runs (OC601): the two runs' ``{step: loss}``;
            ``snaps`` is then empty.
    """

    snaps: tuple[dict, ...] = ()
    note: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    losses: tuple[dict[int, float], dict[int, float]] | None = None


@dataclass(frozen=True)
class Invalid(Valid):
    """A case the rule must report: a finding of its code at ``step``.

    Attributes:
        step: the step of the finding (the snapshot's, or the first step where two
            runs' losses part for OC601).
        param: a name the finding's ``subjects`` must hold (a parameter, a metric,
            a module), or None to check the code and step only.
    """

    step: int = 0
    param: str | None = None


class cases:
    """Decorator for a rule's ``VALID`` / ``INVALID``: a function returning its cases,
    called on first access and its list kept as the class attribute. The examples are
    built only when a test reads them, never when a worker imports the rules.

    Example::

        @cases
        def VALID():
            return [Valid(steps(clean(), 200), "a consistent model and optimizer")]
    """

    def __init__(self, build):
        self.build, self.name = build, build.__name__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner):
        value = list(self.build())
        setattr(owner, self.name, value)
        return value


# -- builders -----------------------------------------------------------------

def param(name: str, ref: int, ptr: int | None = None, *, shape=(4, 4), dtype="float32", leaf=True, rg=True,
          grad="set") -> dict:
    """A model parameter record; ``ptr`` defaults to ``ref + 10_000``."""
    return {"name": name, "ref": ref, "data_ptr": ptr if ptr is not None else ref + 10_000, "shape": list(shape),
            "dtype": dtype, "device": "cpu", "is_leaf": leaf, "requires_grad": rg, "grad": grad,
            "grad_norm": 0.1 if grad == "set" else None, "version": 1}


def member(p: dict, **over) -> dict:
    """The param-group member record of parameter ``p`` (fields in ``over`` replaced)."""
    m = {"ref": p["ref"], "data_ptr": p["data_ptr"], "name": p["name"], "shape": p["shape"], "dtype": p["dtype"],
         "is_leaf": p["is_leaf"], "requires_grad": p["requires_grad"]}
    m.update(over)
    return m


def state_of(p: dict, step: int = 1) -> dict:
    """AdamW's state record of parameter ``p``: a step count and two moments of its shape."""
    return {"ref": p["ref"], "step": step, "tensors": {
        "step": {"shape": [], "dtype": "float32"},
        "exp_avg": {"shape": p["shape"], "dtype": p["dtype"]},
        "exp_avg_sq": {"shape": p["shape"], "dtype": p["dtype"]}}}


def clean(step: int = 100, backend: str = "pytorch", n: int = 3, first_ref: int = 1000) -> dict:
    """A consistent post-step snapshot: ``n`` params ``layer{i}.weight`` (refs
    ``first_ref``...), one group holding all, AdamW state for all (lazy on PyTorch,
    eager on TorchSharp)."""
    ps = [param(f"layer{i}.weight", first_ref + i) for i in range(n)]
    snap = {"schema": SCHEMA, "backend": backend, "run": "t", "step": step, "phase": "post-step",
            "trigger": "cadence", "loss": 2.0, "params": ps,
            "groups": [{"index": 0, "options": {"lr": 1e-3}, "members": [member(p) for p in ps]}],
            "state": [state_of(p, step) for p in ps],
            "optimizer": {"type": "AdamW", "state_init": "lazy" if backend == "pytorch" else "eager"},
            "memory": {"rss_bytes": 100 << 20}, "events": [], "notes": []}
    return validate(snap)


def at(snap: dict, step: int) -> dict:
    """A copy of ``snap`` at another step; parameters' version counters follow the
    step, as the optimizer's in-place updates would make them."""
    s = copy.deepcopy(snap)
    s["step"] = step
    for p in s["params"]:
        p["version"] = step
    return s


def steps(snap: dict, *at_steps: int) -> tuple[dict, ...]:
    """``snap`` followed by copies of it at ``at_steps`` (:func:`at`): a healthy stream."""
    return (snap, *(at(snap, s) for s in at_steps))


def edit(snap: dict, *, params: dict[int, dict] | None = None, add_params: Iterable[dict] = (),
         members: dict[int, dict] | None = None, add_members: Iterable[dict] = (),
         state: Iterable[dict] | None = None, add_state: Iterable[dict] = (), **top) -> dict:
    """A copy of ``snap`` with changes: ``params={i: record}`` replaces the model's
    i-th parameter, ``members={i: {field: value}}`` updates group 0's i-th member,
    ``add_*`` append, ``state`` replaces the state list, other keywords set
    top-level fields (``phase``, ``loss``, ``backend``, ``optimizer``, ...)."""
    s = copy.deepcopy(snap)
    for i, p in (params or {}).items():
        s["params"][i] = copy.deepcopy(p)
    s["params"].extend(copy.deepcopy(list(add_params)))
    for i, over in (members or {}).items():
        s["groups"][0]["members"][i] = {**s["groups"][0]["members"][i], **over}
    s["groups"][0]["members"].extend(copy.deepcopy(list(add_members)))
    if state is not None:
        s["state"] = copy.deepcopy(list(state))
    s["state"].extend(copy.deepcopy(list(add_state)))
    s.update(copy.deepcopy(top))
    return s


def with_dtype(snap: dict, dtype: str) -> dict:
    """A copy whose parameters and members are ``dtype`` (``model.to(dtype)`` in
    place, the optimizer state left as it was)."""
    s = copy.deepcopy(snap)
    for p in s["params"]:
        p["dtype"] = dtype
    for m in s["groups"][0]["members"]:
        m["dtype"] = dtype
    return s


def on_device(snap: dict, device: str, state_keys_left_on_cpu: Iterable[str] = ()) -> dict:
    """A copy whose parameters are on ``device`` (``"cuda:0"``); the optimizer-state tensors named
    in ``state_keys_left_on_cpu`` stay on the CPU (recorded with ``device``, as the probe records a
    state tensor on another device than its parameter), the others moved with them."""
    s = copy.deepcopy(snap)
    for p in s["params"]:
        p["device"] = device
    for st in s["state"]:
        for key, t in st["tensors"].items():
            if key in state_keys_left_on_cpu:
                t["device"] = "cpu"
    return s


def with_params(snap: dict, **fields) -> dict:
    """A copy in which every parameter's ``fields`` are set (``version=1``: no in-place write)."""
    s = copy.deepcopy(snap)
    for p in s["params"]:
        p.update(copy.deepcopy(fields))
    return s


def with_lr(snap: dict, lr: float) -> dict:
    """A copy whose param groups all have learning rate ``lr``."""
    s = copy.deepcopy(snap)
    for g in s["groups"]:
        g["options"]["lr"] = lr
    return s


def with_grads(snap: dict, names: Iterable[str], grad: str = "none", grad_norm: Any = None) -> dict:
    """A copy in which the named parameters' ``grad`` / ``grad_norm`` are replaced."""
    s = copy.deepcopy(snap)
    names = set(names)
    for p in s["params"]:
        if p["name"] in names:
            p["grad"], p["grad_norm"] = grad, grad_norm
    return s


def event(kind: str, step: int, where: str | None = None, count: int = 1, **detail) -> dict:
    """A hazard event record (``optcheck.record.snapshot``'s Event)."""
    return {"kind": kind, "step": step, "where": where, "count": count, "detail": detail}


def with_events(snap: dict, *events: dict) -> dict:
    """A copy of ``snap`` carrying ``events``."""
    return edit(snap, events=list(events))


def memory_stream(at_steps: Iterable[int], backend: str = "pytorch", **series) -> tuple[dict, ...]:
    """Snapshots without parameters whose ``memory`` block holds ``series``: each a
    function of the step (``rss_bytes=lambda s: ...``); the last snapshot is "final"."""
    at_steps = list(at_steps)
    out = []
    for i, s in enumerate(at_steps):
        out.append(validate({"schema": SCHEMA, "backend": backend, "run": "t", "step": int(s),
                             "phase": "post-step", "trigger": "final" if i == len(at_steps) - 1 else "cadence",
                             "params": [], "groups": [],
                             "memory": {k: float(f(s)) for k, f in series.items()}}))
    return tuple(out)


def wobble(step: int, amplitude: float) -> float:
    """A deterministic zero-mean wobble of ``amplitude`` (RSS-like noise, no RNG)."""
    return amplitude * (((step * 7919) % 101) / 50.0 - 1.0)


def disposed_after_to_dtype(n: int = 3) -> tuple[dict, dict]:
    """TorchSharp 0.107 after ``model.to(float64)`` with an eager parameter list, as
    the probe records it: at step 900 a clean snapshot; at the pre-step check of
    step 1000 the model has new float64 tensors, the optimizer holds the disposed
    old ones (and their state)."""
    before = clean(900, "torchsharp", n)
    after = edit(at(before, 1000), phase="pre-step",
                 params={i: param(f"layer{i}.weight", 1007 + i, 11007 + i, dtype="float64") for i in range(n)},
                 members={i: DISPOSED for i in range(n)})
    return before, after


DISPOSED = {"ref": 0, "data_ptr": 0, "name": None, "shape": [], "dtype": "disposed", "is_leaf": False,
            "requires_grad": False}
"""A param-group member whose TorchSharp tensor was disposed, as the probe records it."""


def loss_curve(steps: int = 1000, *, offset_from: int | None = None, offset: float = 0.5,
               jitter: float = 0.0) -> dict[int, float]:
    """``{step: loss}`` of a run whose loss falls from 5.5 towards 1.5 with batch-to-batch
    noise (deterministic); ``offset`` added from step ``offset_from`` on (a run that parts
    from the other there); ``jitter``: a second, independent wobble (another seed)."""
    import math

    return {s: 4.0 * math.exp(-s / 400) + 1.5 + 0.05 * math.sin(s) + jitter * math.cos(3 * s)
            + (offset if offset_from is not None and s >= offset_from else 0.0) for s in range(1, steps + 1)}


# -- torch.distributed: the cross-rank table (OC701-OC707) ------------------------------

BUFFERS = ("bn.running_mean",)
"""The buffer names of :func:`ranks`' table (one BatchNorm running mean)."""


def rank_row(snap: dict, rank: int) -> dict:
    """Rank ``rank``'s row of the table the ranks of a healthy job exchange at ``snap``
    (``optcheck/distributed/table.py``): the step, the hashes of the param groups' keys
    and options, per parameter a checksum, a gradient count and an optimizer-state step
    count, per buffer a checksum — the same on every rank."""
    step, n = snap["step"], len(snap["params"])
    return {"rank": rank, "step": step, "iteration": step, "groups_keys": 11, "groups_options": 12,
            "checksums": [7_000 + i for i in range(n)], "grads": [step] * n, "state_steps": [step] * n,
            "buffers": [9_000 + i for i in range(len(BUFFERS))]}


def ranks(snap: dict, world: int = 2, *, kind: str = "ddp", rows: dict[int, dict] | None = None,
          sharded: Iterable[str] = (), groups: list | None = None) -> dict:
    """A copy of ``snap`` carrying the cross-rank table (schema ``$defs/ranks``) of a
    ``world``-rank ``kind`` job ("ddp", "fsdp", "none") whose ranks agree
    (:func:`rank_row`), except that ``rows={rank: {field: value}}`` replaces fields of
    that rank's row. ``sharded``: names of FSDP-sharded parameters (their checksums
    are local shards, not compared); ``groups``: the gathered param-group detail."""
    s = copy.deepcopy(snap)
    table_rows = [rank_row(s, r) for r in range(world)]
    for r, over in (rows or {}).items():
        table_rows[r].update(copy.deepcopy(over))
    s["ranks"] = {"world": world, "kind": kind, "iteration": s["step"], "params": [p["name"] for p in s["params"]],
                  "sharded": list(sharded), "buffers": list(BUFFERS), "rows": table_rows,
                  "groups": copy.deepcopy(groups)}
    return validate(s)


def rank_groups(*lrs: float) -> list[dict]:
    """The gathered param-group detail of ranks 0, 1, ...: one group each, holding
    ``layer0-2.weight``, whose learning rate is ``lrs[rank]``."""
    names = [f"layer{i}.weight" for i in range(3)]
    return [{"rank": r, "groups": [{"keys": ["lr", "params"], "members": names, "options": {"lr": lr}}]}
            for r, lr in enumerate(lrs)]
