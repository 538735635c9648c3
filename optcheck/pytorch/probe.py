"""Where a PyTorch snapshot is taken: the model's parameters, the optimizer's param
groups and state, and memory — metadata only, no tensor is copied.

Costs (1 thread; ``benchmarks/bench_snapshot.py``, figures in ``docs/parameter-identity.md``
and ``docs/memory.md``): :func:`fingerprint` (the pre-step check) ~0.02–0.06 ms on
GPT-2 small, the module walk cached; :func:`snapshot_body` one read of the values and
one of the gradients of each distinct tensor (1.08× one ``_foreach_norm`` pass over
both on GPT-2 small), and with :class:`Norms` of the optimizer state too, which the
hazard drain's NaN/Inf check then reads no more (the whole snapshot 1.03–1.07× one
pass over everything it reads, ``docs/memory.md``), ~1–3 ms on the default GPT; the tensor census
(:mod:`optcheck.pytorch.census`) ~1 ms after the first, whatever else is alive.
Facts used (``docs/parameter-identity.md``): ``optimizer.state`` is keyed by the
Parameter object (``torch/optim/optimizer.py``), so ``ref = id(param)``;
``param_groups`` built from ``named_parameters()`` carry ``param_names``
(torch ≥ 2.6); fused optimizer kernels update parameters without bumping their
version counter, so whether a parameter moved is read from its values where the
counter did not move.
Over 400 lines: one pass over the model and the optimizer (values, norms, checksums, state): split, a snapshot would read the tensors twice (docs/guide/cost.md).
"""

from __future__ import annotations

import functools
import math
import operator
import os
import platform
import weakref
from itertools import chain
from typing import Any

import psutil
import torch

from optcheck import heap
from optcheck.pytorch import other_optimizers, state_read
from optcheck.pytorch.guard import raised_by_signal_handler
from optcheck.pytorch.census import CENSUS
from optcheck.pytorch.dynamo_safe import EagerHook
from optcheck.pytorch.shards import local  # FSDP2: a DTensor's shard on this rank
from optcheck.pytorch.names import model_name, under_fsdp1

