"""Who wrote a saved tensor in place: a ``__torch_function__`` mode that sees every in-place
torch call of an armed step with the Python frame that made it (docs/hazards.md, "How the
writer is found").

PyTorch calls the ``__torch_function__`` of the modes on its torch-function mode stack for
every function and ``Tensor`` method of its Python API (``torch/overrides.py``,
``handle_torch_function``; the stack is thread-local and captured by the autograd engine for
its worker threads). :class:`WriteWatch` is such a mode. A call that writes in place — a
method or function named with a trailing ``_`` (``index_copy_``, ``add_``, ``masked_fill_``,
``copy_``, ``torch.relu_``, ``torch._foreach_mul_``), ``x[i] = v`` (``Tensor.__setitem__``),
``x += y`` (``Tensor.__iadd__`` and the other augmented assignments), any call given
``out=``, a functional given ``inplace=True`` (``F.relu``, ``F.dropout``) — is run, then
handed to the probes with its target tensors and its frame
(:meth:`optcheck.pytorch.hazards.inplace.InplaceProbe._seen_write`). Every other call is run
as it is: the cost is the mode's dispatch, about 1.5–3.5 µs per torch call from Python, on
armed steps only (``benchmarks/bench_hazards.py``).

What the mode cannot see: ops that do not go through Python's torch API (``torch.ops.aten.*``
called directly, a C++ extension's kernels), and anything inside ``backward()`` outside a
module's forward: ``Tensor.backward`` is itself dispatched through the mode, which
``handle_torch_function`` pops for the length of that call, so a tensor hook or a custom
``autograd.Function``'s ``backward`` runs without it. Inside backward the probes push the mode
again for the length of each module forward (a checkpoint's recompute), see ``hooks.py``.

The mode stack is LIFO and ``TorchFunctionMode.__exit__`` pops whatever is on top
(``torch/overrides.py``): :class:`ModeSlot` puts the mode at the bottom of the stack and
takes it out from wherever it is, so a user's own mode (entered around the forward, say)
stays above it and its ``__exit__`` pops the user's mode, never optcheck's.
"""

from __future__ import annotations

import functools
import sys
import threading

import torch
from torch.overrides import TorchFunctionMode

from optcheck.pytorch.guard import raised_by_signal_handler

_stack_len = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_push = torch._C._push_on_torch_function_stack
_pop = torch._C._pop_torch_function_stack
_disabled = torch._C.DisableTorchFunction

#: augmented assignments (``x += y`` calls ``Tensor.__iadd__``)
_AUGMENTED = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                        "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
                        "__imatmul__"})
#: names with a trailing ``_`` that write nothing a version counter sees
_NOT_WRITES = frozenset({"requires_grad_", "retain_grad_", "share_memory_", "register_hook_", "_backward_hooks_",
                         "pin_memory_", "record_stream_"})

WRITES_FIRST, WRITES_LIST = 1, 2  # the first argument is written; every tensor of the first argument (a list)


def classify(func) -> int:
    """0 (no write), :data:`WRITES_FIRST` or :data:`WRITES_LIST` for a torch function or
    ``Tensor`` method, from its name (``out=`` and ``inplace=True`` are seen per call)."""
    name = getattr(func, "__name__", None)
    if not isinstance(name, str):
        return 0
    if name == "__setitem__" or name in _AUGMENTED:
        return WRITES_FIRST
    if name.endswith("_") and not name.endswith("__") and name not in _NOT_WRITES:
        return WRITES_LIST if name.startswith("_foreach_") else WRITES_FIRST
    return 0


def op_name(func, kwargs: dict | None) -> str:
    """How a finding names the op: ``index_copy_``, ``x[...] = ...``, ``+=``, ``add(out=...)``,
    ``relu(inplace=True)``."""
    name = getattr(func, "__name__", None) or repr(func)
    if name == "__setitem__":
        return "x[...] = ... (__setitem__)"
    if name in _AUGMENTED:
        return {"__iadd__": "+=", "__isub__": "-=", "__imul__": "*=", "__itruediv__": "/=",
                "__ifloordiv__": "//=", "__imod__": "%=", "__ipow__": "**=", "__iand__": "&=", "__ior__": "|=",
                "__ixor__": "^=", "__ilshift__": "<<=", "__irshift__": ">>=", "__imatmul__": "@="}[name] + \
            f" ({name})"
    if kwargs and "out" in kwargs:
        return f"{name}(out=...)"
    if kwargs and kwargs.get("inplace") is True:
        return f"{name}(inplace=True)"
    return name


