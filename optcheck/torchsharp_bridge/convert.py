"""Turn the .NET probe's flat arrays (``OptCheck.Probe.ProbeArrays``,
``dotnet/Probe/ProbeCore.cs``) into the backend part of a schema-1 snapshot.
Torch-free and .NET-free: :func:`read_probe` copies a ProbeArrays object into
plain Python lists (the only function that touches .NET), and
:func:`body_from_arrays` builds the snapshot body from those lists, so that the
conversion is tested on the real TorchSharp records of
``tests/fixtures/torchsharp`` (``optcheck.torchsharp_bridge.fixtures``) without
a runtime.

The flat arrays (n model parameters, g groups, m members in group order, k
state entries)::

    ParamNames[n] ParamHandles[n] ParamDataPtrs[n] ParamFlags[n] ParamGradNorms[n]
    ParamRanks[n] ParamShapes[sum ranks] ParamDTypes[n] ParamDevices[n]
    GroupSizes[g] GroupOptionCounts[g] GroupOptionNames[..] GroupOptionValues[..]
    MemberNames[m] MemberHandles[m] MemberDataPtrs[m] MemberFlags[m] MemberRanks[m]
    MemberShapes[..] MemberDTypes[m]
    StateReadable StateKeys[k] StateSteps[k] StateTensorCounts[k] StateTensorNames[..]
    StateTensorRanks[..] StateTensorShapes[..] StateTensorDTypes[..]
    OptimizerType LiveTensors PeakTensors ManagedBytes RssBytes CreatedOutsideScope
    DisposedOutsideScope Notes[..] ProbeSeconds

Flags: bit 0 is_leaf, bit 1 requires_grad, bit 2 grad set. Handles, data
pointers and byte counts are integers; a missing value is -1 (memory) or NaN
(grad norm). ``ref`` in the snapshot is the handle (the key of TorchSharp's
optimizer state, ``docs/torchsharp.md``); ``data_ptr`` the tensor's data address.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

LEAF, REQUIRES_GRAD, GRAD_SET = 1, 2, 4
STATE_INIT = "eager"   # TorchSharp's AdamW fills _state in add_param_group (AdamW.cs)

NUMERIC = {
    "ParamHandles": "q", "ParamDataPtrs": "q", "ParamFlags": "i", "ParamGradNorms": "d", "ParamRanks": "i",
    "ParamShapes": "q", "GroupSizes": "i", "GroupOptionCounts": "i", "GroupOptionValues": "d",
    "MemberHandles": "q", "MemberDataPtrs": "q", "MemberFlags": "i", "MemberRanks": "i", "MemberShapes": "q",
    "StateKeys": "q", "StateSteps": "q", "StateTensorCounts": "i", "StateTensorRanks": "i", "StateTensorShapes": "q",
}
STRINGS = ("ParamNames", "ParamDTypes", "ParamDevices", "GroupOptionNames", "MemberNames", "MemberDTypes",
           "StateTensorNames", "StateTensorDTypes", "Notes")
SCALARS = ("StateReadable", "OptimizerType", "LiveTensors", "PeakTensors", "ManagedBytes", "RssBytes", "ProbeSeconds",
           "CreatedOutsideScope", "DisposedOutsideScope")
OPTIONAL_SCALARS = ("CreatedOutsideScope", "DisposedOutsideScope")


def _numbers(arr: Any, code: str) -> list:
    """A .NET primitive array as a list: through the buffer protocol when pythonnet
    offers it (one copy), else element by element."""
    if arr is None:
        return []
    try:
        mv = memoryview(arr)
        return mv.cast("B").cast(code).tolist() if mv.format != code else mv.tolist()
    except (TypeError, ValueError, NotImplementedError):
        return [float(v) if code == "d" else int(v) for v in arr]


def read_probe(pa: Any) -> dict:
    """Copy an ``OptCheck.Probe.ProbeArrays`` (.NET object) into plain Python values,
    keyed by the field names above."""
    out: dict[str, Any] = {}
    for name, code in NUMERIC.items():
        out[name] = _numbers(getattr(pa, name), code)
    for name in STRINGS:
        arr = getattr(pa, name)
        out[name] = [] if arr is None else [None if s is None else str(s) for s in arr]
    for name in SCALARS:
        # the DisposeScope counts are newer than some built workers: absent reads as unknown
        v = getattr(pa, name) if name not in OPTIONAL_SCALARS else getattr(pa, name, -1)
        out[name] = v if isinstance(v, (bool, int, float)) or v is None else str(v)
    out["StateReadable"] = bool(out["StateReadable"])
    return out


def _split(flat: Sequence[int], ranks: Iterable[int]) -> list[list[int]]:
    out, i = [], 0
    for r in ranks:
        out.append([int(x) for x in flat[i:i + r]])
        i += r
    return out


def _dtype(name: str | None) -> str | None:
    """PyTorch's spelling: "Float32"/"ScalarType.Float32" -> "float32"."""
    if name is None:
        return None
    n = name.rsplit(".", 1)[-1].lower()
    return {"float": "float32", "single": "float32", "double": "float64", "half": "float16",
            "long": "int64", "int": "int32"}.get(n, n)


