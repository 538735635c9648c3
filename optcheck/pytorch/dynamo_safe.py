"""Keeping optcheck's hooks out of ``torch.compile`` in every form users compile (issue 45):
``torch.compile(model)``, a compiled function calling the model, a compiled
``optimizer.step`` (``opt.step = torch.compile(opt.step)``) and a compiled whole train step
(forward, ``backward()``, ``clip_grad_norm_``, ``step()``, ``zero_grad()`` in one function).

Dynamo inlines every Python hook it meets while it traces a frame (module hooks, the
optimizer's step hooks run by ``Optimizer.profile_hook_step``, functions patched onto
``torch``): traced, optcheck's code would add guards, recompiles and graph breaks, and its
checks would run at trace time on fake tensors. Three kinds of wrapper keep it out:

- :class:`EagerHook` (the optimizer step hooks, ``optcheck/pytorch/step_hooks.py``; the module
  hooks are :class:`optcheck.pytorch.hazards.compiled.EntryHook`, the same thing for a module):
  called eagerly it runs the hook with Dynamo's frame callback off
  (``torch.compiler.disable``); inlined into a graph, Dynamo traces an empty function in its
  place (``torch.compiler.substitute_in_graph``): no graph break, no guard, and the hook does
  not run. What it would have done is done at the next eager point instead
  (:class:`HiddenSteps`);
- :func:`eager_call` (``torch.Tensor.backward`` and ``torch.autograd.backward`` while a Monitor
  is open): the whole call runs eagerly. Dynamo breaks the graph at ``backward()`` without
  optcheck too (it cannot trace it without compiled autograd), so this adds no break;
- :func:`traced_as` (``clip_grad_norm_``): eagerly optcheck's wrapper, traced as torch's own.

Autograd runs the saved-tensor hooks from C++ at the compiled graph's run time (AOTAutograd's
``CompiledFunction`` saves the graph's intermediates): :func:`saved_by_compiled_graph` tells the
in-place probe (``hazards/inplace.py``) that such a tensor is none of its business; versions
inside a compiled region are not evidence of a write (the graph's own functionalized copies
bump them).
"""

from __future__ import annotations

import functools
import os
import sys

import torch


_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
#: AOTAutograd's runtime (``CompiledFunction.forward`` saves the graph's tensors for backward)
_AOT_RUNTIME = os.path.join(_TORCH, "_functorch", "_aot_autograd") + os.sep
#: files of the wrappers between a step hook and the frame that called it (``profile_hook_step``)
_WRAPPER_FILES = frozenset({os.path.join(_TORCH, "_dynamo", "eval_frame.py"),
                            os.path.join(_TORCH, "_dynamo", "decorators.py"),
                            os.path.abspath(__file__)})


def _call_hook(hook, *args, **kwargs):
    return hook(*args, **kwargs)


def _no_hook(hook, *args, **kwargs):
    """What Dynamo traces in place of a hook it inlines: nothing."""
    return None


def _call_hook_unless_compiling(hook, *args, **kwargs):
    """(torch without ``torch.compiler.substitute_in_graph``: a no-op when traced, as before)"""
    if torch.compiler.is_compiling():
        return None
    return hook(*args, **kwargs)


#: ``HOOK_RUNNER(hook, *args)``: runs ``hook`` outside Dynamo when called as a frame, traced as
#: :func:`_no_hook` when inlined (what :class:`EagerHook` and ``hazards.compiled.EntryHook`` call)
if hasattr(torch.compiler, "substitute_in_graph"):  # torch >= 2.5
    #: run outside Dynamo when called as a frame; traced as :func:`_no_hook` when inlined
    HOOK_RUNNER = torch.compiler.substitute_in_graph(torch.compiler.disable(_call_hook),
                                                skip_signature_check=True)(_no_hook)
else:  # pragma: no cover - torch < 2.5: traced as a no-op both ways (one frame per hook under compile)
    HOOK_RUNNER = _call_hook_unless_compiling



def _call_unpack(hook, packed):
    return hook(packed)


def _unpacked(hook, packed):
    """What Dynamo traces in place of optcheck's saved-tensor unpack hook (compiled autograd
    traces ``backward()``): the saved tensor, unchecked (``packed[0]``, hazards/inplace.py)."""
    return packed[0]


