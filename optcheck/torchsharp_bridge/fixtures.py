"""The real TorchSharp records of ``tests/fixtures/torchsharp`` as schema-1 snapshots.

Those files were recorded from TorchSharp 0.99.6 by a C# program (their README
describes every field). They are not in optcheck's schema: this module turns each
``snapshot`` record into the snapshot body the .NET probe writes
(``dotnet/Probe/ProbeCore.cs``, ``ProbeCore.Read``) and names its members as a live
TorchSharp worker does (:func:`optcheck.torchsharp_bridge.convert.name_members`), so
tests of the rules run on what TorchSharp really did. The records carry no pre-step
check result, so these bodies have no ``prestep_findings`` and rule OC108 derives its
finding itself. Torch-free.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from optcheck.record.snapshot import SCHEMA, validate
from optcheck.torchsharp_bridge.convert import name_members

BEFORE_STEP_NOTE = "after fault, before step"


def fixture_dir() -> Path | None:
    """The fixtures folder: ``$OPTCHECK_TS_FIXTURES``, else ``tests/fixtures/torchsharp`` of
    the checkout this package runs from; None if neither holds ``*.jsonl`` records (an
    installed wheel ships no tests)."""
    cands = []
    if os.environ.get("OPTCHECK_TS_FIXTURES"):
        cands.append(Path(os.environ["OPTCHECK_TS_FIXTURES"]))
    cands.append(Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "torchsharp")
    for c in cands:
        if c.is_dir() and any(c.glob("*.jsonl")):
            return c
    return None


#: The folder of optcheck's own run directories recorded on TorchSharp 0.107.0, inside
#: :func:`fixture_dir` (its README says what each run did).
RUNS_0107 = "0.107.0-runs"


def run_dirs_0107(directory: str | os.PathLike | None = None) -> dict[str, Path]:
    """``{folder name: path}`` of the recorded 0.107.0 run directories (``snapshots.jsonl``,
    ``findings.jsonl``, ``summary.json``, ...), e.g. ``eager-param-list-1000``.

    Raises:
        FileNotFoundError: no fixtures folder, or it has no ``0.107.0-runs``.
    """
    d = Path(directory) if directory else fixture_dir()
    if d is None or not (d / RUNS_0107).is_dir():
        raise FileNotFoundError("no tests/fixtures/torchsharp/0.107.0-runs folder (set OPTCHECK_TS_FIXTURES)")
    return {p.name: p for p in sorted((d / RUNS_0107).iterdir()) if (p / "snapshots.jsonl").is_file()}


@dataclass
class FixtureRun:
    """One fixture file: ``meta`` record, schema-1 ``snapshots`` in file order, and the
    ``fault`` / ``exception`` records as they are (``type``, ``message``, ``stack``)."""

    name: str
    meta: dict
    snapshots: list[dict] = field(default_factory=list)
    faults: list[dict] = field(default_factory=list)
    exceptions: list[dict] = field(default_factory=list)




def _dtype(name: str | None) -> str | None:
    """PyTorch's spelling of a recorded TorchSharp dtype ("Float32" -> "float32"), as
    ``DTypes.Normalize`` (dotnet/Probe/StateReader.cs) writes it."""
    if name is None:
        return None
    n = name.rsplit(".", 1)[-1].lower()
    return {"float": "float32", "single": "float32", "double": "float64", "half": "float16",
            "long": "int64", "int": "int32"}.get(n, n)


def body_from_record(rec: dict) -> dict:
    """The snapshot body (``params``, ``groups``, ``state``, ``optimizer``, ``memory``,
    ``notes``) of one fixture ``snapshot`` record, field for field what ``ProbeCore.Read``
    writes. Member names are left None, as the .NET probe leaves them when a member is
    not a model parameter by handle or data pointer; a member's shape (not recorded) is
    the model parameter's with its handle, else its data pointer, else []."""
    params, by_handle, by_ptr = [], {}, {}
    for p in rec["params"]:
        grad = p["grad"] == "set"
        params.append({"name": p["name"], "ref": p["handle"], "data_ptr": p["data_ptr"], "shape": list(p["shape"]),
                       "dtype": _dtype(p["dtype"]), "is_leaf": p["is_leaf"], "requires_grad": p["requires_grad"],
                       "device": "cpu", "grad": "set" if grad else "none",
                       "grad_norm": p.get("grad_norm") if grad else None, "version": None})
        by_handle.setdefault(p["handle"], p)
        by_ptr.setdefault(p["data_ptr"], p)
    groups = []
    for gi, g in enumerate(rec["groups"]):
        opts = {k: [float(x) for x in v] if k == "betas" else float(v) for k, v in g["options"].items()}
        members = []
        for j, h in enumerate(g["members"]):
            ptr = g["member_data_ptrs"][j]
            src = by_handle.get(h) or by_ptr.get(ptr)
            members.append({"name": None, "ref": h, "data_ptr": ptr, "shape": list(src["shape"]) if src else [],
                            "dtype": _dtype(g["member_dtypes"][j]), "is_leaf": g["member_is_leaf"][j], "requires_grad": True})
        groups.append({"index": gi, "options": opts, "members": members})
    state, state_bytes = None, 0
    if rec.get("state") is not None:
        state = []
        for s in rec["state"]:
            tensors = {name: {"shape": list(shape), "dtype": None} for name, shape in (s.get("tensors") or {}).items()}
            state_bytes += sum(math.prod(t["shape"]) * 4 for t in tensors.values())  # dtype not recorded: 4
            state.append({"ref": s["key"], "step": s.get("step"), "tensors": tensors})
    mem = rec.get("memory") or {}
    memory = {k: int(mem[k]) for k in ("rss_bytes", "live_tensors", "peak_tensors", "managed_bytes")
              if mem.get(k) is not None and int(mem[k]) >= 0}
    if state is not None:
        memory["state_bytes"] = state_bytes
    return {"params": params, "groups": groups, "state": state,
            "optimizer": {"type": "AdamW", "state_init": "eager"}, "memory": memory,
            "notes": [] if state is not None else ["optimizer state not readable"]}


