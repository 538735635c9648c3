"""Small tensor helpers of the hazard probes (addresses, module outputs, names)."""

from __future__ import annotations

from operator import attrgetter
from typing import Iterable

import torch

from optcheck.pytorch.names import model_name
from optcheck.pytorch.shards import local
from optcheck.pytorch.guard import raised_by_signal_handler

_VERSION = attrgetter("_version")
MAX_SAMPLES = 8  # per-event lists (parameter names, modules) are cut to this many in "detail"


def _parameter_like(t: torch.Tensor) -> bool:
    """A parameter, or a view of one (``weight.t()``, which ``addmm`` saves): tensors the
    optimizer, ``load_state_dict`` or an init routine write in place between steps.
    They are left out of the eager version check (a forward whose graph is never
    backwarded, e.g. a validation loss without ``no_grad``, followed by
    ``model.load_state_dict(sd)``, is no hazard) and checked at unpack only, i.e. when
    a backward really needs them (``optimizerD.step()`` before the generator's
    ``backward()`` through D is caught there)."""
    base = t._base if t._base is not None else t
    return base.is_leaf and (base.requires_grad or isinstance(base, torch.nn.Parameter))


def _float_outputs(out) -> tuple[bool, bool]:
    """(has a floating tensor output, any floating output requires grad) of a
    module's output (a tensor, or a tuple/list/dict of them, one level deep)."""
    if isinstance(out, torch.Tensor):
        if out.is_floating_point() or out.is_complex():
            return True, out.requires_grad
        return False, False
    vals: Iterable = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    has = False
    for v in vals:
        if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex()):
            if v.requires_grad:
                return True, True
            has = True
    return has, False


def _tensors(args) -> Iterable[torch.Tensor]:
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (tuple, list)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b


def _float_tensors(out) -> list:
    """The floating tensors of a module output (a tensor, or a tuple/list/dict of them)."""
    vals = [out] if isinstance(out, torch.Tensor) else \
        list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, (tuple, list)) else []
    return [v for v in vals if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())]


def _grad_fns(out) -> list:
    """``grad_fn`` of each tensor of a module output (a tensor, or a tuple/list/dict of them)."""
    if isinstance(out, torch.Tensor):
        return [out.grad_fn] if out.grad_fn is not None else []
    vals: Iterable = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    return [v.grad_fn for v in vals if isinstance(v, torch.Tensor) and v.grad_fn is not None]


def _ptr(t: torch.Tensor) -> int:
    try:
        return t.data_ptr()
    except Exception as caught:  # noqa: BLE001 - sparse, meta, tensor subclasses without storage
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        return 0


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception as caught:  # noqa: BLE001 - sparse, meta, tensor subclasses without storage
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        return 0


def _safe(fn):
    try:
        return fn()
    except Exception as caught:  # noqa: BLE001
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        return None


def _dense(g: torch.Tensor) -> torch.Tensor:
    """The values of a gradient, dense (``nn.Embedding(sparse=True)`` gives sparse COO
    gradients, which ``torch._foreach_norm`` does not take); an FSDP2 DTensor's local
    shard (reading a DTensor whole is a collective: ``optcheck/distributed/shards.py``)."""
    g = local(g)
    return g._values() if g.is_sparse else g


def _clean(name: str) -> str:
    """A module or parameter name without the levels wrappers add (``optcheck/pytorch/names.py``:
    ``torch.compile``'s ``_orig_mod``, FSDP1's ``_fsdp_wrapped_module``, ...): ``_orig_mod.fc.weight`` → ``fc.weight``."""
    return model_name(name)