def group_options(names: Sequence[str], values: Sequence[float]) -> dict:
    """Group options in PyTorch's shape: beta1/beta2 become ``betas``; integral
    flags (amsgrad, maximize) stay numbers as given."""
    opts: dict[str, Any] = {}
    for n, v in zip(names, values):
        opts[n] = float(v)
    if "beta1" in opts and "beta2" in opts:
        opts["betas"] = [opts.pop("beta1"), opts.pop("beta2")]
    return opts


def body_from_arrays(a: dict, device_default: str = "cpu") -> dict:
    """The backend part of a snapshot (``params``, ``groups``, ``state``,
    ``optimizer``, ``memory``, ``notes``) from :func:`read_probe`'s dict.

    Raises:
        ValueError: the arrays disagree in length (a probe bug, named).
    """
    n = len(a["ParamHandles"])
    for key in ("ParamNames", "ParamDataPtrs", "ParamFlags", "ParamGradNorms", "ParamRanks", "ParamDTypes"):
        if len(a[key]) != n:
            raise ValueError(f"probe arrays disagree: {key} has {len(a[key])} entries, ParamHandles {n}")
    shapes = _split(a["ParamShapes"], a["ParamRanks"])
    devices = a.get("ParamDevices") or [device_default] * n
    params = []
    for i in range(n):
        flags = int(a["ParamFlags"][i])
        gn = a["ParamGradNorms"][i]
        grad_set = bool(flags & GRAD_SET)
        params.append({
            "name": a["ParamNames"][i], "ref": int(a["ParamHandles"][i]), "data_ptr": int(a["ParamDataPtrs"][i]),
            "shape": shapes[i], "dtype": _dtype(a["ParamDTypes"][i]), "device": devices[i] or device_default,
            "is_leaf": bool(flags & LEAF), "requires_grad": bool(flags & REQUIRES_GRAD),
            "grad": "set" if grad_set else "none",
            "grad_norm": float(gn) if grad_set and gn is not None and not math.isnan(gn) else None,
            "version": None,
        })

    mshapes = _split(a["MemberShapes"], a["MemberRanks"])
    groups, mi, oi = [], 0, 0
    for g, size in enumerate(a["GroupSizes"]):
        k = a["GroupOptionCounts"][g]
        opts = group_options(a["GroupOptionNames"][oi:oi + k], a["GroupOptionValues"][oi:oi + k])
        oi += k
        members = []
        for j in range(mi, mi + size):
            flags = int(a["MemberFlags"][j])
            members.append({
                "ref": int(a["MemberHandles"][j]), "data_ptr": int(a["MemberDataPtrs"][j]),
                "name": a["MemberNames"][j], "shape": mshapes[j], "dtype": _dtype(a["MemberDTypes"][j]),
                "is_leaf": bool(flags & LEAF), "requires_grad": bool(flags & REQUIRES_GRAD),
            })
        mi += size
        groups.append({"index": g, "options": opts, "members": members})

    notes = list(a.get("Notes") or [])
    state = None
    state_bytes = 0
    if a["StateReadable"]:
        state, ti = [], 0
        tshapes = _split(a["StateTensorShapes"], a["StateTensorRanks"])
        esize = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4}
        for s, key in enumerate(a["StateKeys"]):
            tensors = {}
            for t in range(ti, ti + a["StateTensorCounts"][s]):
                dt = _dtype(a["StateTensorDTypes"][t])
                tensors[a["StateTensorNames"][t]] = {"shape": tshapes[t], "dtype": dt}
                state_bytes += math.prod(tshapes[t]) * esize.get(dt or "", 4)
            ti += a["StateTensorCounts"][s]
            step = int(a["StateSteps"][s])
            state.append({"ref": int(key), "step": step if step >= 0 else None, "tensors": tensors})
    elif not notes:
        notes.append("optimizer state not readable")

    memory = {}
    for field, key in (("rss_bytes", "RssBytes"), ("live_tensors", "LiveTensors"), ("peak_tensors", "PeakTensors"),
                       ("managed_bytes", "ManagedBytes"), ("tensors_created_outside_scope", "CreatedOutsideScope"),
                       ("tensors_disposed_outside_scope", "DisposedOutsideScope")):
        v = a.get(key)
        if v is not None and int(v) >= 0:
            memory[field] = int(v)
    if state is not None:
        memory["state_bytes"] = int(state_bytes)
    return {"params": params, "groups": groups, "state": state,
            "optimizer": {"type": a.get("OptimizerType") or "unknown", "state_init": STATE_INIT},
            "memory": memory, "notes": notes}


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
