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
                 done to the model at that step), or "in-step" (TorchSharp: read
                 inside the trainer's step, at its own optimizer call, before that
                 call ran: a fault planted in the user's step)
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
    prestep_findings  (TorchSharp) what the worker's pre-step check found: list of
                 {code (OC101/102/103/108/109), line, names, refs, predicted_exception,
                 predicted_key}; OC108 takes its finding from it (``docs/dotnet.md``)

Param::

    name, ref (int), data_ptr (int), shape (list[int]), dtype (str), device (str),
    is_leaf (bool), requires_grad (bool), grad ("set" | "none"),
    grad_norm (float | null, L2 norm of .grad), version (int | null: the version
    counter, ``Tensor._version``), checksum (int | null, optional: the sum of the
    values' bit patterns, wrapping; equal in two snapshots iff the values did not
    move, whatever kernel wrote them — fused optimizers do not bump ``version``;
    PyTorch records it where neither ``version`` nor the optimizer's step count for
    the tensor moved since its previous snapshot, and null where one did: that
    signal already says it was stepped),
    value_norm (float, optional: L2 norm of the
    values in float32, the parameter fingerprint ``optcheck.judge.verdict`` compares;
    PyTorch records it,
    shard_empty (true, optional: under FSDP1 with ``use_orig_params=True`` this rank's
    shard holds none of the parameter; it never has a gradient or state here)

Two identities per tensor (``docs/parameter-identity.md``): ``ref`` is what the optimizer keys
its state by (PyTorch: ``id(param)``; TorchSharp: ``Tensor.Handle``, the address
of the native tensor *wrapper*), ``data_ptr`` is the address of the tensor's
data (PyTorch ``Tensor.data_ptr()``; TorchSharp ``THSTensor_data``). "Will the
state lookup throw" is a question about ``ref``; "is the optimizer still training
the model's tensor" is a question about ``data_ptr``.

Group::

    index (int), options (dict: lr, betas, eps, weight_decay, ...),
    members: list of Member {ref, data_ptr, name (str | null), shape, dtype,
    is_leaf, requires_grad}; a member whose tensor was disposed (TorchSharp) has
    ``dtype`` "disposed", ref 0, data_ptr 0, no name and no shape
    (:func:`is_disposed`)

State (one per parameter key of the optimizer's per-parameter state)::

    ref (int: the key), step (int | null), tensors: {key: {"shape": [...],
    "dtype": str, "device": str (optional: only where it differs from the
    parameter's)}}; a key is the tensor's path below the parameter's state, dotted
    where the state nests dicts or lists (``"exp_avg"``, heavyball's
    ``"0.update_by_adam_exp_avg_0"``, SOAP's ``"Q.1"``); keys of the optimizer
    state that are not parameters, and values that cannot be read, are left out
    and said once in ``notes`` (``docs/optimizers.md``)

Memory (every field optional; bytes are bytes, not MiB; ``docs/memory.md`` says
which backend records what, and how)::

    rss_bytes            resident set size of the worker process
    heap_in_use_bytes    bytes malloc has handed out and not taken back (glibc
                         mallinfo2 uordblks + hblkhd; PyTorch, every snapshot)
    live_tensors         live tensor count (PyTorch: census of gc-tracked tensors
                         after gc.collect(), every 10th snapshot, walking only
                         objects made since the first census; TorchSharp:
                         Tensor.TotalCount after GC.Collect())
    live_tensor_bytes    bytes of their storages, each counted once (PyTorch)
    peak_tensors         Tensor.PeakCount, the high-water mark since the process
                         started (TorchSharp)
    tensors_created_outside_scope, tensors_disposed_outside_scope
                         cumulative counts of the training thread's
                         DisposeScopeManager.Statistics (TorchSharp)
    state_bytes          bytes of the optimizer-state tensors
    managed_bytes        .NET GC heap (GC.GetTotalMemory(false))
    device_allocated_bytes, device_reserved_bytes, device_peak_allocated_bytes,
    device_alloc_retries
                         CUDA caching allocator (torch.cuda.memory_stats of the
                         devices the model is on, summed; every snapshot)

Event::

    kind (str, e.g. "inject", "lifecycle", "nonleaf_grad_access",
    "inplace_on_saved", "graph_cut", "nonfinite", "exception"), step (int),
    where (str | null: "file.py:88"), count (int), detail (dict). The
    gradient-flow events ("grad_not_cleared", "grad_cleared_before_step",
    "stale_grad_step") keep ``step`` at their first occurrence and come again in
    every later snapshot with running numbers: ``count`` optimizer steps at which
    it happened out of ``detail.steps`` checked since
Over 400 lines: the snapshot record: its fields, phases, writer and reader, all of one schema (optcheck/schemas/snapshot-1.json).
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from optcheck.record.summary import SCHEMA_DIR  # optcheck/schemas

SCHEMA = "optcheck.snapshot/1"
BACKENDS = ("pytorch", "torchsharp")
PHASES = ("pre-step", "in-step", "post-step")

#: Published JSON Schemas (draft 2020-12) of the record files, by kind.
SCHEMA_FILES = {"snapshot": "snapshot-1.json", "finding": "finding-1.json", "metrics": "metrics-1.json",
                "summary": "summary-1.json"}


class SchemaError(ValueError):
    """A record does not follow its published schema; the message names the field."""


def schema_document(kind: str) -> dict:
    """The published JSON Schema of record ``kind`` (a key of :data:`SCHEMA_FILES`), a new
    dict each call: the file in ``optcheck/schemas/``; for ``summary``, that file's frame
    with the per-field part built from ``optcheck.record.summary.Summary``
    (:func:`optcheck.record.summary.summary_schema`)."""
    if kind == "summary":
        from optcheck.record.summary import summary_schema  # (lazy: only for the summary kind)

        return summary_schema()
    return json.loads((SCHEMA_DIR / SCHEMA_FILES[kind]).read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=None)
def schema_validator(kind: str = "snapshot"):
    """A ``jsonschema`` validator for record ``kind`` (a key of :data:`SCHEMA_FILES`),
    loaded from ``optcheck/schemas/``."""
    import jsonschema

    schema = schema_document(kind)
    cls = jsonschema.validators.validator_for(schema)
    # the schemas themselves are checked against their meta-schema by tests/unit/test_schemas_valid.py,
    # not here: that check alone took a second of every command that reads a run
    return cls(_inline_refs(schema, schema.get("$defs", {})))


def _inline_refs(node: Any, defs: dict) -> Any:
    """The schema with every local ``{"$ref": "#/$defs/x"}`` replaced by its
    definition (none is recursive): the same checks, without resolving a
    reference at every parameter of every snapshot (a third faster)."""
    if isinstance(node, dict):
        ref = node.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return _inline_refs(defs[ref[len("#/$defs/"):]], defs)
        return {k: _inline_refs(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node


inline_refs = _inline_refs  # public: the reader applies the summary schema's typed fields to old summaries


def field_path(path) -> str:
    """``params[3].ref`` from a jsonschema error path ``deque(["params", 3, "ref"])``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(the record)"


def validate_record(obj: Any, kind: str = "snapshot") -> Any:
    """Check ``obj`` against the published schema of ``kind``; return it unchanged.

    Raises:
        SchemaError: ``"<field>: <what is wrong>"`` for the most relevant error
            (``jsonschema.exceptions.best_match``), e.g.
            ``groups[0]: 1 is not of type 'object'``.
    """
    import jsonschema

    try:
        err = jsonschema.exceptions.best_match(schema_validator(kind).iter_errors(obj))
    except RecursionError:
        raise SchemaError("(the record): nested too deeply") from None
    if err is not None:
        msg = err.message if len(err.message) <= 160 else err.message[:157] + "..."
        raise SchemaError(f"{field_path(err.absolute_path)}: {msg}")
    return obj


def validate(snap: Any) -> dict:
    """Check that ``snap`` is a schema-1 snapshot (``optcheck/schemas/snapshot-1.json``)
    and return it unchanged.

    Raises:
        SchemaError: naming the first missing or ill-typed field.
    """
    if not isinstance(snap, dict):
        raise SchemaError(f"snapshot is a {type(snap).__name__}, not a JSON object")
    return validate_record(snap, "snapshot")


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


def strict_json(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, **kwargs)`` as strict JSON: non-finite floats become "nan"/"inf".

    Encoded as it is first (``allow_nan=False``): only a record that holds a NaN/Inf
    (ValueError) is walked by :func:`clean_json` (a Python frame per value: about half of a
    snapshot's rule check on a small model, issue 34)."""
    try:
        return json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError:
        return json.dumps(clean_json(obj), allow_nan=False, **kwargs)


def dumps(obj: dict) -> str:
    """One JSON line (no trailing newline); non-finite floats become "nan"/"inf"."""
    return strict_json(obj, separators=(",", ":"))


def loads(line: str) -> dict:
    """Parse and validate one snapshot line. Raises SchemaError or ValueError."""
    return validate(json.loads(line))


@dataclass
class StreamDefect:
    """A line of a JSON Lines file that could not be read (1-based ``line``)."""

    line: int
    reason: str


def read_jsonl(path: str | os.PathLike, defects: list[StreamDefect] | None = None,
               numbered: bool = False) -> Iterator:
    """Yield the JSON values of a JSON Lines file (``(line number, value)`` pairs
    with ``numbered``), streaming: one line in memory at a time.

    A line that is not JSON — the torn last line of a run killed mid-write, a
    line torn by two writers, garbage, nesting too deep for the parser, bytes
    that are not UTF-8 — is skipped and recorded in ``defects`` (1-based line
    number and why: "truncated last line (...)" or "not a JSON line (...)"), and
    the rest of the file is still read. This is the rule every run-directory
    reader follows (``optcheck.report.reader``, ``docs/run-directory.md``).
    Without ``defects`` (scripts, tests) such a line raises instead, unless it
    is the last one.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: an unreadable line other than the last, when ``defects`` is None.
    """
    parser = LineParser(path, defects)
    with open(path, "rb") as f:
        for n, value in parser.feed(enumerate(f, start=1)):
            yield (n, value) if numbered else value
    parser.end()


def parse_line(raw: bytes) -> tuple[Any, str | None]:
    """One stripped line of a JSON Lines file: ``(value, None)``, or ``(None, why)``
    when it is not JSON (torn, garbage, not UTF-8, nested too deeply)."""
    try:
        return json.loads(raw.decode("utf-8")), None
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None, "nested too deeply" if isinstance(e, RecursionError) else getattr(e, "msg", None) or str(e)[:80]


class LineParser:
    """Numbered raw lines to JSON values with the bad-line rule of :func:`read_jsonl`,
    across calls: a line that is not JSON is held until it is known whether another
    line follows (then it is "not a JSON line", else "truncated last line")."""

    def __init__(self, path, defects: list[StreamDefect] | None):
        self.path, self.defects = path, defects
        self.failed: tuple[int, str] | None = None

    def more(self) -> None:
        """Another line follows: a held bad line was not the last."""
        if self.failed is not None:
            bad_line(self.path, *self.failed, last=False, defects=self.defects)
            self.failed = None

    def feed(self, lines) -> Iterator[tuple[int, Any]]:
        """``(n, value)`` of each ``(n, raw bytes)`` line that is JSON."""
        for n, raw in lines:
            self.more()
            raw = raw.strip()
            if not raw:
                continue
            value, why = parse_line(raw)
            if why is not None:
                self.failed = (n, why)
                continue
            yield n, value

    def end(self) -> None:
        """No line follows: a held bad line was the last."""
        if self.failed is not None:
            bad_line(self.path, *self.failed, last=True, defects=self.defects)
            self.failed = None


def bad_line(path, n: int, what: str, *, last: bool, defects: list[StreamDefect] | None) -> None:
    """Record line ``n`` that is not JSON in ``defects``; without them, raise unless it is the last."""
    if defects is not None:
        defects.append(StreamDefect(n, ("truncated last line" if last else "not a JSON line") + f" ({what})"))
    elif not last:
        raise ValueError(f"{path}:{n}: not a JSON line ({what})")


def members(snap: dict) -> list[tuple[int, dict]]:
    """Every optimizer member as ``(group index, Member)``, in group order."""
    return [(g.get("index", i), m) for i, g in enumerate(snap["groups"]) for m in g.get("members", ())]


#: The ``dtype`` the TorchSharp probe writes for a disposed member (``dotnet/Worker/TorchSharpProbe.cs``).
DISPOSED = "disposed"


def is_disposed(member: dict) -> bool:
    """True for a param-group member whose tensor was disposed while the optimizer still
    holds it (TorchSharp: ``Tensor.IsInvalid``; its handle reads 0, it has no data, shape
    or name). Such a member is its own state (OC109), not a tensor with ref 0: see
    ``docs/torchsharp.md`` ("Disposed tensors")."""
    return bool(member.get("disposed")) or member.get("dtype") == DISPOSED


def live_members(snap: dict) -> list[tuple[int, dict]]:
    """:func:`members` without the disposed ones."""
    return [(gi, m) for gi, m in members(snap) if not is_disposed(m)]


def _group(snap: dict, gi: int) -> list[dict] | None:
    for i, g in enumerate(snap.get("groups") or ()):
        if g.get("index", i) == gi:
            return list(g.get("members") or ())
    return None


def disposed_members(history: list[dict]) -> list[tuple[int, int, dict | None, dict | None]]:
    """The disposed members of the last snapshot of ``history`` as ``(group index,
    position, member as last seen alive, the snapshot it was seen in)``. A member is
    matched by position in a group of the same length in the latest earlier snapshot
    where it was alive (a materialised parameter list keeps its order); the last two
    are None when there is no such snapshot."""
    if not history:
        return []
    snap, out = history[-1], []
    for i, g in enumerate(snap["groups"]):
        gi, ms = g.get("index", i), list(g.get("members") or ())
        for pos, m in enumerate(ms):
            if not is_disposed(m):
                continue
            found = (None, None)
            for prev in reversed(history[:-1]):
                old = _group(prev, gi)
                if old is not None and len(old) == len(ms) and not is_disposed(old[pos]):
                    found = (old[pos], prev)
                    break
            out.append((gi, pos, *found))
    return out


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