if hasattr(torch.compiler, "substitute_in_graph"):  # torch >= 2.5
    #: ``UNPACK_RUNNER(hook, packed)``: ``hook(packed)`` outside Dynamo, traced as :func:`_unpacked`
    UNPACK_RUNNER = torch.compiler.substitute_in_graph(torch.compiler.disable(_call_unpack),
                                                       skip_signature_check=True)(_unpacked)
else:  # pragma: no cover - torch < 2.5
    UNPACK_RUNNER = torch.compiler.disable(_call_unpack)


def compiled_autograd_on() -> bool:
    """Whether compiled autograd is on (``torch._dynamo.config.compiled_autograd``: Dynamo then
    traces ``backward()`` and every tensor hook it runs); False while Dynamo is not imported."""
    config = sys.modules.get("torch._dynamo.config")
    return bool(getattr(config, "compiled_autograd", False))


#: what a compiled region hides from the Monitor (summary ``not_checked``), by form
HIDDEN_STEP_NOTE = (
    "optimizer.step() ran inside a torch.compile'd region (a compiled step or train step): its step hooks "
    "cannot run inside the graph, so the step is counted and snapshotted at the next eager point (the next "
    "backward() or close()); the pre-step gradient checks (OC501 gradients, OC207) run after backward() "
    "from the second such step on, and the clip_grad_norm_ total is not read inside the graph")
COMPILED_FORWARD_NOTE = (
    "OC301 in-place writes inside a torch.compile'd region are not checked: the graph's saved tensors and "
    "version counters are the compiler's (functionalized copies bump them), not evidence of a write; "
    "PyTorch's own check applies to the eager part")


def caller_outside(frame):
    """The first frame from ``frame`` outwards that is not one of the wrappers an
    :class:`EagerHook` adds (Dynamo's ``disable`` and ``substitute_in_graph`` wrappers, the hook
    caller): for a step hook, torch's ``profile_hook_step`` frame."""
    f = frame
    while f is not None and f.f_code.co_filename in _WRAPPER_FILES:
        f = f.f_back
    return f


class EagerHook(functools.partial):
    """A hook ``fn(*args)`` run eagerly outside Dynamo, traced as nothing (module docstring).

    ``copy.deepcopy`` keeps it (one hook object per optimizer); it unpickles as a hook that does nothing."""

    def __new__(cls, fn):
        self = super().__new__(cls, HOOK_RUNNER, fn)
        self.fn = fn
        return self

    def __reduce__(self):
        return _inert_hook, ()

    def __deepcopy__(self, memo):
        return self


def _inert(*args, **kwargs):
    """What an :class:`EagerHook` unpickles as: a hook that does nothing."""
    return None


def _inert_hook():
    """(the unpickler's call: returns :func:`_inert`)"""
    return _inert


def eager_call(fn):
    """``fn`` run with Dynamo's frame callback off: a call from a compiled frame is a graph
    break and runs eagerly (``torch.compiler.disable``)."""
    return torch.compiler.disable(fn)


_TRACED_AS: dict[int, object] = {}


def traced_as(wrapper, original):
    """``wrapper`` eagerly; ``original`` where Dynamo inlines the call (one registration per
    ``wrapper``: Dynamo's polyfill registry keeps it for the process)."""
    if not hasattr(torch.compiler, "substitute_in_graph"):  # pragma: no cover - torch < 2.5
        return wrapper
    key = id(wrapper)
    if key not in _TRACED_AS:
        outside = torch.compiler.disable(wrapper)

        def traced(*args, **kwargs):
            return original(*args, **kwargs)

        fn = torch.compiler.substitute_in_graph(outside, skip_signature_check=True)(traced)
        fn.__name__, fn.__qualname__, fn.__doc__ = wrapper.__name__, wrapper.__qualname__, wrapper.__doc__
        fn.__wrapped__ = getattr(wrapper, "__wrapped__", original)
        _TRACED_AS[key] = fn
    return _TRACED_AS[key]


_AOT_CODES: dict = {}


def saved_by_compiled_graph(frame) -> bool:
    """Whether a saved-tensor pack hook called with ``frame`` as its Python caller runs for a
    compiled graph: autograd packs an ``autograd.Function``'s saved tensors when its C++
    ``apply`` returns, so the caller is ``Function.apply``, itself called by AOTAutograd's
    runtime (``CompiledFunction.apply``). Two frames looked at; another Function's saves are not."""
    if frame.f_code is not _APPLY:  # (or one wrapper between: the probes' ``unmoded``, hazards/writes.py)
        frame = frame.f_back
        if frame is None or frame.f_code is not _APPLY:
            return False
    caller = frame.f_back
    if caller is None:
        return False
    code = caller.f_code
    hit = _AOT_CODES.get(code)
    if hit is None:
        hit = _AOT_CODES[code] = code.co_filename.startswith(_AOT_RUNTIME)
    return hit