def snapshot_from_record(rec: dict, run: str, meta: dict, known: dict[int, str] | None = None) -> dict:
    """One schema-1 snapshot (``backend: "torchsharp"``) from a fixture ``snapshot`` record.
    ``known`` maps handles seen in earlier snapshots to names (updated in place)."""
    body = body_from_record(rec)
    if known is not None:
        name_members(body, known)
    before = rec.get("note") == BEFORE_STEP_NOTE
    snap = {"schema": SCHEMA, "backend": "torchsharp", "run": run, "step": int(rec["step"]),
            "phase": "pre-step" if before else "post-step", "trigger": "check" if before else "cadence",
            "elapsed_s": None, "loss": None if before else rec.get("loss"), "val_loss": None, "step_time_s": None,
            "versions": {"torchsharp": meta.get("torchsharp"), "libtorch": meta.get("libtorch"),
                         "dotnet": meta.get("dotnet")},
            "threads": 1, **body, "events": []}
    return validate(snap)


def load_fixture(path: str | os.PathLike) -> FixtureRun:
    """Read one fixture file into a :class:`FixtureRun`.

    Raises:
        FileNotFoundError; ValueError for a line that is not JSON; SchemaError if a
        converted snapshot is not schema 1.
    """
    path = Path(path)
    name = path.stem
    run = FixtureRun(name=name, meta={})
    known: dict[int, str] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
            kind = rec.get("kind")
            if kind == "meta":
                run.meta = rec
            elif kind == "snapshot":
                run.snapshots.append(snapshot_from_record(rec, name, run.meta, known))
            elif kind == "fault":
                run.faults.append(rec)
            elif kind == "exception":
                run.exceptions.append(rec)
    return run


def load_all(directory: str | os.PathLike | None = None) -> dict[str, FixtureRun]:
    """Every ``*.jsonl`` fixture, keyed by scenario (the ``meta`` record's ``scenario``)."""
    d = Path(directory) if directory else fixture_dir()
    if d is None:
        raise FileNotFoundError("no tests/fixtures/torchsharp folder (set OPTCHECK_TS_FIXTURES)")
    out = {}
    for p in sorted(d.glob("*.jsonl")):
        run = load_fixture(p)
        out[run.meta.get("scenario", p.stem)] = run
    return out
