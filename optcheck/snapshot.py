"""Snapshot schema 1: what a worker records of a model and its optimizer.

A snapshot is one JSON object (one line of ``snapshots.jsonl``). It is
backend-neutral: the PyTorch probe (``optcheck/pytorch/probe.py``) and the
TorchSharp bridge (``optcheck/torchsharp_bridge/``) fill the same fields, and the
rules (``optcheck/rules/``) read nothing else. This module imports neither torch
nor .NET.

Top-level fields (``*`` = required)::

    schema*      "optcheck.snapshot/1"
    backend*     "pytorch" | "torchsharp"
    run*         run id (str)
    step*        training step the snapshot belongs to (int, 1-based; 0 = before
                 the first step)
    phase*       "post-step" (after optimizer.step() of ``step``) or "pre-step"
                 (before optimizer.step() of ``step``, after anything injected or
                 done to the model at that step)
    trigger*     why it was taken: "cadence" (every ``--every`` steps), "check" (the
                 per-step identity check saw the model and optimizer disagree),
                 "hazard" (a hazard probe recorded an event), "lifecycle"
                 (after eval/checkpoint/resume), "start", "final"
    elapsed_s    seconds since the worker started training (float)
    loss         training loss of ``step`` (float or null)
    val_loss     held-out loss if computed at this step (float or null)
    step_time_s  mean wall seconds per step since the previous snapshot
    versions     {"python": ..., "torch": ..., "torchsharp": ..., "dotnet": ...}
    threads      intra-op threads of the backend (int)
    params*      list of Param (the model's parameters, ``named_parameters()``)
    groups*      list of Group (the optimizer's param groups)
    state        list of State, or null when the optimizer state cannot be read
                 (``notes`` then says why)
    memory       Memory
    events       list of Event recorded since the previous snapshot
    notes        list of str: anything the probe could not read, and why

Param::

    name, ref (int), data_ptr (int), shape (list[int]), dtype (str), device (str),
    is_leaf (bool), requires_grad (bool), grad ("set" | "none"),
    grad_norm (float | null, L2 norm of .grad), version (int | null: the version
    counter, ``Tensor._version``)

Two identities per tensor: ``ref`` is what the optimizer keys
its state by (PyTorch: ``id(param)``; TorchSharp: ``Tensor.Handle``, the address
of the native tensor *wrapper*), ``data_ptr`` is the address of the tensor's
data (PyTorch ``Tensor.data_ptr()``; TorchSharp ``THSTensor_data``). "Will the
state lookup throw" is a question about ``ref``; "is the optimizer still training
the model's tensor" is a question about ``data_ptr``.

Group::

    index (int), options (dict: lr, betas, eps, weight_decay, ...),
    members: list of Member {ref, data_ptr, name (str | null), shape, dtype,
    is_leaf, requires_grad}

State (one per key of the optimizer's per-parameter state)::

    ref (int: the key), step (int | null), tensors: {key: {"shape": [...],
    "dtype": str}}

Memory (every field optional; bytes are bytes, not MiB; ``docs/memory.md`` says
which backend records what, and how)::

    rss_bytes            resident set size of the worker process
    heap_in_use_bytes    bytes malloc has handed out and not taken back (glibc
                         mallinfo2 uordblks + hblkhd; PyTorch, every snapshot)
    live_tensors         live tensor count (PyTorch: census of gc-tracked tensors
                         after gc.collect(), every 10th snapshot; TorchSharp:
                         Tensor.TotalCount after GC.Collect())
    live_tensor_bytes    bytes of their storages, each counted once (PyTorch)
    peak_tensors         Tensor.PeakCount, the high-water mark since the process
                         started (TorchSharp)
    tensors_created_outside_scope, tensors_disposed_outside_scope
                         cumulative counts of the training thread's
                         DisposeScopeManager.Statistics (TorchSharp)
    state_bytes          bytes of the optimizer-state tensors
    managed_bytes        .NET GC heap (GC.GetTotalMemory(false))
    device_allocated_bytes, device_reserved_bytes, device_alloc_retries
                         CUDA caching allocator (torch.cuda.memory_stats)

Event::

    kind (str, e.g. "inject", "lifecycle", "nonleaf_grad_access",
    "inplace_on_saved", "graph_cut", "nonfinite", "exception"), step (int),
    where (str | null: "file.py:88"), count (int), detail (dict)
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Iterator

SCHEMA = "optcheck.snapshot/1"
BACKENDS = ("pytorch", "torchsharp")
PHASES = ("pre-step", "post-step")
TRIGGERS = ("cadence", "check", "hazard", "lifecycle", "start", "final")

_REQUIRED = ("schema", "backend", "run", "step", "phase", "trigger", "params", "groups")
_PARAM_REQUIRED = ("name", "ref", "data_ptr", "shape", "dtype", "is_leaf", "requires_grad", "grad")
_MEMBER_REQUIRED = ("ref", "data_ptr")


class SchemaError(ValueError):
    """A snapshot does not follow schema 1; the message names the field."""


def validate(snap: Any) -> dict:
    """Check that ``snap`` is a schema-1 snapshot and return it unchanged.

    Raises:
        SchemaError: naming the first missing or ill-typed field.
    """
    if not isinstance(snap, dict):
        raise SchemaError(f"snapshot is a {type(snap).__name__}, not a JSON object")
    for key in _REQUIRED:
        if key not in snap:
            raise SchemaError(f"snapshot has no {key!r} field")
    if snap["schema"] != SCHEMA:
        raise SchemaError(f"unknown schema {snap['schema']!r} (expected {SCHEMA!r})")
    if snap["backend"] not in BACKENDS:
        raise SchemaError(f"unknown backend {snap['backend']!r}")
    if not isinstance(snap["step"], int) or snap["step"] < 0:
        raise SchemaError(f"step must be a non-negative integer, got {snap['step']!r}")
    if snap["phase"] not in PHASES:
        raise SchemaError(f"phase must be one of {PHASES}, got {snap['phase']!r}")
    if not isinstance(snap["params"], list) or not isinstance(snap["groups"], list):
        raise SchemaError("params and groups must be lists")
    for i, p in enumerate(snap["params"]):
        for key in _PARAM_REQUIRED:
            if key not in p:
                raise SchemaError(f"params[{i}] has no {key!r} field")
    for g in snap["groups"]:
        for j, m in enumerate(g.get("members", ())):
            for key in _MEMBER_REQUIRED:
                if key not in m:
                    raise SchemaError(f"groups[{g.get('index')}].members[{j}] has no {key!r} field")
    state = snap.get("state")
    if state is not None and not isinstance(state, list):
        raise SchemaError("state must be a list or null")
    return snap


def clean_json(obj: Any) -> Any:
    """Replace NaN/Inf floats by strings so the line stays strict JSON."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_json(v) for v in obj]
    return obj


