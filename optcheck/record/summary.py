"""``summary.json``: the one :class:`Summary` of every run (soak, Monitor, ``--nproc``),
filled and written by the run's recorder (``optcheck/run/recorder.py``). Torch-free.

Its fields are documented in ``docs/summary.md`` and validated by :func:`summary_schema`
(the frame ``optcheck/schemas/summary-1.json``, and each field's type declared on the
field itself: adding a field is a change to this file).
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

#: The published JSON Schemas (``optcheck/schemas/``; ``optcheck schema KIND`` prints each).
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"

#: ``summary_version`` of what :class:`Summary` writes. 1 (or the field absent):
#: written before the soak and the Monitor shared this type, each with its own fields.
SUMMARY_VERSION = 2


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second (``started``/``finished``)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def json_type(*types: str, **more) -> dict:
    """A JSON Schema fragment: ``{"type": ...}`` of one or more JSON types, plus ``more``."""
    return {"type": types[0] if len(types) == 1 else list(types), **more}


def summary_field(schema: dict | None, default=MISSING, *, factory=MISSING, required: bool = True):
    """A :class:`Summary` field with its JSON Schema fragment (``schema``, None: typed only by
    the frame in ``optcheck/schemas/summary-1.json``) and whether a version-2 summary must carry it."""
    return field(default=default, default_factory=factory, metadata={"schema": schema, "required": required})


_FLOAT = {"$ref": "#/$defs/float"}  # a float, or "nan"/"inf"/"-inf", or null
_COUNT = json_type("integer", minimum=0)
_COUNTS = json_type("object", additionalProperties=json_type("integer", minimum=1))  # {code: count}
_SECONDS = json_type("number", minimum=0)
_TIMED = json_type(  # optcheck.run.sequencer.cost_dict, Cost.to_dict
    "object", required=["count", "total_s", "median_s"],
    properties={"count": _COUNT, "total_s": _SECONDS, "median_s": json_type("number", "null", minimum=0)})
_COST = json_type("object", required=["snapshots", "checks"], properties={
    "snapshots": _TIMED, "checks": _TIMED,
    "steps": json_type("object", "null", required=["count", "total_s", "mean_us"],
                       properties={"count": _COUNT, "total_s": _SECONDS,
                                   "mean_us": json_type("number", "null", minimum=0)}),
    "train_cpu_s": json_type("number", "null", minimum=0),
    "train_cpu_block_s": json_type("array", "null", items=_SECONDS)})  # optcheck.run.sequencer.CpuBlocks
_HAZARDS = json_type(
    "object", "null", description="the autograd hazard probes' arming (docs/hazards.md); null when they are off",
    required=["mode", "armed_steps", "steps"],
    properties={"mode": {"enum": ["auto", "always"]}, "armed_steps": _COUNT, "steps": _COUNT,
                "reasons": json_type("object", additionalProperties=_COUNT), "stays_armed": json_type("string", "null")})
STATUSES = ("running", "clean", "findings", "stopped", "crashed", "interrupted", "record-failed")


@dataclass
class Summary:
    """``summary.json`` of a run directory, soak or Monitor (``docs/summary.md``).

    Units: seconds (``*_s``), bytes (``*_bytes``), steps are optimizer steps
    (1-based; 0 is before the first). Fields a source does not have stay None
    (e.g. ``steps_requested`` of a Monitor, ``not_checked`` of a soak is []).

    Each field carries its JSON Schema fragment: :func:`summary_schema` builds the
    version-2 part of the published schema from them, so a new field is one line here
    (and its row in ``docs/summary.md``).
    """

    run: str = summary_field(json_type("string"))
    backend: str = summary_field(None, required=False)  # typed in the frame (version 1 has it too)
    source: str = summary_field({"enum": ["soak", "monitor"]})
    status: str = summary_field({"enum": list(STATUSES)}, "running")
    exit_code: int | None = summary_field(json_type("integer", "null"), None)
    fail_on: str = summary_field({"enum": ["info", "warning", "error"]}, "warning")
    steps_requested: int | None = summary_field(json_type("integer", "null", minimum=0), None)
    last_step: int = summary_field(_COUNT, 0)
    snapshots: int = summary_field(_COUNT, 0)
    findings: int = summary_field(_COUNT, 0)
    findings_by_code: dict = summary_field(_COUNTS, factory=dict)
    suppressed: dict = summary_field(_COUNTS, factory=dict)
    first_finding: dict | None = summary_field(json_type("object", "null"), None)
    loss_first: float | None = summary_field(_FLOAT, None)
    loss_last: float | None = summary_field(_FLOAT, None)
    val_loss_first: float | None = summary_field(_FLOAT, None)
    val_loss_last: float | None = summary_field(_FLOAT, None)
    val_step_first: int | None = summary_field(json_type("integer", "null"), None)
    val_step_last: int | None = summary_field(json_type("integer", "null"), None)
    elapsed_s: float | None = summary_field(json_type("number", "null"), None)
    steps_per_s: float | None = summary_field(json_type("number", "null"), None)
    peak_rss_bytes: int = summary_field(_COUNT, 0)
    versions: dict = summary_field(json_type("object", additionalProperties=json_type("string", "null")), factory=dict)
    threads: int | None = summary_field(json_type("integer", "null"), None)
    crash: dict | None = summary_field(json_type("object", "null"), None)
    stopped: dict | None = summary_field(json_type("object", "null"), None)
    lead_time: dict | None = summary_field(json_type("object", "null"), None)
    cost: dict = summary_field(_COST, factory=lambda: {k: {"count": 0, "total_s": 0.0, "median_s": None}
                                                       for k in ("snapshots", "checks")})
    out: str | None = summary_field(json_type("string", "null"), None)
    started: str = summary_field(json_type("string"), factory=utc_now)
    finished: str | None = summary_field(json_type("string", "null"), None)
    # (the nested fields the judges read are typed: a summary edited to hold "extra": [1] is one line, exit 2)
    corpus: dict | None = summary_field(json_type("object", "null", properties={
        "sha256": json_type("string", "null")}), None)
    config: dict | None = summary_field(json_type("object", "null", properties={
        "extra": json_type("object", "null")}), None)
    inject: list = summary_field(json_type("array", items=json_type("string")), factory=list)
    interrupted_by: str | None = summary_field(json_type("string", "null"), None)
    signals: int = summary_field(_COUNT, 0)
    record_error: str | None = summary_field(json_type("string", "null"), None)
    garbled_lines: int = summary_field(_COUNT, 0)
    not_checked: list = summary_field(json_type("array"), factory=list)
    # added after version 2 was first written: optional, so those summaries stay valid
    hazards: dict | None = summary_field(_HAZARDS, None, required=False)
    summary_version: int = summary_field({"const": SUMMARY_VERSION}, SUMMARY_VERSION)

    def to_dict(self) -> dict:
        return asdict(self)


def summary_schema() -> dict:
    """The published JSON Schema (draft 2020-12) of ``summary.json``, a new dict each call.

    The frame — version 1's typed fields, ``$defs`` and the ``if summary_version``
    switch — is ``optcheck/schemas/summary-1.json``; its ``then`` (version 2: which
    fields are required, and each one's type) is built here from :class:`Summary`'s
    fields. ``optcheck schema summary`` prints it.
    """
    schema = json.loads((SCHEMA_DIR / "summary-1.json").read_text(encoding="utf-8"))
    own = fields(Summary)
    schema["then"] = json.loads(json.dumps({  # a copy: the callers inline and loosen it
        "required": sorted(f.name for f in own if f.metadata["required"]),
        "properties": {f.name: f.metadata["schema"] for f in own if f.metadata["schema"] is not None}}))
    return schema


def cost_line(summary: dict) -> str | None:
    """One line of what optcheck cost a run (``cost`` of a summary), or None when it has none::

        optcheck cost: 7 snapshots 0.412 s (median 0.051 s), 7 rule checks 0.093 s (median 0.012 s), 21 µs a step over 300 steps; run 22.4 s
    """
    cost = summary.get("cost")
    if not isinstance(cost, dict):
        return None
    parts = []
    for key, label in (("snapshots", "snapshots"), ("checks", "rule checks")):
        c = cost.get(key) or {}
        med = c.get("median_s")
        parts.append(f"{c.get('count', 0)} {label} {c.get('total_s') or 0:.3f} s"
                     + (f" (median {med:.3f} s)" if med is not None else ""))
    steps = cost.get("steps") or {}
    if steps.get("mean_us") is not None:  # optcheck.run.sequencer.StepCost: the hooks' own time, snapshots left out
        parts.append(f"{steps['mean_us']:.0f} µs a step over {steps['count']} steps")
    line = "optcheck cost: " + ", ".join(parts)
    if summary.get("elapsed_s"):
        line += f"; run {summary['elapsed_s']:.1f} s"
    return line
