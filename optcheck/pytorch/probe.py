"""Where a PyTorch snapshot is taken: the model's parameters, the optimizer's param
groups and state, and memory — metadata only, no tensor is copied.

Costs (2-layer default GPT, 1 thread): :func:`fingerprint` a few µs per step;
:func:`snapshot_body` well under a millisecond without the tensor census. The
parameter pass (:func:`params`) reads every parameter and every gradient once:
~0.9 ms on the default GPT, ~105 ms on a GPT-2-small-sized model (124 M
parameters), of which the value checksum is ~50 ms (``benchmarks/bench_probe.py``).
Facts used (``docs/parameter-identity.md``): ``optimizer.state`` is keyed by the
Parameter object (``torch/optim/optimizer.py``), so ``ref = id(param)``;
``param_groups`` built from ``named_parameters()`` carry ``param_names``
(torch ≥ 2.6); fused optimizer kernels update parameters without bumping their
version counter, so whether a parameter moved is read from its values.
"""

from __future__ import annotations

import gc
import math
import platform
from typing import Any

import psutil
import torch

from optcheck import heap
from optcheck.distributed.shards import local  # FSDP2: a DTensor's shard on this rank

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


_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _checksum(p: torch.Tensor) -> torch.Tensor | None:
    """Sum of the raw bit patterns of ``p``'s values (a 0-d integer tensor, wrapping
    on overflow), or None when ``p`` has no plain strided storage (sparse, meta,
    quantized). Integer addition is exact and order-free, so the sum is the same
    on any thread count and changes when any element changes by as little as one
    ulp (unless other elements change by exactly the opposite bit difference).
    Reads the tensor once: 35–50 ms for 124 M float32 values on one CPU thread."""
    if p.layout != torch.strided or p.is_meta or p.is_quantized or p.is_complex():
        return None
    t = p.detach()
    try:
        if (t.numel() * t.element_size()) % 4 == 0 and t.element_size() <= 4:
            return t.reshape(-1).view(torch.int32).sum(dtype=torch.int32)  # fastest: one int32 lane per word
        return t.view(_BITS[t.element_size()]).sum(dtype=torch.int64)
    except (KeyError, RuntimeError, NotImplementedError):
        return None


def _norms(tensors: list[torch.Tensor | None]) -> list[float | None]:
    """L2 norms (16-bit tensors accumulated in float32), None where there is no tensor:
    one ``torch._foreach_norm`` per (device, dtype) over the dense ones, one read each.
    Used for the gradients (``grad_norm``) and the values (``value_norm``)."""
    out: list = [None] * len(tensors)
    buckets: dict[tuple, list[int]] = {}
    results: dict[int, torch.Tensor] = {}
    for i, t in enumerate(tensors):
        if t is None:
            continue
        if t.layout != torch.strided:  # sparse (nn.Embedding(sparse=True))
            results[i] = t.detach().coalesce().values().float().norm()
        else:
            buckets.setdefault((t.device, t.dtype), []).append(i)
    for (_, dtype), idx in buckets.items():
        acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else None  # never narrower than float32
        for i, n in zip(idx, torch._foreach_norm([tensors[i].detach() for i in idx], 2, dtype=acc)):
            results[i] = n
    for i, v in _values({i: t.float() for i, t in results.items()}).items():
        out[i] = v
    return out


def _values(scalars: dict) -> dict:
    """``{key: 0-d tensor}`` → ``{key: Python number}`` with one stack and one
    device-to-host copy per device (not one sync per tensor)."""
    by_device: dict[torch.device, list] = {}
    for k, t in scalars.items():
        by_device.setdefault(t.device, []).append(k)
    out = {}
    for keys in by_device.values():
        out.update(zip(keys, torch.stack([scalars[k] for k in keys]).tolist()))
    return out


def params(model: torch.nn.Module) -> list[dict]:
    """Param records of ``named_parameters(remove_duplicate=False)``: a tied weight
    appears under each of its names, with one ref.

    Each distinct tensor is read once per field, its gradient once: ``grad_norm`` (L2
    norm of ``.grad``), ``value_norm`` (L2 norm of the values, float32: the parameter
    fingerprint :mod:`optcheck.verdict` compares between runs) and ``checksum``
    (:func:`_checksum`: tells whether the values moved, whatever kernel moved them),
    each batched per device and dtype with one device sync."""
    named = list(model.named_parameters(remove_duplicate=False))
    unique: dict[int, torch.Tensor] = {}
    for _, p in named:
        unique.setdefault(id(p), p)
    tensors = list(unique.values())
    grads = [local(p.grad) if p.is_leaf else None for p in tensors]  # .grad on a non-leaf warns and is None
    norms = dict(zip(unique, _norms(grads)))
    value_norms = dict(zip(unique, _norms([local(p).detach() for p in tensors])))
    sums = {id(p): _checksum(local(p)) for p in tensors}
    checks = _values({k: c.long() for k, c in sums.items() if c is not None})
    return [{
        "name": name, "ref": id(p), "data_ptr": p.data_ptr(), "shape": list(p.shape),
        "dtype": dtype_name(p.dtype), "device": str(p.device), "is_leaf": p.is_leaf,
        "requires_grad": p.requires_grad, "grad": "set" if p.is_leaf and p.grad is not None else "none",
        "grad_norm": norms[id(p)], "value_norm": value_norms[id(p)], "version": p._version,
        "checksum": checks.get(id(p)),
    } for name, p in named]


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
                nbytes += local(v).numel() * v.element_size()  # FSDP2: the bytes this rank holds
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
        "optimizer": {"type": type(optimizer).__name__, "state_init": "lazy", "identity": "ref"},
        "memory": memory(state_bytes, census), "notes": [],
    }


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