def targets(func, kind: int, args: tuple, kwargs: dict | None) -> list:
    """The tensors a writing call wrote: its first argument (a list of them for
    ``_foreach_*_``), the tensors given as ``out=``, the input of an ``inplace=True`` call."""
    out = []
    if kwargs and "out" in kwargs:
        o = kwargs["out"]
        out.extend(o if isinstance(o, (tuple, list)) else (o,))
    first = args[0] if args else (kwargs or {}).get("input", (kwargs or {}).get("self"))
    if kind == WRITES_LIST and isinstance(first, (tuple, list)):
        out.extend(first)
    elif kind or (kwargs and kwargs.get("inplace") is True):
        out.append(first)
    return [t for t in out if isinstance(t, torch.Tensor)]


class WriteWatch(TorchFunctionMode):
    """The mode: runs every torch call; hands each in-place one to ``sink(func, kind, args,
    kwargs, frame)`` after it ran (``frame``: the caller's). ``sink`` must not raise; if it
    does, the error goes to ``on_error`` and the call's result is returned all the same."""

    def __init__(self, sink, on_error):
        super().__init__()
        self.sink, self.on_error = sink, on_error
        self.kinds: dict = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kind = self.kinds.get(func)
        if kind is None:
            kind = self.kinds[func] = classify(func)
        if not kwargs:
            if not kind:
                return func(*args)
            out = func(*args)
        else:
            out = func(*args, **kwargs)
            if not kind and "out" not in kwargs and kwargs.get("inplace") is not True:
                return out
        if torch.compiler.is_compiling():
            return out
        try:
            self.sink(func, kind, args, kwargs, sys._getframe(1))
        except Exception as e:  # noqa: BLE001 - never into the user's step
            if raised_by_signal_handler(e):
                raise
            self.on_error(e)
        return out


def unmoded(hook):
    """Decorator for a probe hook (a method of an object with the two slots ``_slot`` and
    ``_bw_slot``): while the write log's mode is on, run it with torch-function handling off.
    Each tensor read (``t._version``, ``t.grad_fn``, ``t.requires_grad``...) is a torch function,
    3-4 µs through a mode against 0.1-0.5 µs without; the probes' own reads are not the user's
    calls. Entering ``torch._C.DisableTorchFunction`` costs about 0.6 µs; with the mode off
    (every unarmed step) the hook runs as it is."""

    @functools.wraps(hook)
    def run(self, *args):
        if not (self._slot.on or self._bw_slot.on):
            return hook(self, *args)
        with _disabled():
            return hook(self, *args)

    return run


class ModeSlot:
    """One :class:`WriteWatch` on the current thread's torch-function mode stack, put in at the
    bottom (above ``torch.device``'s ``DeviceContext``, which must stay lowest) and taken out
    wherever it is: a user's own mode, entered before or after it, stays above it, and its
    ``__exit__`` (which pops the top) pops the user's mode, never this one."""

    def __init__(self, mode: WriteWatch):
        self.mode = mode
        self._thread = None
        #: the mode is in this slot (an attribute, not a property: read by every probe hook, issue 34)
        self.on = False

    def _pushed(self) -> bool:
        """The mode is on this thread's stack now."""
        return any(_stack_at(i) is self.mode for i in range(_stack_len()))

    def push(self) -> None:
        if self._thread is not None:
            return
        modes = _take_all()
        k = 0
        while k < len(modes) and type(modes[k]).__name__ == "DeviceContext":
            k += 1
        for m in modes[:k] + [self.mode] + modes[k:]:
            _push(m)
        self._thread = threading.get_ident()
        self.on = True

    def pop(self) -> bool:
        """Take the mode out (True), or leave it for a later call when called from another
        thread or inside ``backward()`` (False)."""
        if self._thread is None:
            return True
        if threading.get_ident() != self._thread or torch._C._current_graph_task_id() != -1:
            return False  # inside backward() the mode is popped for the call's length (handle_torch_function)
        self.pop_here()
        return True

    def release(self) -> None:
        """For good (the probes are removed): take the mode out of this thread's stack now, even
        inside ``backward()``, when this thread put it in; from another thread, as :meth:`pop`."""
        if self._thread == threading.get_ident():
            self.pop_here()
        else:
            self.pop()

    def pop_here(self) -> None:
        """Take the mode out of this thread's stack now (inside backward(): at the end of the
        module forward that put it in)."""
        if self._thread is None:
            return
        if not self._pushed():
            # not on the stack here: torch took it out for the length of the torch call this runs in (a
            # torch.autograd.backward the mode itself handles, bound before the Monitor wrapped it) and
            # puts it back after; the next pop or release finds it (before, it stayed on for good)
            return
        for m in [m for m in _take_all() if m is not self.mode]:
            _push(m)
        self._thread = None
        self.on = False


def _take_all() -> list:
    """Pop every mode of this thread's stack; bottom first."""
    return [_pop() for _ in range(_stack_len())][::-1]
