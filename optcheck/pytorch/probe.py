"""Where a PyTorch snapshot is taken: the model's parameters, the optimizer's param
groups and state, and memory — metadata only, no tensor is copied.

Costs (2-layer default GPT, 1 thread): :func:`fingerprint` a few µs per step;
:func:`snapshot_body` well under a millisecond without the tensor census.
Facts used: ``optimizer.state`` is keyed by the Parameter object
(``torch/optim/optimizer.py``), so ``ref = id(param)``; ``param_groups`` built
from ``named_parameters()`` carry ``param_names`` (torch ≥ 2.6).
"""

from __future__ import annotations

import gc
import math
import platform
from typing import Any

import psutil
import torch

from optcheck import heap

_PROC = psutil.Process()


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` → ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


def versions() -> dict[str, str]:
    """Library versions recorded in every snapshot (seed 004: report them so an
    upgrade run can be compared with the last good one)."""
    import numpy

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__}


def fingerprint(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple:
    """What the pre-step check compares: (id, data pointer) of every model
    parameter and of every param-group member, in order. Changes when a parameter
    is replaced, rebound, tied, converted (new data) or added. Cost: a few µs."""
    return (tuple((id(p), p.data_ptr()) for p in model.parameters()),
            tuple((id(p), p.data_ptr()) for g in optimizer.param_groups for p in g["params"]))


def _param(name: str, p: torch.Tensor) -> dict:
    grad = p.grad if p.is_leaf else None  # .grad on a non-leaf warns and is None
    return {
        "name": name, "ref": id(p), "data_ptr": p.data_ptr(), "shape": list(p.shape),
        "dtype": dtype_name(p.dtype), "device": str(p.device), "is_leaf": p.is_leaf,
        "requires_grad": p.requires_grad, "grad": "set" if grad is not None else "none",
        "grad_norm": float(grad.detach().float().norm()) if grad is not None else None,
        "version": p._version,
    }


def params(model: torch.nn.Module) -> list[dict]:
    """Param records of ``named_parameters(remove_duplicate=False)``: a tied weight
    appears under each of its names, with one ref."""
    return [_param(n, p) for n, p in model.named_parameters(remove_duplicate=False)]


def groups(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Group records: options (everything but the tensors) and members."""
    out = []
    for i, g in enumerate(optimizer.param_groups):
        names = g.get("param_names")
        members = []
        for j, p in enumerate(g["params"]):
            members.append({
                "ref": id(p), "data_ptr": p.data_ptr(), "name": names[j] if names and j < len(names) else None,
                "shape": list(p.shape), "dtype": dtype_name(p.dtype), "is_leaf": p.is_leaf,
                "requires_grad": p.requires_grad})
        options = {k: _jsonable(v) for k, v in g.items() if k not in ("params", "param_names")}
        out.append({"index": i, "options": options, "members": members})
    return out


def state(optimizer: torch.optim.Optimizer) -> tuple[list[dict], int]:
    """State records, one per key of ``optimizer.state``, and the bytes they hold."""
    out, nbytes = [], 0
    for p, s in optimizer.state.items():
        tensors, step = {}, None
        for k, v in s.items():
            if isinstance(v, torch.Tensor):
                tensors[k] = {"shape": list(v.shape), "dtype": dtype_name(v.dtype)}
                nbytes += v.numel() * v.element_size()
                if k == "step":
                    step = int(v.item())
            elif k == "step" and isinstance(v, (int, float)):
                step = int(v)
        out.append({"ref": id(p), "step": step, "tensors": tensors})
    return out, nbytes


def tensor_census() -> tuple[int, int]:
    """(count, bytes) of live tensors reachable by the garbage collector.

    Walks ``gc.get_objects()``: ~30 ms with torch imported (~170k objects), so the
    worker runs it on every ``census_every``-th snapshot only. Bytes count each
    storage once (by data pointer). A ``gc.collect()`` first, so that tensors
    only waiting for the cycle collector are not counted as alive (the .NET probe
    does the same with ``GC.Collect``): a leak detector must see leaks, not GC debt."""
    gc.collect()
    count, seen, nbytes, is_tensor = 0, set(), 0, {}
    for obj in gc.get_objects():
        tp = type(obj)
        hit = is_tensor.get(tp)
        if hit is None:
            hit = is_tensor[tp] = issubclass(tp, torch.Tensor)
        if not hit:
            continue
        count += 1
        try:
            st = obj.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                nbytes += st.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
    return count, nbytes


def memory(state_bytes: int, census: bool = True) -> dict:
    """Memory record: RSS (bytes, psutil), malloc heap in use (bytes, ``optcheck.heap``;
    ~2 µs, every snapshot: it carries OC401's fast path), optimizer-state bytes, live
    tensors and their bytes (when ``census``), CUDA allocated/reserved/retries when a
    GPU is used."""
    mem = {"rss_bytes": _PROC.memory_info().rss, "state_bytes": state_bytes}
    heap_bytes = heap.in_use_bytes()
    if heap_bytes is not None:
        mem["heap_in_use_bytes"] = heap_bytes
    if census:
        mem["live_tensors"], mem["live_tensor_bytes"] = tensor_census()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        stats = torch.cuda.memory_stats()
        mem["device_allocated_bytes"] = stats.get("allocated_bytes.all.current", 0)
        mem["device_reserved_bytes"] = stats.get("reserved_bytes.all.current", 0)
        mem["device_alloc_retries"] = stats.get("num_alloc_retries", 0)
    return mem


def snapshot_body(model: torch.nn.Module, optimizer: torch.optim.Optimizer, census: bool = True) -> dict:
    """The backend part of a schema-1 snapshot (see ``optcheck.snapshot``):
    params, groups, state, optimizer, memory, notes. The caller adds step, phase,
    trigger, loss, events and versions."""
    st, state_bytes = state(optimizer)
    return {
        "params": params(model), "groups": groups(optimizer), "state": st,
        "optimizer": {"type": type(optimizer).__name__, "state_init": "lazy"},
        "memory": memory(state_bytes, census), "notes": [],
    }


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
