"""Which of a model's modules run under ``torch.compile``, and the one kind of module hook
Dynamo never traces (docs/hazards.md, "`torch.compile`").

A module's hooks run under Dynamo in two ways (torch 2.x, ``torch/nn/modules/module.py``,
``torch/_dynamo/eval_frame.py``):

- the module is the entry of a compiled region: ``torch.compile(m)`` returns an
  ``OptimizedModule`` whose ``forward`` calls ``m.__call__`` with Dynamo's frame callback
  set, and ``m.compile()`` (in place, torch >= 2.2) keeps ``torch.compile(m._call_impl)`` as
  ``m._compiled_call_impl``. ``Module._call_impl`` itself is skipped, so each Python hook
  of ``m`` becomes a frame Dynamo compiles on its own (``counters["frames"]["total"]``),
  and two hooks sharing one code object recompile it;
- the module is called inside a compiled region (any sub-module of such an entry): its
  ``_call_impl`` and hooks are inlined into the region's graph.

The probes never hook a module of the second kind (:func:`compiled_modules`: a hook
there is traced, and a hook Dynamo may not trace is a graph break), and every hook they
put on the watched model itself is an :class:`EntryHook`: ``torch.compiler.disable``
around it, so when the model is such an entry its hooks run eagerly, outside Dynamo,
before the compiled frame is traced — in time to take the other hooks off. Dynamo keeps
no guard on a module's hooks (``torch._dynamo.config.skip_nnmodule_hook_guards``, True by
default), so taking them off or putting them on recompiles nothing.

Cost of an :class:`EntryHook` call on an eager step: the ``torch.compiler.disable``
wrapper, 0.3–0.5 µs per call on a 2-core CPU (one call per forward of the model on an
unarmed step; ``benchmarks/bench_monitor_compile.py`` prints it).
"""

from __future__ import annotations

import functools
import os
from operator import methodcaller

import torch

from optcheck.pytorch.dynamo_safe import HOOK_RUNNER  # the hook runner, shared with the optimizer step hooks

#: the attribute ``Module.compile()`` sets (``torch/nn/modules/module.py``; None until then)
_IN_PLACE = "_compiled_call_impl"
_GET_IN_PLACE = methodcaller("get", _IN_PLACE)
#: the file of Dynamo's wrappers (``_TorchDynamoContext.__call__``'s ``_fn``: a compiled call, and the
#: ``torch.compiler.disable`` wrapper), and of ``Module._call_impl`` / ``_wrapped_call_impl``
_EVAL_FRAME = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "_dynamo", "eval_frame.py")
_MODULE = os.path.abspath(torch.nn.Module.__call__.__code__.co_filename)


def compiled_in_place(module: torch.nn.Module) -> bool:
    """``module.compile()`` was called: its calls run through Dynamo (torch >= 2.2)."""
    return module.__dict__.get(_IN_PLACE) is not None


def is_compile_wrapper(module: object) -> bool:
    """``module`` is what ``torch.compile(m)`` returned (an ``OptimizedModule``)."""
    return type(module).__name__ == "OptimizedModule"


def compiled_modules(root: torch.nn.Module, root_compiled: bool = False) -> set[int]:
    """The ids of ``root``'s modules (``root`` included) whose hooks would run under Dynamo:
    a module compiled in place and everything below it, everything below an
    ``OptimizedModule`` (the wrapper's own hooks run eagerly), and, with
    ``root_compiled`` (the model is the ``_orig_mod`` of an ``OptimizedModule``), all of them.
    One walk over ``root.children()``; a module reached twice is looked at once."""
    out: set[int] = set()
    seen: set[int] = set()
    todo = [(root, root_compiled)]
    while todo:
        m, inside = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        inside = inside or compiled_in_place(m)
        if inside:
            out.add(id(m))
        below = inside or is_compile_wrapper(m)
        todo.extend((c, below) for c in m.children())
    return out


def any_compiled_in_place(module_dicts) -> bool:
    """Whether one of the modules whose ``__dict__`` are ``module_dicts`` was compiled in place
    (a C-level map: about 30 ns a module)."""
    return any(map(_GET_IN_PLACE, module_dicts))


def called_from_compiled(frame) -> bool:
    """Whether the module call an :class:`EntryHook` runs in (``frame``: the hook's own frame)
    is a compiled region's entry: above ``Module._call_impl`` / ``_wrapped_call_impl``, the frame
    of a Dynamo wrapper (``OptimizedModule.forward``, ``Module.compile``'s
    ``_compiled_call_impl``). Reads at most a dozen frames' file names; False when the frames
    are laid out otherwise (another torch)."""
    f, n = frame, 0
    while f is not None and f.f_code.co_filename != _MODULE and n < 6:  # up to Module._call_impl
        f, n = f.f_back, n + 1
    while f is not None and n < 12:
        name = f.f_code.co_filename
        if name == _EVAL_FRAME:
            return True
        if name != _MODULE:
            return False
        f, n = f.f_back, n + 1
    return False

class EntryHook(functools.partial):
    """A module hook for the watched model itself, whose call may be a compiled region's entry.

    Called eagerly (or as the entry of a compiled region: ``torch.compile(model)``,
    ``model.compile()``), it runs ``owner.name`` with Dynamo's frame callback off
    (``torch.compiler.disable``), so Dynamo compiles no frame of optcheck's. Inlined into a
    graph (the model called from a compiled function, or a ``torch.nn`` container compiled
    whole), Dynamo traces :func:`optcheck.pytorch.dynamo_safe._no_hook` in its place (``torch.compiler.substitute_in_graph``):
    no graph break, no guard, and the hook does not run. The call goes through
    ``functools.partial``'s C-level ``__call__`` (no Python frame of optcheck's for the frame
    callback). ``torch.save(model)``, ``pickle`` and ``copy.deepcopy(model)`` leave it out
    (``unsaved.py``); where a module's own ``__getstate__`` bypasses that, it pickles as
    ``getattr(owner, name)`` (the probes unpickle as no-ops) and a deep copy keeps it (the owner
    ignores modules it was not built for)."""

    def __new__(cls, owner: object, name: str):
        self = super().__new__(cls, HOOK_RUNNER, getattr(owner, name))
        self.owner, self.name = owner, name
        return self

    def __reduce__(self):
        return getattr, (self.owner, self.name)

    def __deepcopy__(self, memo):
        return self