#: the code of ``torch.autograd.Function.apply`` (``torch/autograd/function.py``)
_APPLY = torch.autograd.Function.apply.__func__.__code__


_EVAL_FRAME = os.path.join(_TORCH, "_dynamo", "eval_frame.py")


def _in_compiled_call(frame, depth: int = 32) -> bool:
    """A frame of a compiled function's wrapper (``eval_frame.py``, its context not a
    ``DisableContext``) within ``depth`` frames above ``frame``: the code runs inside a compiled
    function's call, eagerly (past a graph break). ``torch.compiler.disable`` wrappers (optcheck's
    own backward, an optimizer's or library's disabled ``step``, as LBFGS's closure runs under) are
    no compiled call."""
    f, n = frame, 0
    while f is not None and n < depth:
        if f.f_code.co_filename == _EVAL_FRAME and \
                type(f.f_locals.get("self")).__name__ != "DisableContext":
            return True
        f, n = f.f_back, n + 1
    return False


def _compiled_step(optimizer) -> bool:
    """``optimizer.step`` is a ``torch.compile`` of it (``opt.step = torch.compile(opt.step)``)."""
    step = getattr(optimizer, "__dict__", {}).get("step")
    return step is not None and hasattr(step, "_torchdynamo_orig_callable")


class HiddenSteps:
    """The watched optimizer's steps taken where its step hooks cannot run: inside a
    compiled region (a compiled ``optimizer.step``, a compiled train step), where Dynamo
    traces them as nothing (:class:`EagerHook`).

    After each backward pass (:meth:`after_backward`) the version counters of two of the
    optimizer's parameters (its first and last) are kept; at the next eager point
    (:meth:`stepped`: the next ``backward()``, ``close()``) a step ran hidden when the pre-step
    hooks did not run since (:meth:`hook_ran`) and either a post hook ran alone (``unpaired()``:
    Dynamo breaks the graph inside ``Optimizer.step``'s wrapper and may run the post hooks
    eagerly past it) or those versions moved (a step writes its parameters in place; the
    compiled graph copies its results back into them) while a compiled step was in play (``optimizer.step`` compiled, or the backward pass ran inside a compiled
    function's call). A loop that updates its parameters by hand without ``step()`` is no
    hidden step (OC206 still finds it). Once one is seen (:attr:`known`), the pre-step hooks
    run as stand-ins right after each backward pass, before the compiled step.

    Cost per backward pass: two version reads and ``unpaired()``; a stack walk of at most 32 frames only when
    the versions moved without a step hook."""

    def __init__(self, optimizer, unpaired=None):
        self.optimizer = optimizer
        self._unpaired = unpaired or (lambda: 0)  # post hooks run without their pre hook so far
        self.known = False  # a hidden step was seen: the pre-step stand-ins run after backward
        self.count = 0  # hidden steps seen
        self._mark: int | None = None  # the two versions after the last backward (None: nothing awaited)
        self._inside = False  # that backward ran inside a compiled function's call

    def _versions(self) -> int:
        groups = getattr(self.optimizer, "param_groups", None) or []
        params = [p for g in groups for p in g.get("params", ())[:1] + g.get("params", ())[-1:]]
        return sum(getattr(p, "_version", 0) for p in params)

    def after_backward(self, frame) -> bool:
        """A backward pass returned (``frame``: the caller's frame): await the step. True when
        the pre-step stand-ins should run now (hidden steps were seen before)."""
        self._mark = (self._versions(), self._unpaired())
        self._inside = not self.known and _in_compiled_call(frame)
        return self.known

    def hook_ran(self) -> None:
        """The step hooks ran (an eager ``step()``): nothing hidden."""
        self._mark = None

    def stepped(self) -> bool:
        """At an eager point after a backward pass: whether a step ran hidden since."""
        if self._mark is None:
            return False
        (versions, unpaired), self._mark = self._mark, None
        if self._unpaired() == unpaired:  # (else: a post hook ran alone, its pre hook traced: a compiled step)
            if self._versions() == versions:
                return False
            if not (self.known or self._inside or _compiled_step(self.optimizer)):
                return False
        self.known = True
        self.count += 1
        return True
