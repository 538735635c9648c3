"""optcheck's module hooks leave no trace in what the user saves or copies (issue 46).

The hazard probes put forward hooks on the watched model (the re-run's pre-hook on the model
itself on every step, ``replay.py``; pre and post hooks on every module on armed steps,
``arming.py``). PyTorch keeps a module's hooks in ``OrderedDict`` s of its ``__dict__``
(``_forward_pre_hooks``, ``_forward_hooks``, and flags keyed by the same handle id in
``_forward_pre_hooks_with_kwargs`` / ``_forward_hooks_always_called``;
``torch/nn/modules/module.py``), and ``torch.save(model)``, ``pickle`` and
``copy.deepcopy(model)`` copy them with the module's ``__dict__``. A file saved so would name
optcheck's globals: ``torch.load``'s default ``weights_only=True`` refuses it ("GLOBAL getattr
was not an allowed global"), and a process without optcheck cannot load it at all.

:func:`own` marks each of optcheck's hook handles: its id (ids come from one process-wide
counter, ``torch.utils.hooks.RemovableHandle.next_id``, so no user hook shares one) and the
hook dicts it was put in (``RemovableHandle.hooks_dict_ref`` / ``extra_dict_ref``).
:func:`install` puts one reducer for ``collections.OrderedDict`` in ``copyreg.dispatch_table``
(which ``pickle``, ``torch.save``'s pickler and ``copy.deepcopy`` consult before an object's own
``__reduce_ex__``): a marked hook dict reduces without optcheck's entries; every other
``OrderedDict`` reduces exactly as ``OrderedDict.__reduce__`` does (a state dict, the user's
own). Whatever reduces a module's ``__dict__`` (``Module.__getstate__``, ``RNNBase``'s and
``DistributedDataParallel``'s own ``__getstate__``, ``GraphModule``'s ``__reduce__`` and
``__deepcopy__``), the copy or the loaded model has the user's hooks and none of optcheck's,
as without optcheck; the live model keeps its own until ``close()``. Cost: one dict lookup
per ``OrderedDict`` pickled or deep-copied, nothing per training step.

Limits: a subclass of ``OrderedDict`` (not optcheck's concern: PyTorch's hook dicts are plain
``OrderedDict`` s) and a pickler with a ``dispatch_table`` of its own are not filtered; there
optcheck's hook objects pickle as no-ops of optcheck's (``HazardProbes.__reduce__``), and such
a file needs optcheck to load (docs/hazards.md). ``torch.jit.script`` of a module compiles its
forward hooks and cannot compile optcheck's: script after ``close()`` (``torch.jit.trace`` and
``torch.export`` work while watched).
"""

from __future__ import annotations

import copyreg
import weakref
from collections import OrderedDict

_IDS: set[int] = set()  # handle ids of optcheck's module hooks in place now
_DICTS: "dict[int, weakref.ref]" = {}  # id() of a hook dict optcheck put a hook in -> weakref to it
_reduce_plain = OrderedDict.__reduce__
_chained = None  # a reducer for OrderedDict that was in copyreg.dispatch_table before ours


class Owned:
    """A hook handle of optcheck's: ``remove()`` removes the hook and forgets its id."""

    __slots__ = ("handle", "id")

    def __init__(self, handle) -> None:
        self.handle, self.id = handle, handle.id

    def remove(self) -> None:
        _IDS.discard(self.id)
        self.handle.remove()


def own(handle) -> Owned:
    """Mark the module hook behind ``handle`` (a ``torch.utils.hooks.RemovableHandle``) as
    optcheck's: left out of every pickle and deep copy of its module until the returned
    handle's ``remove()``."""
    _IDS.add(handle.id)
    for ref in (handle.hooks_dict_ref, *getattr(handle, "extra_dict_ref", ())):
        d = ref()
        if d is not None:
            _DICTS[id(d)] = ref
    return Owned(handle)


def _reduce_ordered_dict(d):
    """``copyreg`` reducer of ``OrderedDict``: a hook dict holding optcheck's hooks without them."""
    ref = _DICTS.get(id(d)) if _IDS else None
    if ref is not None and ref() is d and not _IDS.isdisjoint(d):
        ids = _IDS
        return OrderedDict, (), None, None, iter([(k, v) for k, v in d.items() if k not in ids])
    if _chained is not None:
        return _chained(d)
    return _reduce_plain(d)


def install() -> None:
    """Put the reducer in ``copyreg.dispatch_table`` (once per process)."""
    global _chained
    have = copyreg.dispatch_table.get(OrderedDict)
    if have is _reduce_ordered_dict:
        return
    _chained = have
    copyreg.pickle(OrderedDict, _reduce_ordered_dict)
