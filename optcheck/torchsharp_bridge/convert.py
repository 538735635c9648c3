"""Decode the .NET probe's snapshot body (``OptCheck.Probe.ProbeCore.Read``,
``dotnet/Probe/ProbeCore.cs``) and name what the probe could not. Torch-free and
.NET-free: the probe writes the body as one JSON object in the snapshot's own field
names (``optcheck/record/snapshot.py``: ``params``, ``groups``, ``state``, ``optimizer``,
``memory``, ``notes``, and ``prestep_findings``, the pre-step check's problems);
:func:`body_from_json` reads it with :func:`json.loads`, checks its top-level shape and
turns the non-finite numbers the probe writes as the strings ``"nan"``, ``"inf"``,
``"-inf"`` (strict JSON has no NaN: the run directory's encoding,
``docs/run-directory.md``) back into Python floats, as the PyTorch probe leaves them.
A measured NaN gradient norm stays NaN (OC501 reads it); ``null`` means not measured.
``ref`` is the handle (the key of TorchSharp's optimizer state, ``docs/torchsharp.md``),
``data_ptr`` the tensor's data address; ``docs/dotnet.md`` describes the boundary.
"""

from __future__ import annotations

import json
import math

#: The members every probe body has (ProbeCore.Read writes them all, in this order).
BODY_FIELDS = ("params", "groups", "state", "optimizer", "memory", "notes", "prestep_findings")
#: The spellings of non-finite numbers (``JsonWriter.Double``, ``optcheck.record.snapshot.clean_json``).
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
#: The float members of a body's ``params`` entries; every value of a group's ``options`` is a float too.
PARAM_FLOATS = ("grad_norm", "value_norm")


def _number(value):
    """``"nan"``/``"inf"``/``"-inf"`` as a float; any other value unchanged."""
    return NONFINITE[value] if isinstance(value, str) and value in NONFINITE else value


def body_from_json(text: str) -> dict:
    """The backend part of a snapshot from the probe's JSON text.

    Raises:
        ValueError: not a JSON object, or a field of :data:`BODY_FIELDS` missing or of the
            wrong kind (a probe bug, named).
    """
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"the .NET probe wrote bad JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(body, dict):
        raise ValueError(f"the .NET probe wrote a JSON {type(body).__name__}, not an object")
    missing = [k for k in BODY_FIELDS if k not in body]
    if missing:
        raise ValueError(f"the .NET probe's body lacks {', '.join(missing)}")
    for k in ("params", "groups", "notes", "prestep_findings"):
        if not isinstance(body[k], list):
            raise ValueError(f"the .NET probe's {k} is a {type(body[k]).__name__}, not a list")
    for p in body["params"]:
        for k in PARAM_FLOATS:
            if k in p:
                p[k] = _number(p[k])
    for g in body["groups"]:
        options = g.get("options") or {}
        for k, v in options.items():
            options[k] = [_number(x) for x in v] if isinstance(v, list) else _number(v)
    return body


def name_members(body: dict, known: dict[int, str]) -> dict:
    """Fill the names of param-group members the probe could not name (no model
    parameter has their handle or data pointer any more) from ``known``, the names
    earlier snapshots saw for each handle; then record this snapshot's names in
    ``known``. After ``model.to(Float64)`` with an eager optimizer, the members
    ``ln_f.weight``/``ln_f.bias`` keep their old handles, which only the previous
    snapshot can name. Returns ``body``."""
    for p in body["params"]:
        known[p["ref"]] = p["name"]
    by_handle = {p["ref"]: p["name"] for p in body["params"]}
    by_ptr: dict[int, str] = {}
    for p in body["params"]:
        if p["data_ptr"]:
            by_ptr.setdefault(p["data_ptr"], p["name"])
    for g in body["groups"]:
        for m in g["members"]:
            if not m.get("name"):
                m["name"] = by_handle.get(m["ref"]) or (by_ptr.get(m["data_ptr"]) if m["data_ptr"] else None) \
                    or known.get(m["ref"])
            if m["name"]:
                known.setdefault(m["ref"], m["name"])
    return body