def to_float(value: Any) -> float | None:
    """Read a float field written by :func:`dumps` ("nan"/"inf" strings included)."""
    if value is None:
        return None
    if isinstance(value, str):
        return float(value)
    return float(value)


def dumps(obj: dict) -> str:
    """One JSON line (no trailing newline); non-finite floats become "nan"/"inf"."""
    return json.dumps(clean_json(obj), separators=(",", ":"), allow_nan=False)


def loads(line: str) -> dict:
    """Parse and validate one snapshot line. Raises SchemaError or ValueError."""
    return validate(json.loads(line))


@dataclass
class StreamDefect:
    """A line of a JSON Lines file that could not be read (1-based ``line``)."""

    line: int
    reason: str


def read_jsonl(path: str | os.PathLike, defects: list[StreamDefect] | None = None) -> Iterator[dict]:
    """Yield the JSON objects of a JSON Lines file.

    A run killed mid-write leaves at most a truncated last line: it is skipped and
    recorded in ``defects`` (when given) instead of raising, so a report written so
    far stays readable. Any other unreadable line raises ValueError naming it.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line other than the last is not JSON.
    """
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for n, raw in enumerate(lines, start=1):
        raw = raw.strip()
        if not raw:
            continue
        try:
            yield json.loads(raw)
        except json.JSONDecodeError as e:
            if n == len(lines):
                if defects is not None:
                    defects.append(StreamDefect(n, f"truncated last line ({e.msg})"))
                return
            raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None


def read_snapshots(path: str | os.PathLike, defects: list[StreamDefect] | None = None) -> list[dict]:
    """Read a recorded snapshot stream (``snapshots.jsonl``), validating every line.

    Lines that are not snapshots (e.g. a protocol message with another ``type``)
    are skipped; a line wrapped as ``{"type": "snapshot", "snapshot": {...}}`` is
    unwrapped.

    Raises:
        FileNotFoundError, ValueError, SchemaError (with the line number).
    """
    out = []
    for n, obj in enumerate(read_jsonl(path, defects), start=1):
        if isinstance(obj, dict) and obj.get("type") == "snapshot" and "snapshot" in obj:
            obj = obj["snapshot"]
        if isinstance(obj, dict) and "schema" not in obj and "type" in obj:
            continue
        try:
            out.append(validate(obj))
        except SchemaError as e:
            raise SchemaError(f"{path}: record {n}: {e}") from None
    return out


def param_by_name(snap: dict) -> dict[str, dict]:
    """``{name: Param}`` of a snapshot's model parameters."""
    return {p["name"]: p for p in snap["params"]}


def members(snap: dict) -> list[tuple[int, dict]]:
    """Every optimizer member as ``(group index, Member)``, in group order."""
    return [(g.get("index", i), m) for i, g in enumerate(snap["groups"]) for m in g.get("members", ())]


def assemble(*, backend: str, run: str, step: int, phase: str, trigger: str, body: dict, events: list[dict],
             loss: float | None = None, val_loss: float | None = None, elapsed_s: float | None = None,
             step_time_s: float | None = None, versions: dict | None = None, threads: int | None = None) -> dict:
    """A schema-1 snapshot from a backend probe's ``body`` (params, groups, state,
    optimizer, memory, notes) and the loop's bookkeeping. Used by the soak loop and
    by ``optcheck.Monitor``, so both write the same thing."""
    snap = {"schema": SCHEMA, "backend": backend, "run": run, "step": step, "phase": phase, "trigger": trigger,
            "elapsed_s": None if elapsed_s is None else round(elapsed_s, 4), "loss": loss, "val_loss": val_loss,
            "step_time_s": step_time_s, "versions": versions or {}, "threads": threads}
    snap.update(body)
    snap["events"] = list(events) + list(body.get("events", ()))
    return snap
