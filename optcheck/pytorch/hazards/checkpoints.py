"""What an activation checkpoint keeps for its recompute, read from the checkpoint itself
(``torch/utils/checkpoint.py``, torch 2.1-2.13), for the OC301 probe (``inplace.py``).

``torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=..., **kwargs)`` runs
``function`` once in forward without keeping its activations and again in backward (the
recompute). The recompute reads its inputs again:

- positional ``args``: a non-reentrant checkpoint keeps them as saved tensors
  (``_CheckpointFrame.save_inputs``), a reentrant one with ``ctx.save_for_backward``;
  PyTorch compares their version counters when unarmed, the probes' pack hook when armed;
- keyword ``kwargs`` (non-reentrant only) and what ``function`` binds (a
  ``functools.partial``'s args and keywords: HF ``GradientCheckpointingLayer`` passes
  ``attention_mask``, ``position_embeddings``, ... that way, both kinds): held by reference,
  **no version counter is compared by anyone**; written in place between the forward and
  the recompute, the recompute runs on the new values and backward gives wrong gradients
  without an error.

The kind is read from the running checkpoint, never guessed: a non-reentrant checkpoint's
forward runs under its ``_checkpoint_hook`` saved-tensor hooks (their pack hook's closure
holds the ``_CheckpointFrame``), its recompute under the unpack hook of those hooks; a
reentrant one's forward and recompute run in ``CheckpointFunction.forward`` /
``CheckpointFunction.backward``. All reads are of Python frames and closures, on the
rare paths only (once per checkpoint call); what cannot be read gives ``None``.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.utils.checkpoint as _ckpt_mod

NON_REENTRANT, REENTRANT = "non-reentrant", "reentrant"

_CHECKPOINT_CODE = inspect.unwrap(_ckpt_mod.checkpoint).__code__
_CF = getattr(_ckpt_mod, "CheckpointFunction", None)
_CF_FORWARD = _CF.forward.__code__ if _CF is not None else None
_CF_BACKWARD = _CF.backward.__code__ if _CF is not None else None
_FWD_PACK = "_checkpoint_hook.__init__.<locals>.pack_hook"
_RECOMPUTE_QUALNAMES = ("_checkpoint_hook.__init__.<locals>.unpack_hook",
                        "_checkpoint_without_reentrant_generator.<locals>.recompute_fn")
MAX_DEPTH = 64  # frames walked outwards at most


def non_reentrant_frame(pack):
    """The ``_CheckpointFrame`` of the non-reentrant checkpoint whose forward runs now, from
    the pack hook on top of the saved-tensor hooks stack; None for any other hook."""
    code = getattr(pack, "__code__", None)
    if code is None or getattr(code, "co_qualname", "") != _FWD_PACK or not pack.__closure__:
        return None
    try:
        return pack.__closure__[code.co_freevars.index("frame")].cell_contents
    except (ValueError, IndexError):  # another torch's closure
        return None


def reentrant_forward(start) -> object | None:
    """The frame of ``CheckpointFunction.forward`` (a reentrant checkpoint's forward) around
    ``start``, or None."""
    f, n = start, 0
    while f is not None and n < MAX_DEPTH:
        if f.f_code is _CF_FORWARD:
            return f
        f, n = f.f_back, n + 1
    return None


def recompute_kind(start) -> str | None:
    """Which checkpoint's recompute runs at ``start`` (a frame): ``"reentrant"``
    (``CheckpointFunction.backward`` on the stack), ``"non-reentrant"`` (the unpack hook
    of ``_checkpoint_hook`` re-running ``recompute_fn``), None when neither is."""
    f, n = start, 0
    while f is not None and n < MAX_DEPTH:
        code = f.f_code
        if code is _CF_BACKWARD:
            return REENTRANT
        if getattr(code, "co_qualname", "") in _RECOMPUTE_QUALNAMES:
            return NON_REENTRANT
        f, n = f.f_back, n + 1
    return None


def _name(fn) -> str:
    if isinstance(fn, functools.partial):
        return f"functools.partial({_name(fn.func)})"
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _tensors(value, label: str):
    """``(label, tensor)`` for a tensor, or the tensors of a tuple/list/dict one level down
    (``position_embeddings=(cos, sin)``)."""
    if isinstance(value, torch.Tensor):
        yield label, value
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            if isinstance(v, torch.Tensor):
                yield f"{label}[{i}]", v
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, torch.Tensor):
                yield f"{label}[{k!r}]", v


def _bound(fn, what: str):
    """Tensors a ``functools.partial`` (nested ones too) binds: held by reference."""
    depth = 0
    while isinstance(fn, functools.partial) and depth < 8:
        for i, a in enumerate(fn.args):
            yield from _tensors(a, f"argument {i} bound in {what}")
        for k, v in (fn.keywords or {}).items():
            yield from _tensors(v, f"keyword {k!r} bound in {what}")
        fn, depth = fn.func, depth + 1


def kept_inputs(kind: str, start) -> tuple[list, list, str | None, object | None]:
    """What the checkpoint running at ``start`` (a frame inside its forward) re-reads in its
    recompute: ``(versioned, unversioned, function name, call-site frame)``, each list of
    ``(label, tensor)``. ``versioned``: positional arguments (kept as saved tensors, their
    versions compared); ``unversioned``: keyword arguments and tensors bound in the function
    (held by reference, no version compared). Read from ``checkpoint()``'s own frame
    (``function``, ``args``, ``kwargs``); for a reentrant checkpoint started without it,
    from ``CheckpointFunction.forward``'s frame. Empty lists when neither is on the stack."""
    f, n, cf = start, 0, None
    while f is not None and n < MAX_DEPTH:
        if f.f_code is _CHECKPOINT_CODE:
            break
        if f.f_code is _CF_FORWARD and cf is None:
            cf = f
        f, n = f.f_back, n + 1
    else:
        f = None
    if f is not None:
        loc = f.f_locals
        fn, args, kwargs = loc.get("function"), loc.get("args") or (), loc.get("kwargs") or {}
        site = f.f_back
    elif kind == REENTRANT and cf is not None:
        loc = cf.f_locals
        fn, args, kwargs, site = loc.get("run_function"), loc.get("args") or (), {}, None
    else:
        return [], [], None, None
    what = _name(fn)
    versioned = [t for i, a in enumerate(args) for t in _tensors(a, f"argument {i} of {what}")]
    unversioned = [t for k, v in kwargs.items() for t in _tensors(v, f"keyword argument {k!r} of {what}")]
    unversioned += list(_bound(fn, what))
    return versioned, unversioned, what, site