_PROC = psutil.Process()


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` → ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        try:
            return value.item() if value.numel() == 1 else value.tolist()
        except Exception as caught:  # noqa: BLE001 - a tensor subclass without the op
            if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
                raise
            return f"<{type(value).__name__} {list(value.shape)}>"
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


def versions() -> dict[str, str]:
    """Library versions recorded in every snapshot (seed 004: report them so an
    upgrade run can be compared with the last good one)."""
    import numpy

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            # the libtorch folder, so that a TorchSharp run over the same one is known to share its native library
            "libtorch_lib": os.path.join(os.path.dirname(torch.__file__), "lib")}


class _Layout:
    """Where a model keeps its parameters: the ``_parameters`` dict of each of its
    modules, found once by walking ``model.modules()`` and walked again only after
    a module or parameter was registered into a module of a watched model (PyTorch's global
    registration hooks, ``torch/nn/modules/module.py``) or a submodule was deleted
    (a module's ``_modules`` changed size). A registration into a module outside every
    layout (a new ``ModuleList`` made of a slice of the model's layers each forward, as HF
    Llama-family models do; a module being built) walks nothing again."""

    generation = 0  # bumped by the registration hooks

    def __init__(self, model: torch.nn.Module) -> None:
        mods = list(model.modules())
        _KNOWN.update((id(m), m) for m in mods)
        self.model = weakref.ref(model, _forget_layout)
        self.at = _Layout.generation
        # a module without children or parameters gets them through the hooks; a deletion
        # (``del seq[3]``) bypasses them but shrinks its parent's ``_modules``
        self.children = [m._modules for m in mods if m._modules]
        self.sizes = tuple(map(len, self.children))
        self.dicts = [m._parameters for m in mods if m._parameters]
        self.params: list = []  # the last call's parameters (None where a name holds None)
        self.members: list = []  # and param-group members
        self.key: tuple = ((), ())  # their ids
        self.tensors: list = []  # the parameters that are tensors, whose data pointers are read
        self.outside: list = []  # members that are not model parameters: their data pointers too

    def update(self, params: list, members: list) -> None:
        """Remember ``params`` and ``members`` (when they are not the same objects as last time)."""
        if same_objects(params, self.params) and same_objects(members, self.members):
            return
        self.params, self.members = params, members
        self.key = (tuple(map(id, params)), tuple(map(id, members)))
        self.tensors = [p for p in params if p is not None]
        ids = set(map(id, self.tensors))
        self.outside = [p for p in members if id(p) not in ids]


def same_objects(a: list, b: list) -> bool:
    """The same objects in the same order (C-level: one identity test per element, no hashing)."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


#: id -> module, of the modules of every layout made, held weakly: an entry goes with its module, so a
#: temporary module built later at a freed one's address is not taken for it and walks nothing again
_KNOWN: "weakref.WeakValueDictionary[int, torch.nn.Module]" = weakref.WeakValueDictionary()


def _registered(module, *_args) -> None:
    if _KNOWN.get(id(module)) is module:  # (a module outside every layout gains it: no layout changes)
        _Layout.generation += 1


# global hooks (for the process): run outside Dynamo and traced as nothing where a compiled region
# registers a module or parameter (compiled autograd's fx modules, a module made inside a compiled
# function): traced, ``_registered`` would read ``_KNOWN`` into the graph (dynamo_safe.py)
torch.nn.modules.module.register_module_parameter_registration_hook(EagerHook(_registered))
torch.nn.modules.module.register_module_module_registration_hook(EagerHook(_registered))
#: id(model) -> its _Layout (a plain dict: looked up every step; the entry goes with the model,
#: and a new model at a freed one's address is told apart by ``_Layout.model``)
_LAYOUTS: "dict[int, _Layout]" = {}


def _forget_layout(ref) -> None:
    for key, layout in list(_LAYOUTS.items()):
        if layout.model is ref:
            del _LAYOUTS[key]


_data_ptr = torch.Tensor.data_ptr
_PARAMS = operator.itemgetter("params")


def fingerprint(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple:
    """What the pre-step check compares: the ``id`` of every model parameter (each
    module's, a tied one under each of its names) and of every param-group member, in
    order, and their data pointers. Changes when a parameter is replaced, rebound,
    tied, converted (new data: ``p.data = ...``, ``module.to(...)``) or added, or a
    param group gains or loses a member. Cost on GPT-2 small (148 tensors, 1 thread):
    0.04–0.07 ms on this 2-core machine at load 10 (``benchmarks/bench_snapshot.py``;
    0.17–0.5 ms before the module walk was cached in :class:`_Layout`)."""
    layout = _LAYOUTS.get(id(model))
    if (layout is None or layout.model() is not model or layout.at != _Layout.generation
            or tuple(map(len, layout.children)) != layout.sizes):  # (a deletion: its parent's _modules shrank)
        layout = _LAYOUTS[id(model)] = _Layout(model)
    layout.update(list(chain.from_iterable(map(dict.values, layout.dicts))),
                  list(chain.from_iterable(map(_PARAMS, optimizer.param_groups))))
    try:
        return layout.key, tuple(map(_data_ptr, layout.tensors)), tuple(map(_data_ptr, layout.outside))
    except Exception as caught:  # noqa: BLE001 - a lazy module's UninitializedParameter (no data yet): 0
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        return layout.key, tuple(map(data_ptr, layout.tensors)), tuple(map(data_ptr, layout.outside))


def uninitialized(p: torch.Tensor) -> bool:
    """An ``UninitializedParameter``/``UninitializedBuffer`` (``nn.LazyLinear`` & co.
    before their first forward: no shape, no data; they materialise in place)."""
    return isinstance(p, torch.nn.parameter.UninitializedTensorMixin)


def data_ptr(p: torch.Tensor) -> int:
    """``p.data_ptr()``, 0 where ``p`` has no data (uninitialised, or a subclass without it)."""
    try:
        return _data_ptr(p)
    except Exception as caught:  # noqa: BLE001
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        return 0


def shape(p: torch.Tensor) -> list[int]:
    """``list(p.shape)``; [] for an uninitialised parameter (no shape yet)."""
    return [] if uninitialized(p) else list(p.shape)


_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def checksum(p: torch.Tensor) -> torch.Tensor | None:
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


def l2_norms(tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """L2 norms as 0-d float32 tensors (16-bit tensors accumulated in float32), None
    where there is no tensor: one ``torch._foreach_norm`` per (device, dtype) over the
    dense ones, one read each; a sparse tensor's norm is that of its coalesced values;
    None also where a tensor subclass lacks the ops (never raises for that).
    No device sync (:func:`_values` does that). A float32 sum of squares can overflow:
    a finite tensor whose norm exceeds ~3.4e38 (values ~1e20 over 1,000 elements)
    gets ``inf``."""
    out: list = [None] * len(tensors)
    buckets: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        if t is None:
            continue
        if t.layout != torch.strided:  # sparse (nn.Embedding(sparse=True))
            out[i] = t.detach().coalesce().values().float().norm()
        else:
            buckets.setdefault((t.device, t.dtype), []).append(i)
    for (_, dtype), idx in buckets.items():
        acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else None  # never narrower than float32
        try:
            got = torch._foreach_norm([tensors[i].detach() for i in idx], 2, dtype=acc)
        except Exception as e:  # noqa: BLE001 - a tensor subclass without the op: one at a time, None where it fails
            if raised_by_signal_handler(e):
                raise
            got = [_norm_or_none(tensors[i], acc) for i in idx]
        for i, n in zip(idx, got):
            out[i] = None if n is None else n.float()
    return out


def _norm_or_none(t: torch.Tensor, acc: torch.dtype | None) -> torch.Tensor | None:
    """``t``'s L2 norm, or None when ``t`` (a tensor subclass) lacks the ops."""
    try:
        return torch.linalg.vector_norm(t.detach(), dtype=acc)
    except Exception as caught:  # noqa: BLE001
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        return None


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


class _Versions:
    """The version counter (and optimizer step count) each parameter had at its last
    snapshot, by tensor identity (a weak reference: a dead tensor's entry goes with
    it, a new tensor at a reused ``id`` is not mistaken for it)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[weakref.ref, int, int | None]] = {}

    def moved(self, p: torch.Tensor, step: int | None = None) -> bool:
        """True if ``p``'s version counter or its optimizer step count ``step`` moved since
        the last call for ``p`` (False on the first call, and when neither did); records
        both."""
        key, version = id(p), p._version
        entry = self._seen.get(key)
        if entry is not None and entry[0]() is p:
            if entry[1] == version and (step is None or entry[2] is None or entry[2] == step):
                if step is not None and entry[2] is None:
                    self._seen[key] = (entry[0], version, step)
                return False
            self._seen[key] = (entry[0], version, step)
            return True
        self._seen[key] = (weakref.ref(p, functools.partial(self._forget, key)), version, step)
        return False

    def _forget(self, key: int, ref: weakref.ref) -> None:
        entry = self._seen.get(key)
        if entry is not None and entry[0] is ref:
            del self._seen[key]


_VERSIONS = _Versions()


class Norms(dict):
    """The L2 norms one snapshot body read, as Python floats, for the hazard drain
    (torch-side only: never written to a snapshot). Keys: ``("value", id(p))`` and
    ``("grad", id(p))`` for every distinct model parameter, ``("state", id(p), k)`` for
    every floating, non-empty optimizer-state tensor ``optimizer.state[p][k]`` of a
    param-group member that requires grad (``exp_avg``, ``exp_avg_sq``, ``step``...).
    A value is ``nan``/``inf`` when the tensor holds a NaN/Inf, and also when a finite
    float32 tensor's sum of squares overflows (:func:`l2_norms`): a non-finite norm
    calls for an exact ``isfinite`` check of that tensor, a finite one proves every
    element finite. ``None`` where no norm was taken (no gradient). Valid only until
    anything writes those tensors again (the drain runs right after the body).
    :attr:`view`: the optimizer state as that body read it (``state_read.StateView``),
    so that the drain lists the state tensors without reading the state a second time."""

    view: "state_read.StateView | None" = None


def state_tensors(optimizer: torch.optim.Optimizer, params: list,
                  view: state_read.StateView | None = None) -> list[tuple[torch.Tensor, str, torch.Tensor]]:
    """``(p, k, values)`` for each floating, non-empty tensor in the optimizer state of
    each ``p`` in ``params`` whose values can be read: ``k`` its path below
    ``optimizer.state[p]`` (``"exp_avg"``; ``"0.exp_avg"``, ``"Q.1"`` in nested state),
    ``values`` the tensor itself or, for a quantized-state subclass, its
    ``dequantize()`` (:mod:`optcheck.pytorch.state_read`). What the NaN/Inf check
    (OC501) reads and :class:`Norms` holds as ``("state", id(p), k)``. ``view``: the
    state already read (:func:`state_read.read`). Never raises."""
    return state_read.floating(view if view is not None else state_read.read(optimizer), params)


def params(model: torch.nn.Module, steps: dict[int, int | None] | None = None,
           optimizer: torch.optim.Optimizer | None = None, norms: Norms | None = None,
           view: state_read.StateView | None = None) -> list[dict]:
    """Param records of ``named_parameters(remove_duplicate=False)``: a tied weight
    appears under each of its names, with one ref.

    Each distinct tensor is read once, however many names it has, and so is its
    gradient: ``grad_norm`` (L2 norm of ``.grad``) and ``value_norm`` (L2 norm of the
    values, float32: the parameter fingerprint :mod:`optcheck.judge.verdict` compares) come
    from one ``torch._foreach_norm`` per device and dtype over values and gradients
    together. With ``norms`` (and ``optimizer``), the same call also reads the
    optimizer state of every param-group member that requires grad
    (:func:`state_tensors`), and ``norms`` is filled with every norm taken (:class:`Norms`:
    the NaN/Inf check of parameters and state reads its answer there instead of
    reading the tensors again). ``checksum`` (:func:`checksum`, a second read of the
    values) is taken only where neither the version counter nor the optimizer's step
    count for the tensor (``steps``: ``{id(param): state[param]["step"]}``, from
    :func:`state`) moved since the tensor's last snapshot, or on its first one: fused
    optimizer kernels and ``p.data`` writes do not bump the version counter
    (``docs/parameter-identity.md``). Where either moved, ``checksum`` is None and
    that signal says the tensor was stepped. One device sync for all the norms.
    Cost on GPT-2 small (124.5 M parameters, 1 thread): one read of the values, one of
    the gradients and, with ``norms``, one of the state (``benchmarks/bench_snapshot.py``).
    ``view``: the optimizer state already read (:func:`state_read.read`)."""
    named = list(model.named_parameters(remove_duplicate=False))
    unique: dict[int, torch.Tensor] = {}
    for _, p in named:
        unique.setdefault(id(p), p)
    tensors = list(unique.values())
    ready = [p for p in tensors if not uninitialized(p)]  # a lazy module's parameters before its first forward
    n = len(tensors)
    grads = [local(p.grad) if p.is_leaf else None for p in tensors]  # .grad on a non-leaf warns and is None
    extra = []
    if norms is not None and optimizer is not None:
        members = {id(p): p for g in optimizer.param_groups for p in g["params"] if p.requires_grad}
        extra = state_tensors(optimizer, list(members.values()), view)
    read = l2_norms([local(p).detach() if not uninitialized(p) else None for p in tensors] + grads
                    + [local(v) for _, _, v in extra])
    floats = {i: t for i, t in enumerate(read) if t is not None}
    steps = steps or {}
    sums = {id(p): checksum(local(p)) for p in ready if not _VERSIONS.moved(p, steps.get(id(p)))}
    got = _values(floats)
    checks = _values({k: c.long() for k, c in sums.items() if c is not None})
    value_norms = {k: got.get(i) for i, k in enumerate(unique)}
    grad_norms = {k: got.get(n + i) for i, k in enumerate(unique)}
    if norms is not None:
        norms.update((("value", k), v) for k, v in value_norms.items())
        norms.update((("grad", k), v) for k, v in grad_norms.items())
        norms.update((("state", id(p), k), got.get(2 * n + i)) for i, (p, k, _) in enumerate(extra))
    out = [{
        "name": model_name(name), "ref": id(p), "data_ptr": data_ptr(p), "shape": shape(p),
        "dtype": dtype_name(p.dtype), "device": str(p.device), "is_leaf": p.is_leaf,
        "requires_grad": p.requires_grad, "grad": "set" if p.is_leaf and p.grad is not None else "none",
        "grad_norm": grad_norms[id(p)], "value_norm": value_norms[id(p)], "version": p._version,
        "checksum": checks.get(id(p)),
    } for name, p in named]
    for rec, (name, p) in zip(out, named):
        if under_fsdp1(name) and p.numel() == 0:  # FSDP1 (use_orig_params): none of it in this rank's shard
            rec["shard_empty"] = True
    return out


def groups(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Group records: options (everything but the tensors) and members."""
    out = []
    for i, g in enumerate(optimizer.param_groups):
        names = g.get("param_names")
        members = []
        for j, p in enumerate(g["params"]):
            members.append({
                "ref": id(p), "data_ptr": data_ptr(p), "name": names[j] if names and j < len(names) else None,
                "shape": shape(p), "dtype": dtype_name(p.dtype), "is_leaf": p.is_leaf,
                "requires_grad": p.requires_grad})
        options = {k: jsonable(v) for k, v in g.items() if k not in ("params", "param_names")}
        out.append({"index": i, "options": options, "members": members})
    return out


def state(optimizer: torch.optim.Optimizer, view: state_read.StateView | None = None) -> tuple[list[dict], int]:
    """State records, one per parameter key of ``optimizer.state`` (nested dicts and
    lists flattened to paths, :mod:`optcheck.pytorch.state_read`), and the bytes they
    hold. A state tensor on another device than its parameter carries ``device``.
    ``view``: the state already read. Never raises."""
    view = view if view is not None else state_read.read(optimizer)
    out, steps = [], {}
    for i, ps in enumerate(view.params):
        tensors, step = {}, ps.step
        try:
            pdev = str(ps.key.device)
        except Exception as caught:  # noqa: BLE001
            if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
                raise
            pdev = None
        for st in ps.tensors:
            rec = {"shape": st.shape, "dtype": None if st.dtype is None else dtype_name(st.dtype)}
            if st.device is not None and pdev is not None and st.device != pdev:
                rec["device"] = st.device
            tensors[st.path] = rec
        if isinstance(step, torch.Tensor):
            if step.device.type == "cpu":
                v = step.item()  # one call, no device to wait for
                step = int(v) if math.isfinite(v) else None
            else:
                steps[i], step = step.detach().reshape(()).double(), None  # read below, one sync per device
        out.append({"ref": id(ps.key), "step": step, "tensors": tensors})
    for i, v in _values(steps).items():
        out[i]["step"] = int(v) if math.isfinite(v) else None
    return out, view.nbytes


def notes(optimizer: object, view: state_read.StateView) -> list[str]:
    """One line per value of ``optimizer.state`` that could not be read
    (:attr:`state_read.StateView.skipped`), each (optimizer class, path, reason) only
    the first time this optimizer reports it."""
    if not view.skipped:
        return []
    try:
        seen = _NOTED.setdefault(optimizer, set())
    except TypeError:  # not weakly referenceable: no memory of what was said
        seen = set()
    out = []
    for path, why in view.skipped:
        if (path, why) in seen:
            continue
        seen.add((path, why))
        out.append(f"{type(optimizer).__name__} state {path!r}: {why}")
    return out


_NOTED: "weakref.WeakKeyDictionary[object, set]" = weakref.WeakKeyDictionary()


def tensor_census() -> tuple[int, int]:
    """(count, bytes) of live tensors reachable by the garbage collector, each storage's
    bytes once, after a ``gc.collect()`` (tensors only waiting for the cycle collector
    are not a leak). Walks only the objects created since the process-wide census
    first ran (:mod:`optcheck.pytorch.census`)."""
    return CENSUS()


#: snapshot field -> key of ``torch.cuda.memory_stats()`` (``torch/cuda/memory.py``, its
#: docstring lists them; the CUDA caching allocator's ``DeviceStats``,
#: ``c10/cuda/CUDACachingAllocator.h``). Bytes are summed over the devices in use.
DEVICE_STATS = {
    "device_allocated_bytes": "allocated_bytes.all.current",  # held by live tensors
    "device_reserved_bytes": "reserved_bytes.all.current",  # held by the caching allocator (≥ allocated)
    "device_peak_allocated_bytes": "allocated_bytes.all.peak",  # high-water mark since reset_peak_memory_stats
    "device_alloc_retries": "num_alloc_retries",  # cudaMalloc failed, the cache was flushed and it tried again
}


def device_memory(stats: list[dict]) -> dict:
    """Snapshot fields (:data:`DEVICE_STATS`) from the ``torch.cuda.memory_stats(device)``
    dictionaries of the devices in use, summed; a key a dictionary lacks counts 0 (an
    empty dictionary: that device's allocator has not allocated yet). Torch-free, so
    recorded dictionaries go through the same code as live ones."""
    return {field: int(sum(s.get(key, 0) for s in stats)) for field, key in DEVICE_STATS.items()}


def _cuda_devices(model: torch.nn.Module | None) -> list[int]:
    """Indices of the CUDA devices the model's parameters are on (the current device
    when none is, or no model is given); [] when CUDA is not in use."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    found = {p.device.index for p in model.parameters() if p.is_cuda} if model is not None else set()
    return sorted(i if i is not None else torch.cuda.current_device() for i in found) or [torch.cuda.current_device()]


def memory(state_bytes: int, census: bool = True, model: torch.nn.Module | None = None) -> dict:
    """Memory record: RSS (bytes, psutil), malloc heap in use (bytes, ``optcheck.heap``;
    ~2 µs, every snapshot: it carries OC401's fast path), optimizer-state bytes, live
    tensors and their bytes (when ``census``), and, when CUDA is in use, the caching
    allocator's allocated, reserved and peak bytes and its allocation retries
    (:func:`device_memory`, every snapshot)."""
    mem = {"rss_bytes": _PROC.memory_info().rss, "state_bytes": state_bytes}
    heap_bytes = heap.in_use_bytes()
    if heap_bytes is not None:
        mem["heap_in_use_bytes"] = heap_bytes
    if census:
        mem["live_tensors"], mem["live_tensor_bytes"] = tensor_census()
    devices = _cuda_devices(model)
    if devices:
        mem.update(device_memory([torch.cuda.memory_stats(d) for d in devices]))
    return mem


def snapshot_body(model: torch.nn.Module, optimizer: torch.optim.Optimizer, census: bool = True,
                  norms: Norms | None = None) -> dict:
    """The backend part of a schema-1 snapshot (see ``optcheck.record.snapshot``):
    params, groups, state, optimizer, memory, notes. The caller adds step, phase,
    trigger, loss, events and versions. ``norms`` (an empty :class:`Norms`): also read
    the optimizer state in the same pass as values and gradients, and hand every norm
    back there (for ``HazardProbes.drain(norms)``: one read of each tensor per
    snapshot, ``docs/memory.md``). ``notes``: each optimizer-state value that could not
    be read, the first time (:func:`notes`)."""
    view = state_read.read(optimizer)
    if norms is not None:
        norms.view = view
    st, state_bytes = state(optimizer, view)
    recs = params(model, {r["ref"]: r["step"] for r in st}, optimizer, norms, view)
    said = notes(optimizer, view) + trained_elsewhere(model, optimizer, recs)
    return {
        "params": recs, "groups": groups(optimizer), "state": st,
        "optimizer": {"type": type(optimizer).__name__, "state_init": "lazy", "identity": "ref"},
        "memory": memory(state_bytes, census, model), "notes": said,
    }


def trained_elsewhere(model: torch.nn.Module, optimizer: object, recs: list[dict]) -> list[str]:
    """Mark each param record that another live optimizer trains (``trained_by``: its
    class name; :mod:`optcheck.pytorch.other_optimizers`): a trainable parameter in no
    param group of ``optimizer``. Returns the note saying so (once per set of classes),
    or []. Never raises."""
    try:
        members = {id(p) for g in optimizer.param_groups for p in g["params"]}
        cand = {id(p): p for _, p in model.named_parameters() if p.requires_grad and id(p) not in members}
        if not cand:
            return []
        try:
            finder = _OTHERS.setdefault(optimizer, other_optimizers.OtherOptimizers())
        except TypeError:  # not weakly referenceable
            finder = other_optimizers.OtherOptimizers()
        owners = finder.owners(list(cand.values()), optimizer)
    except Exception as e:  # noqa: BLE001 - a model or optimizer we cannot list: nothing marked
        if raised_by_signal_handler(e):
            raise
        return []
    for r in recs:
        if r["ref"] in owners:
            r["trained_by"] = owners[r["ref"]]
    if not owners:
        return []
    classes = ", ".join(sorted(set(owners.values())))
    return [f"{len(owners)} parameter(s) are trained by another optimizer ({classes}): this Monitor reads "
            f"{type(optimizer).__name__}'s param groups and state only; watch the other with a Monitor of its own"]


_OTHERS: "weakref.WeakKeyDictionary[object, other_optimizers.OtherOptimizers]" = weakref.WeakKeyDictionary()
