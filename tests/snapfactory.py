"""Builds small, valid schema-1 snapshots for rule tests (no torch)."""

from __future__ import annotations

import copy

from optcheck.snapshot import SCHEMA, validate


def param(name: str, ref: int, ptr: int | None = None, *, shape=(4, 4), dtype="float32", leaf=True, rg=True,
          grad="set") -> dict:
    return {"name": name, "ref": ref, "data_ptr": ptr if ptr is not None else ref + 10_000, "shape": list(shape),
            "dtype": dtype, "device": "cpu", "is_leaf": leaf, "requires_grad": rg, "grad": grad,
            "grad_norm": 0.1 if grad == "set" else None, "version": 1}


def member(p: dict, **over) -> dict:
    m = {"ref": p["ref"], "data_ptr": p["data_ptr"], "name": p["name"], "shape": p["shape"], "dtype": p["dtype"],
         "is_leaf": p["is_leaf"], "requires_grad": p["requires_grad"]}
    m.update(over)
    return m


def state_of(p: dict, step: int = 1) -> dict:
    return {"ref": p["ref"], "step": step, "tensors": {
        "step": {"shape": [], "dtype": "float32"},
        "exp_avg": {"shape": p["shape"], "dtype": p["dtype"]},
        "exp_avg_sq": {"shape": p["shape"], "dtype": p["dtype"]}}}


def clean(step: int = 100, backend: str = "pytorch", n: int = 3) -> dict:
    """A consistent snapshot: n params, one group holding all, state for all."""
    ps = [param(f"layer{i}.weight", 1000 + i) for i in range(n)]
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
