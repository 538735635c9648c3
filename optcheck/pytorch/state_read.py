"""Reading an optimizer's state without ever raising: what the snapshot, the NaN/Inf
check (OC501) and the state bytes take from ``optimizer.state``.

``torch.optim`` keeps one flat dict of tensors per parameter (``state[p] =
{"exp_avg": t, "step": t}``), but third-party optimizers do not
(``docs/optimizers.md``):

- **nested state**: heavyball keeps it one level down (``state[p] = {0: {...}}``),
  SOAP/Kron-style preconditioners sit in lists of tensors
  (``"Q": [t0, t1]``). Dicts, lists and tuples are descended, at most
  :data:`MAX_DEPTH` levels below ``state[p]`` and :data:`MAX_TENSORS` tensors per
  parameter; a tensor found there is named by its path (``"0.exp_avg"``,
  ``"Q.1"``).
- **keys that are not parameters**: pytorch-optimizer's SPAM and MADGRAD keep
  counters under string keys of ``optimizer.state`` (``state["total_step"] = 0``).
  Such an entry is no parameter's state: skipped.
- **values that are not tensors**: ints, floats, sets, ``None``, functions and
  closures are read as nothing (a ``"step"`` number is kept as the step count).
- **references back to the optimizer's own structure**: optimi keeps each
  parameter's param group in its state (``state[p]["group"] = group``, for the
  per-parameter ``step(param=p)`` of ``gradient_release``); a param group (one of
  ``optimizer.param_groups``, or any dict with a ``"params"`` list) and a parameter
  of the optimizer found inside the state are no state: skipped silently (their
  tensors are the parameters, not moments of them).
- **tensor subclasses that implement only the ops their optimizer needs**
  (torchao's ``OptimState8bit`` / ``OptimState4bit`` / ``OptimStateFp8`` raise
  ``NotImplementedError`` on ``aten._foreach_norm``, ``isfinite``...): their
  values are read through ``dequantize()`` where the subclass defines it
  (a float tensor of the logical shape, made at snapshot time), else only their
  shape, dtype and identity; their bytes are those of the tensors they hold
  (``__tensor_flatten__``).

What cannot be read is skipped and described in :attr:`StateView.skipped`
(``(state key path, why)``): the snapshot turns each distinct one into a note
once (``optcheck.pytorch.probe.snapshot_body``). Nothing here raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from optcheck.pytorch.shards import local  # FSDP2: a DTensor's shard on this rank
from optcheck.pytorch.guard import raised_by_signal_handler

#: levels of dicts/lists descended below ``optimizer.state[p]``
MAX_DEPTH = 6
#: tensors read per parameter (a per-parameter list longer than this is cut)
MAX_TENSORS = 64

_BASE_DISPATCH = torch.Tensor.__torch_dispatch__
_BASE_FUNCTION = torch.Tensor.__torch_function__.__func__
_DISABLED_FUNCTION = torch._C._disabled_torch_function_impl
_SCALARS = (bool, int, float, str, bytes, type(None), set, frozenset)


def plain(t: torch.Tensor) -> bool:
    """True for a tensor whose ops run as PyTorch's own (``torch.Tensor``,
    ``nn.Parameter``, a subclass that overrides neither ``__torch_dispatch__`` nor
    ``__torch_function__``); False for a wrapper subclass that may implement only
    some ops."""
    cls = type(t)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        return True
    if getattr(cls, "__torch_dispatch__", _BASE_DISPATCH) is not _BASE_DISPATCH:
        return False
    fn = getattr(getattr(cls, "__torch_function__", None), "__func__", None)
    return fn is None or fn is _BASE_FUNCTION or fn is _DISABLED_FUNCTION


@dataclass
class StateTensor:
    """One tensor of a parameter's state.

    Attributes:
        path: where it sits below ``optimizer.state[p]`` (``"exp_avg"``, ``"0.exp_avg"``,
            ``"Q.1"``).
        tensor: the tensor as stored (an FSDP2 DTensor's local shard).
        values: a plain tensor holding its values (``tensor`` itself, or its
            ``dequantize()``), or None where only shape, dtype and identity are known.
        shape, dtype, device: its metadata (``shape`` a list of ints; ``dtype`` a
            ``torch.dtype``; ``device`` a string); None where the tensor refused them.
        nbytes: bytes it holds (the inner tensors of a subclass, each once).
    """

    path: str
    tensor: torch.Tensor
    values: torch.Tensor | None
    shape: list | None
    dtype: torch.dtype | None
    device: str | None
    nbytes: int


@dataclass
class ParamState:
    """The state of one parameter: ``key`` (the parameter, the state's key), ``step``
    (the optimizer's step count for it where a ``"step"`` entry was found, at any
    depth: an int, or the 0-d tensor holding it), ``tensors``."""

    key: torch.Tensor
    step: Any = None
    tensors: list[StateTensor] = field(default_factory=list)
    capped: bool = False  # more than MAX_TENSORS tensors: the rest were not read (said once)


@dataclass
class StateView:
    """What :func:`read` got from ``optimizer.state``: ``params`` (one
    :class:`ParamState` per parameter key), ``skipped`` (``(path, why)`` of each
    value not read; a path is ``"<key>"`` or ``"<key>/<path below it>"``) and
    ``nbytes`` (bytes of every tensor read)."""

    params: list[ParamState] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    nbytes: int = 0


def _items(obj: Any) -> list | None:
    """``obj.items()`` as a list, or None when that fails."""
    try:
        return list(obj.items())
    except Exception as caught:  # noqa: BLE001 - a state we cannot list is skipped, never raised
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        return None


def _nbytes(t: torch.Tensor) -> int:
    """Bytes ``t`` holds: its elements, or for a wrapper subclass those of the inner
    tensors it flattens to (``__tensor_flatten__``, the protocol of traceable
    subclasses)."""
    if plain(t):
        return t.numel() * t.element_size()
    flatten = getattr(t, "__tensor_flatten__", None)
    if callable(flatten):
        names, _ = flatten()
        inner = [getattr(t, n) for n in names]
        return sum(_nbytes(x) for x in inner if isinstance(x, torch.Tensor))
    return t.numel() * t.element_size()


def _values(t: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
    """A plain tensor with ``t``'s values, and why there is none."""
    if plain(t):
        if t.is_meta:
            return None, "values not read, shape and dtype only: a tensor on the meta device (no data)"
        return t, None
    deq = getattr(type(t), "dequantize", None)
    if deq is None or deq is torch.Tensor.dequantize:
        return None, f"values not read, shape and dtype only: {type(t).__name__} is a tensor subclass " \
                     f"without dequantize()"
    try:
        out = t.dequantize()
    except Exception as e:  # noqa: BLE001
        if raised_by_signal_handler(e):  # a signal handler's exception is the user's
            raise
        return None, f"values not read, shape and dtype only: {type(t).__name__}.dequantize() raised " \
                     f"{type(e).__name__}"
    if not isinstance(out, torch.Tensor) or not plain(out):
        return None, f"values not read, shape and dtype only: {type(t).__name__}.dequantize() gave no " \
                     f"plain tensor"
    return out.detach(), None


def _tensor(path: str, t: torch.Tensor, skipped: list) -> StateTensor | None:
    try:
        t = local(t)
        shape, dtype, device = list(t.shape), t.dtype, str(t.device)
        nbytes = _nbytes(t)
    except Exception as e:  # noqa: BLE001
        if raised_by_signal_handler(e):  # a signal handler's exception is the user's
            raise
        skipped.append((path, f"not read: a {type(t).__name__} whose shape, dtype or size could not be read "
                              f"({type(e).__name__})"))
        return None
    values, why = _values(t)
    if why is not None:
        skipped.append((path, why))
    return StateTensor(path, t, values, shape, dtype, device, nbytes)


def _param_group(node: Any) -> bool:
    """A dict shaped as a param group: a ``"params"`` list or tuple."""
    return isinstance(node, dict) and isinstance(node.get("params"), (list, tuple))


def _walk(node: Any, path: str, depth: int, out: ParamState, skipped: list, own: frozenset = frozenset()) -> None:
    """Collect the tensors under ``node`` (at ``path`` below ``state[p]``) into ``out``
    (see the module docstring); ``own``: the ``id`` of the optimizer's param groups and
    parameters (never state)."""
    if id(node) in own or _param_group(node):
        return
    name = path or "(value)"
    last = path.rsplit(".", 1)[-1]
    if isinstance(node, torch.Tensor):
        if len(out.tensors) >= MAX_TENSORS:  # a history kept in lists (LBFGS: old_dirs, old_stps, ro, al)
            if not out.capped:  # one note for them all, not one per list index
                out.capped = True
                skipped.append((f"past the first {MAX_TENSORS} tensors of a parameter",
                                "not read (the first ones are checked; e.g. a history kept in lists)"))
            return
        st = _tensor(name, node, skipped)
        if st is not None:
            out.tensors.append(st)
            if last == "step" and out.step is None and st.values is node and node.numel() == 1:
                out.step = node  # a 0-d step counter (torch.optim): read by the caller
        return
    if last == "step" and out.step is None and isinstance(node, (int, float)) and not isinstance(node, bool) \
            and math.isfinite(node):
        out.step = int(node)
    if isinstance(node, _SCALARS):
        return
    if isinstance(node, (list, tuple)):
        children = list(enumerate(node))
    elif isinstance(node, dict) or hasattr(node, "items"):
        children = _items(node)
        if children is None:
            skipped.append((name, f"not read: a {type(node).__name__} whose items could not be listed"))
            return
    else:
        return  # any other object (a function, a module, a closure) holds no state we read
    if depth >= MAX_DEPTH:
        skipped.append((name, f"not read: nested deeper than {MAX_DEPTH} levels"))
        return
    for k, v in children:
        _walk(v, f"{path}.{k}" if path else str(k), depth + 1, out, skipped, own)


def _own(optimizer: Any) -> frozenset:
    """The ``id`` of ``optimizer``'s param groups and of their parameters (empty when
    they cannot be listed)."""
    try:
        groups = list(optimizer.param_groups)
        return frozenset([id(g) for g in groups] + [id(p) for g in groups for p in g["params"]])
    except Exception as caught:  # noqa: BLE001 - groups we cannot list: nothing to leave out
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        return frozenset()


def read(optimizer: Any) -> StateView:
    """Every tensor of ``optimizer.state`` that can be read, by parameter
    (:class:`StateView`); never raises. Cost: one pass over the state's Python
    containers, plus one ``dequantize()`` per quantized-state tensor."""
    view = StateView()
    items = _items(getattr(optimizer, "state", None))
    if items is None:
        view.skipped.append(("(state)", f"not read: a {type(getattr(optimizer, 'state', None)).__name__} "
                                        f"whose items could not be listed"))
        return view
    own = _own(optimizer)
    for key, value in items:
        if not isinstance(key, torch.Tensor):
            view.skipped.append((f"key {key!r:.40}", f"not read: a state key that is a {type(key).__name__}, "
                                                 f"not a parameter"))
            continue
        ps = ParamState(key)
        if isinstance(value, (torch.Tensor, dict, list, tuple)) or hasattr(value, "items"):
            _walk(value, "", 0, ps, view.skipped, own)
        elif not isinstance(value, _SCALARS):
            view.skipped.append(("(value)", f"not read: a {type(value).__name__}, not a dict of tensors"))
        view.nbytes += sum(t.nbytes for t in ps.tensors)
        view.params.append(ps)
    return view


def floating(view: StateView, members: list) -> list[tuple[torch.Tensor, str, torch.Tensor]]:
    """``(p, path, values)`` for each floating, non-empty state tensor whose values can
    be read (:attr:`StateTensor.values`), of the parameters ``members``: what the
    NaN/Inf check (OC501) reads."""
    ids = {id(p) for p in members}
    out = []
    for ps in view.params:
        if id(ps.key) not in ids:
            continue
        for st in ps.tensors:
            v = st.values
            if v is not None and v.is_floating_point() and v.numel() > 0:
                out.append((ps.key, st.path, v))
    return out
