"""The real TorchSharp records of ``tests/fixtures/torchsharp`` as schema-1 snapshots.

Those files were recorded from TorchSharp 0.99.6 by a C# program (their README
describes every field). They are not in optcheck's schema: this module turns each
``snapshot`` record into the flat arrays the .NET probe returns
(``dotnet/Probe/ProbeCore.cs``) and runs them through the same conversion as a
live TorchSharp worker (:func:`optcheck.torchsharp_bridge.convert.body_from_arrays`),
so tests of the conversion and of the rules run on what TorchSharp really did.
Torch-free.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from optcheck.snapshot import SCHEMA, validate
from optcheck.torchsharp_bridge.convert import GRAD_SET, LEAF, REQUIRES_GRAD, body_from_arrays, name_members

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


def arrays_from_record(rec: dict) -> dict:
    """The flat probe arrays (as ``convert.read_probe`` returns them) for one fixture
    ``snapshot`` record. Member names are left None, as the .NET probe leaves them when
    a member is not a model parameter by handle or data pointer."""
    a: dict = {k: [] for k in (
        "ParamNames", "ParamHandles", "ParamDataPtrs", "ParamFlags", "ParamGradNorms", "ParamRanks", "ParamShapes",
        "ParamDTypes", "ParamDevices", "GroupSizes", "GroupOptionCounts", "GroupOptionNames", "GroupOptionValues",
        "MemberNames", "MemberHandles", "MemberDataPtrs", "MemberFlags", "MemberRanks", "MemberShapes",
        "MemberDTypes", "StateKeys", "StateSteps", "StateTensorCounts", "StateTensorNames", "StateTensorRanks",
        "StateTensorShapes", "StateTensorDTypes", "Notes")}
    by_handle, by_ptr = {}, {}
    for p in rec["params"]:
        a["ParamNames"].append(p["name"])
        a["ParamHandles"].append(p["handle"])
        a["ParamDataPtrs"].append(p["data_ptr"])
        a["ParamFlags"].append((LEAF if p["is_leaf"] else 0) | (REQUIRES_GRAD if p["requires_grad"] else 0)
                               | (GRAD_SET if p["grad"] == "set" else 0))
        a["ParamGradNorms"].append(p["grad_norm"] if p.get("grad_norm") is not None else float("nan"))
        a["ParamRanks"].append(len(p["shape"]))
        a["ParamShapes"].extend(p["shape"])
        a["ParamDTypes"].append(p["dtype"])
        a["ParamDevices"].append("cpu")
        by_handle.setdefault(p["handle"], p)
        by_ptr.setdefault(p["data_ptr"], p)
    for g in rec["groups"]:
        opts = dict(g["options"])
        names, values = [], []
        for k, v in opts.items():
            if k == "betas":
                names += ["beta1", "beta2"]
                values += [float(v[0]), float(v[1])]
            else:
                names.append(k)
                values.append(float(v))
        a["GroupOptionCounts"].append(len(names))
        a["GroupOptionNames"].extend(names)
        a["GroupOptionValues"].extend(values)
        a["GroupSizes"].append(len(g["members"]))
        for j, h in enumerate(g["members"]):
            ptr = g["member_data_ptrs"][j]
            leaf = g["member_is_leaf"][j]
            # The record has no shape per member: take the model's by handle, else by data pointer.
            src = by_handle.get(h) or by_ptr.get(ptr)
            shape = src["shape"] if src else []
            a["MemberNames"].append(None)
            a["MemberHandles"].append(h)
            a["MemberDataPtrs"].append(ptr)
            a["MemberFlags"].append((LEAF if leaf else 0) | REQUIRES_GRAD)
            a["MemberRanks"].append(len(shape))
            a["MemberShapes"].extend(shape)
            a["MemberDTypes"].append(g["member_dtypes"][j])
    state = rec.get("state")
    a["StateReadable"] = state is not None
    for s in state or ():
        a["StateKeys"].append(s["key"])
        a["StateSteps"].append(s["step"] if s.get("step") is not None else -1)
        tensors = s.get("tensors") or {}
        a["StateTensorCounts"].append(len(tensors))
        for tname, shape in tensors.items():
            a["StateTensorNames"].append(tname)
            a["StateTensorRanks"].append(len(shape))
            a["StateTensorShapes"].extend(shape)
            a["StateTensorDTypes"].append(None)  # not recorded
    mem = rec.get("memory") or {}
    a["OptimizerType"] = "AdamW"
    a["LiveTensors"] = mem.get("live_tensors", -1)
    a["PeakTensors"] = mem.get("peak_tensors", -1)
    a["ManagedBytes"] = mem.get("managed_bytes", -1)
    a["RssBytes"] = mem.get("rss_bytes", -1)
    a["ProbeSeconds"] = 0.0
    return a


def snapshot_from_record(rec: dict, run: str, meta: dict, known: dict[int, str] | None = None) -> dict:
    """One schema-1 snapshot (``backend: "torchsharp"``) from a fixture ``snapshot`` record.
    ``known`` maps handles seen in earlier snapshots to names (updated in place)."""
    body = body_from_arrays(arrays_from_record(rec))
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
