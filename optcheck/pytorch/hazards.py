"""Autograd hazard probes: catch, at the step and the line where they happen, the
bugs that PyTorch reports late (at ``backward()``) or never.

:class:`HazardProbes` works on any ``nn.Module`` + optimizer. It implements the
hook interface of :class:`optcheck.pytorch.train.NullHazards`:

- ``step_context(step)``: a context manager around forward *and* backward of one
  step (saved-tensor hooks + per-module flags are live inside it only, so
  ``torch.no_grad()`` evaluation passes between steps are not looked at);
- ``check_loss(loss, step)``: before ``loss.backward()``;
- ``after_backward(step)``: after ``backward()``, before ``optimizer.step()``;
- ``has_events()`` / ``drain()``: events (schema-1 Event dicts
  ``{kind, step, where, count, detail}``) recorded since the last drain;
- ``remove()``: unhook everything.

What is recorded (event ``kind`` → rule):

``inplace_on_saved`` (OC301)
    Every tensor autograd saves for backward is recorded by a
    ``torch.autograd.graph.saved_tensors_hooks`` pack hook with its version counter
    (``Tensor._version``), the module that was running and the user source line of
    the op; the unpack hook compares the version. Installing these hooks switches
    off PyTorch's own version check (docs/hazards.md; ``torch/csrc/autograd/saved_variable.cpp``
    skips ``version_counter`` checks when hooks are set), so a mutated saved tensor
    would otherwise flow into backward silently. The *write* is found where it
    happens: the versions of the saved tensors are compared at every module
    forward pre- and post-hook (a C-level ``sum(map(...))``, ~35 ns per saved
    tensor), which brackets the write between two module boundaries; the module
    whose own code ran in that window, its frame and the nearest in-place-looking
    line of its source name it. By default the step stops there with
    :class:`optcheck.worker_loop.StepStopped` (the forward is aborted; no wrong
    gradient is ever computed). With ``allow_inplace=True`` the event is recorded
    and the run continues: backward then uses the *written* values (what PyTorch
    would have refused with "one of the variables needed for gradient computation
    has been modified by an inplace operation"). The finding and the exception share one
    sentence (``optcheck.rules.autograd.describe_inplace``). Inside a non-reentrant
    checkpoint's recompute, ``torch.utils.checkpoint``'s own saved-tensor hooks are
    innermost: the probes compose theirs with it (docs/hazards.md).

``graph_cut`` (OC203)
    Full cut: ``check_loss`` sees a loss without ``grad_fn``; it raises
    ``StepStopped`` (instead of backward's "element 0 of tensors does not require
    grad and does not have a grad_fn"), naming the first module whose floating
    output lost ``grad_fn`` although its inputs or parameters require grad, and
    whether autograd was recording. Partial cut: a module's output lost
    ``grad_fn`` (or a module received a detached alias — same data pointer — of an
    earlier module's output in the same call of the model) and, after
    backward, optimizer parameters at or before it got no gradient: recorded, the
    step goes on. Leaf loss: the loss is a new leaf that requires grad
    (``torch.tensor(loss.item(), requires_grad=True)``, written to make the
    error above go away): ``backward()`` runs and no parameter gets a gradient;
    recorded, the step goes on. Cut records are kept per forward pass and judged only
    when that pass's output reaches a backward (its graph, or an op that saved it) or
    the loss: a validation, generation, EMA or teacher forward is not a cut.

Modules assigned after the probes start are hooked and every name follows the
model's current structure (a module-registration hook and a children count mark it
stale; ``named_modules()`` is re-scanned then). Under ``torch.compile`` the module
hooks do nothing inside the compiled forward (no graph break); see
:data:`NOT_CHECKED_UNDER_COMPILE`.

``nonleaf_grad_access`` (OC201)
    PyTorch warns "The .grad attribute of a Tensor that is not a leaf Tensor is
    being accessed" (``torch/_tensor.py`` / ``python_variable.cpp``) on every read;
    a ``warnings.showwarning`` wrapper with an ``always`` filter for that message
    counts the reads per source line (and keeps them off stderr).

``nonfinite`` (OC501)
    NaN/Inf in the loss (every step), the gradients (every ``grad_check_every``
    steps, one fused ``torch._foreach_norm``), parameters and optimizer state (at
    each ``drain``, i.e. each snapshot).

OC202 (grad-starved) needs no event: the snapshot's params carry ``grad``.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
import warnings
import weakref
from operator import attrgetter
from typing import Any, Iterable

import torch

from optcheck.rules.autograd import describe_inplace
from optcheck.worker_loop import StepStopped

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_THIS = __file__
_VERSION = attrgetter("_version")
NONLEAF_WARNING = "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed"
_NONLEAF_RE = r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed"
# an in-place looking statement: x.add_(…), x += …, x[…] = …, out=…, inplace=True
_AUGMENTED = re.compile(r"(\+|-|\*|/|//|%|@|\*\*|&|\||\^|<<|>>)=")
_SETITEM = re.compile(r"\]\s*=[^=]")
_METHOD_ = re.compile(r"\.[A-Za-z]\w*_\(")
_CUTTING = re.compile(r"\.detach\(|\.data\b|no_grad|inference_mode|\.numpy\(|\.item\(|\.tolist\(")
#: what the probes cannot see inside a ``torch.compile``d forward (module hooks are traced as no-ops
#: there, so the compiled graph has no break and no guard on optcheck's state); see docs/hazards.md
NOT_CHECKED_UNDER_COMPILE = (
    "OC203 partial graph cuts inside the compiled forward (a .detach() or no_grad in a module) are not "
    "named; OC202 still reports the parameters left without gradients",
    "OC301 write sites inside the compiled forward: an in-place write to a saved tensor there makes "
    "compilation fail with PyTorch's own 'modified by an inplace operation' error instead",
    "OC203 full cut (a loss without grad_fn) is still found, without the module that lost grad_fn",
)
MAX_EVAL_PASSES = 4  # cut records kept for this many finished passes whose output needs no grad
MAX_SAMPLES = 8  # per-event lists (parameter names, modules) are cut to this many in "detail"


def _where(code, lineno) -> str | None:
    if code is None:
        return None
    return f"{os.path.basename(code.co_filename)}:{lineno}"


def _internal(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR) or filename == _THIS


def _user_frame(f):
    """First frame outside torch and this module, walking outwards from ``f``."""
    while f is not None and _internal(f.f_code.co_filename):
        f = f.f_back
    return f


def _inplace_candidates(filename: str, first: int, last: int) -> list[tuple[int, str]]:
    """Lines in ``[first, last]`` of ``filename`` that look like in-place writes
    (``x.op_(…)``, ``x op= …``, ``x[…] = …``, ``inplace=True``, ``out=``)."""
    out = []
    for n in range(max(1, first), last + 1):
        text = linecache.getline(filename, n).strip()
        if not text or text.startswith("#"):
            continue
        code = text.split("#", 1)[0]
        if (_METHOD_.search(code) and not re.search(r"\.(requires_grad|retain_grad|register\w*)_\(", code)) \
                or _AUGMENTED.search(code) or _SETITEM.search(code) \
                or re.search(r"\binplace\s*=\s*True|\bout\s*=", code):
            out.append((n, text))
    return out


_TARGET_METHOD = re.compile(r"(\w+)(?:\[[^\]]*\])*\.[A-Za-z]\w*_\(")
_TARGET_ASSIGN = re.compile(r"(\w+)(?:\[[^\]]*\])*\s*(?:\+|-|\*|/|//|%|@|\*\*|&|\||\^|<<|>>)?=[^=]")


def _targets(text: str) -> set[str]:
    """Names written in place by a source line (``a.add_(``, ``a += ``, ``a[i] = ``)."""
    names = set(_TARGET_METHOD.findall(text))
    if _AUGMENTED.search(text) or _SETITEM.search(text):
        names |= set(_TARGET_ASSIGN.findall(text))
    return names


def _aliases(frame, t: torch.Tensor) -> set[str]:
    """Local names of ``frame`` bound to tensors sharing ``t``'s storage (rare path)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001
        return set()
    out = set()
    for name, val in frame.f_locals.items():
        if isinstance(val, torch.Tensor):
            try:
                if val.untyped_storage().data_ptr() == ptr:
                    out.add(name)
            except Exception:  # noqa: BLE001
                pass
        elif isinstance(val, (tuple, list)) and len(val) < 16:
            for v in val:
                if isinstance(v, torch.Tensor) and _ptr(v) and v.untyped_storage().data_ptr() == ptr:
                    out.add(name)
    return out


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


def _code_of(module: torch.nn.Module):
    fwd = module.forward
    fn = getattr(fwd, "__func__", fwd)
    return getattr(fn, "__code__", None)


def _function_span(code) -> tuple[int, int]:
    """(first line, last line) of a code object (last = highest line number in it)."""
    lines = [ln for _, _, ln in code.co_lines() if ln is not None] if hasattr(code, "co_lines") else []
    return code.co_firstlineno, max(lines) if lines else code.co_firstlineno


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


def _pytorch_inplace_message(t: torch.Tensor, saved_version: int) -> str:
    """The text PyTorch's version check raises for ``t`` (``saved_variable.cpp``)."""
    try:
        tname = t.type()
    except Exception:  # noqa: BLE001 - meta / exotic tensors
        tname = f"torch.{t.dtype}"
    shape = ", ".join(str(s) for s in t.shape)
    which = ""
    if t.grad_fn is not None:
        which = f", which is output {t.output_nr} of {type(t.grad_fn).__name__},"
    return (f"one of the variables needed for gradient computation has been modified by an inplace operation: "
            f"[{tname} [{shape}]]{which} is at version {t._version}; expected version {saved_version} instead.")


class HazardProbes:
    """Autograd hazard probes for one model and optimizer (see module docstring).

    Args:
        model: any ``nn.Module``; forward pre/post hooks go on every sub-module.
        optimizer: its param groups define "the parameters that should get gradients".
        allow_inplace: record an in-place write to a saved tensor and continue
            (backward uses the written values) instead of raising ``StepStopped``.
        grad_check_every: check gradients for NaN/Inf every this many steps
            (1 = every step; 0 = only at drain time via the optimizer state).
        compiled: the model is run through ``torch.compile`` (``model`` is the module it
            wraps): :attr:`not_checked` then lists what the probes cannot see.

    Raises (from the hooks):
        optcheck.worker_loop.StepStopped: an in-place write to a saved tensor
            (unless ``allow_inplace``), or a loss without ``grad_fn``; ``.event``
            is the schema-1 event (it is *not* also returned by :meth:`drain`).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, allow_inplace: bool = False,
                 grad_check_every: int = 1, compiled: bool = False):
        self.model, self.optimizer = model, optimizer
        self.compiled = compiled
        self.allow_inplace = allow_inplace
        self.grad_check_every = grad_check_every
        self._step = 0
        self._active = False
        self._events: dict[tuple, dict] = {}
        self._seen_keys: set[tuple] = set()
        self._urgent = False
        self._handles = []
        self._removed = False
        self.on_stop = None  # optional callback f(StepStopped) called before the raise
        self._names: dict[int, str] = {}
        self._hooked: dict[int, tuple] = {}  # id(module) -> (weakref to it, its two hook handles)
        self._param_names: dict[int, str] = {}
        self._pushed: list[tuple] = []  # (module,) whose call pushed composed checkpoint-recompute hooks
        self.rescans = 0
        self._scan()
        # a sub-module assigned later (``ff[1] = Gate()``, ``m.blocks = Wrapper(m.blocks)``) marks the
        # names stale; the next hooked forward re-scans (torch/nn/modules/module.py: register_module runs
        # the global module-registration hooks on every sub-module assignment)
        self._dirty = False
        self._handles.append(torch.nn.modules.module.register_module_module_registration_hook(self._registered))
        self._handles.append(optimizer.register_step_post_hook(self._after_step))
        self._internal_code: dict[Any, bool] = {}
        self._install_warning_hook()
        self._reset_step()

    @property
    def not_checked(self) -> list[str]:
        """What these probes do not check on this model (empty for an eager model)."""
        return list(NOT_CHECKED_UNDER_COMPILE) if self.compiled else []

    # -- following the model as it changes (issue: modules added after the start) --
    def _scan(self) -> None:
        """(Re)build module and parameter names from the model as it is now, hook
        modules not hooked yet and unhook those no longer in it. Cost: one
        ``named_modules()`` walk (see ``benchmarks/``), run only after a sub-module
        assignment."""
        root = type(self.model).__name__
        names: dict[int, str] = {}
        self._nchild: dict[int, int] = {}
        for name, m in self.model.named_modules():
            names.setdefault(id(m), _clean(name) or root)
            self._nchild[id(m)] = len(m._modules)
            have = self._hooked.get(id(m))
            if have is None or have[0]() is not m:
                self._hooked[id(m)] = (weakref.ref(m), (m.register_forward_pre_hook(self._pre),
                                                        m.register_forward_hook(self._post, always_call=True)))
        for key in [k for k in self._hooked if k not in names]:
            for h in self._hooked.pop(key)[1]:
                h.remove()
        self._names = names
        self._param_names = {}
        for name, p in self.model.named_parameters():
            self._param_names.setdefault(id(p), _clean(name))
        self._dirty = False
        self.rescans += 1

    def _registered(self, module, name, submodule):
        """Global module-registration hook: a sub-module was assigned to a watched module
        (or a watched module was put into a new one)."""
        if id(module) in self._names or (submodule is not None and id(submodule) in self._names):
            self._dirty = True
        return None

    # -- per-step state -------------------------------------------------------
    def _reset_step(self) -> None:
        self._calls: list[str] = []  # module name per forward call, in call order
        self._pass = -1  # call index of the outermost module call running now (a forward pass)
        self._forget_cuts()
        self._in_backward = False
        self._reported: set[int] = set()  # ids of saved tensors already reported this step
        self._release()

    def _forget_cuts(self) -> None:
        """Drop the cut records (after a backward judged them, or at a new step)."""
        self._cut: list[dict] = []  # modules whose floating outputs lost grad_fn, since the last backward
        self._cut_passes: dict[int, int] = {}  # pass (call index) -> number of its cut records
        self._pass_out: dict[int, tuple] = {}  # finished pass with cut records -> (output requires grad, grad_fns)
        self._judged: set[int] = set()  # passes whose output reached a backwarded loss through its graph
        self._fed: set[int] = set()  # no-grad passes whose output an op saved for backward
        self._eval_ptrs: dict[int, int] = {}  # storage address of a finished no-grad pass's output -> pass

    def _add_cut(self, rec: dict) -> None:
        """Keep a cut record of the current pass. Records of passes whose output did not
        require grad (evaluation, generation, a teacher forward) are kept for the last
        ``MAX_EVAL_PASSES`` such passes only: they matter only if the loss comes from one."""
        rec["pass"] = self._pass
        if self._pass not in self._cut_passes:
            done = [p for p in self._cut_passes if p in self._pass_out and not self._pass_out[p][0]]
            if len(done) >= MAX_EVAL_PASSES:
                drop = set(done[:len(done) - MAX_EVAL_PASSES + 1])
                self._cut = [c for c in self._cut if c["pass"] not in drop]
                for p in drop:
                    del self._cut_passes[p]
                    self._pass_out.pop(p, None)
                self._eval_ptrs = {k: p for k, p in self._eval_ptrs.items() if p not in drop}
        self._cut_passes[self._pass] = self._cut_passes.get(self._pass, 0) + 1
        self._cut.append(rec)

    def _release(self) -> None:
        """Drop the references to this step's saved tensors and outputs (kept:
        call names and cut records, small, for ``after_backward``)."""
        self._live: list[torch.Tensor] = []  # saved non-parameter tensors, deduplicated
        self._live_rec: list[tuple] = []  # their pack records, same order
        self._live_ids: set[int] = set()
        self._vsum = 0  # sum of their versions when saved (or when last accepted)
        self._stack: list[int] = []  # call indices of the modules running now
        self._cur = -1
        self._last = ("start", -1)  # last boundary: ("pre"|"post"|"loss"|"start", call index)
        self._roots: list = []  # grad_fns of module outputs (graph walk on detection only)
        self._grad_ptrs: dict[int, tuple] = {}  # data_ptr of outputs that require grad -> (call, tensor)
        self._introspecting = False
        self._entering = None
        self._cur_post, self._leaving = -1, None

    @contextlib.contextmanager
    def step_context(self, step: int):
        """Wrap forward and backward of training step ``step`` (1-based). After
        :meth:`remove` it does nothing (PyTorch's own version check applies again)."""
        if self._removed:
            yield self
            return
        self._step = step
        self._reset_step()
        self._active = True
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            self._active = False
            self._release()

    # -- saved tensors (OC301) ------------------------------------------------
    def _pack(self, t: torch.Tensor):
        f = sys._getframe(1)
        code = f.f_code
        internal = self._internal_code.get(code)
        if internal is None:
            internal = self._internal_code[code] = _internal(code.co_filename)
        if internal:
            f = _user_frame(f) or f
            code = f.f_code
        v = t._version
        rec = (t, v, self._cur, code, f.f_lineno)
        if self._eval_ptrs:  # the output of a no-grad pass, saved by an op: that pass feeds a graph
            p = self._eval_ptrs.get(_storage_ptr(t))
            if p is not None:
                self._fed.add(p)
        if not _parameter_like(t) and id(t) not in self._live_ids:
            self._live_ids.add(id(t))
            self._live.append(t)
            self._live_rec.append(rec)
            self._vsum += v
        return rec

    def _unpack(self, rec):
        t, v = rec[0], rec[1]
        if t._version != v and not self._introspecting:
            self._mutated(rec, detected_at="unpack in backward (the saved tensor was needed)")
        return t

    def _check_versions(self, detected_at: str) -> None:
        if self._live and sum(map(_VERSION, self._live)) != self._vsum:
            for rec in self._live_rec:
                if rec[0]._version != rec[1] and id(rec[0]) not in self._reported:
                    self._mutated(rec, detected_at=detected_at)
            self._vsum = sum(map(_VERSION, self._live))  # allow_inplace: accept the write, report it once

    def _mutated(self, rec, detected_at: str) -> None:
        t, v, call, code, line = rec
        if id(t) in self._reported:
            if self.allow_inplace:
                return
        self._reported.add(id(t))
        saved_where = _where(code, line)
        written = self._locate_write(rec, detected_at)
        op = self._saving_op(t)
        tensor = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                  "type": _safe(lambda: t.type()), "grad_fn": type(t.grad_fn).__name__ if t.grad_fn else None,
                  "requires_grad": t.requires_grad}
        detail = {
            "tensor": tensor, "saved_version": v, "version": t._version,
            "saved_by": {"op": op, "module": self._calls[call] if 0 <= call < len(self._calls) else None,
                         "where": saved_where, "code": _line_text(code, line)},
            "written": written,
            "phase": ("between forward and backward" if detected_at.startswith("unpack") else
                      "backward (recompute)" if self._in_backward else "forward"),
            "stopped": not self.allow_inplace,
            "pytorch_error": _pytorch_inplace_message(t, v),
        }
        if self._pushed:  # saved by a non-reentrant checkpoint's recompute: PyTorch checks no version there
            detail.update(checkpoint="non-reentrant", pytorch_error=None)
        if _parameter_like(t):  # checked at unpack only: an optimizer step or a weight load in between
            base = t._base if t._base is not None else t
            detail["parameter"] = self._param_names.get(id(base)) or f"a parameter {list(base.shape)}"
        event = {"kind": "inplace_on_saved", "step": self._step,
                 "where": written.get("where") or saved_where, "count": 1, "detail": detail}
        msg = f"step {self._step}: {describe_inplace(event)}"
        if self.allow_inplace:
            self._record(event, key=("inplace_on_saved", saved_where, written.get("where")))
            return
        self._stop(msg, event)

    def _stop(self, msg: str, event: dict) -> None:
        """Raise StepStopped, after telling ``on_stop`` (a Monitor records the finding
        there, before the exception unwinds the user's forward)."""
        exc = StepStopped(msg, event)
        if self.on_stop is not None:
            self.on_stop(exc)
        raise exc

    def _locate_write(self, rec, detected_at: str) -> dict:
        """Where the write happened: the module whose own code ran since the last
        boundary at which the versions still matched, the frame running it and the
        nearest in-place-looking line of that code (a candidate, from the source)."""
        kind, idx = self._last
        out: dict[str, Any] = {"detected_at": detected_at}
        since = {"pre": lambda: f"the start of {self._calls[idx]}'s forward",
                 "post": lambda: f"the return of {self._calls[idx]}",
                 "loss": lambda: "check_loss", "start": lambda: "the start of the step"}[kind]()
        if detected_at == "pre-hook":
            # the write ran in the caller of the module now entering (alive on the stack)
            parent = self._calls[self._stack[-1]] if self._stack else None
            out["module"] = parent or "(code outside the model)"
            out["between"] = f"{since} and the call of {self._entering}"
            frame = _user_frame(sys._getframe(1))
            if frame is not None:
                self._candidate(out, frame.f_code, _function_span(frame.f_code)[0], frame.f_lineno - 1,
                                pick_last=True, aliases=_aliases(frame, rec[0]))
                out["frame"] = _where(frame.f_code, frame.f_lineno)
        elif detected_at == "post-hook":
            # no boundary since `since`: the write ran in this module's own forward code
            name = self._calls[self._cur_post] if 0 <= self._cur_post < len(self._calls) else None
            out["module"] = name
            out["between"] = f"{since} and the return of {name}"
            code = _code_of(self._leaving) if self._leaving is not None else None
            internal = code is not None and _internal(code.co_filename)
            if internal:
                code = None  # torch's own module code (nn.Sequential, nn.ReLU, ...) has no user line
            if code is not None:
                first, last = _function_span(code)
                start = rec[4] if rec[3] is code else first
                if not self._candidate(out, code, start, last, pick_last=False):
                    self._candidate(out, code, first, last, pick_last=True)
                out["frame"] = _where(code, first)
            elif internal and self._last == ("pre", self._cur_post) and \
                    next(self._leaving.children(), None) is None:
                # a torch module without children wrote, inside its own call (nn.ReLU(inplace=True)):
                # the statement that called it
                frame = _user_frame(sys._getframe(1))
                if frame is not None:
                    out["where"], out["code"] = (_where(frame.f_code, frame.f_lineno),
                                                 _line_text(frame.f_code, frame.f_lineno))
            if not out.get("where") and rec[3] is not None and not _internal(rec[3].co_filename):
                # the user code that saved the tensor (a function, or a module without hooks): the
                # write usually follows the save in the same function
                caller = _user_frame(sys._getframe(1))
                last = caller.f_lineno if caller is not None and caller.f_code is rec[3] else \
                    _function_span(rec[3])[1]  # still running: not past the line running now
                self._candidate(out, rec[3], rec[4], last, pick_last=False)
        else:  # check_loss or unpack: after the last module boundary
            out["module"] = None
            out["between"] = f"{since} and {detected_at.split(' ')[0]}: code outside the model's modules"
            frame = _user_frame(sys._getframe(1))
            if frame is not None and detected_at.startswith("check_loss"):
                self._candidate(out, frame.f_code, _function_span(frame.f_code)[0], frame.f_lineno - 1,
                                pick_last=True, aliases=_aliases(frame, rec[0]))
                out["frame"] = _where(frame.f_code, frame.f_lineno)
        return out

    @staticmethod
    def _candidate(out: dict, code, first: int, last: int, pick_last: bool = True,
                   aliases: set[str] | None = None) -> bool:
        """Put the last (or first) in-place-looking line of ``code`` in [first, last] into
        ``out``; lines writing one of ``aliases`` (names of the mutated tensor) first."""
        cands = _inplace_candidates(code.co_filename, first, last)
        if not cands:
            return False
        if aliases:
            cands = [c for c in cands if _targets(c[1]) & aliases] or cands
        n, text = cands[-1] if pick_last else cands[0]
        out["where"], out["code"] = f"{os.path.basename(code.co_filename)}:{n}", text
        out["file"] = code.co_filename
        return True

    def _saving_op(self, t: torch.Tensor) -> str | None:
        """Name of the autograd node that saved ``t`` (a walk of the graph from the
        module outputs seen this step; rare path, on detection only)."""
        if self._pushed:
            # inside a non-reentrant checkpoint's recompute: reading a node's saved tensors
            # would run the unpack hooks of other checkpointed segments (recomputing them)
            return None
        key = (_ptr(t), tuple(t.shape), t.stride())

        def same(v) -> bool:  # unpacking re-wraps the tensor: compare address, shape, strides
            return isinstance(v, torch.Tensor) and (_ptr(v), tuple(v.shape), v.stride()) == key

        self._introspecting = True
        try:
            seen, todo = set(), [r for r in reversed(self._roots) if r is not None]
            while todo and len(seen) < 20000:
                node = todo.pop()
                if node in seen:
                    continue
                seen.add(node)
                for attr in dir(node):
                    if not attr.startswith("_saved_"):
                        continue
                    try:
                        val = getattr(node, attr)
                    except Exception:  # noqa: BLE001 - freed buffers, unsupported types
                        continue
                    vals = val if isinstance(val, (tuple, list)) else (val,)
                    if any(same(v) for v in vals):
                        return type(node).__name__
                for nxt, _ in getattr(node, "next_functions", ()):
                    if nxt is not None and nxt not in seen:
                        todo.append(nxt)
        finally:
            self._introspecting = False
        return None

    # -- module hooks ------------------------------------------------------------
    def _pre(self, module, args):
        if torch.compiler.is_compiling() or not self._active:
            # under torch.compile the hooks are traced: returning at once keeps them out of the graph
            # (no graph break, no guard on optcheck's state); see docs/hazards.md
            return None
        if self._dirty:
            self._scan()
        name = self._names.get(id(module))
        if name is None:  # a copy of a watched module (copy.deepcopy(model) copies its hooks)
            return None
        if len(module._modules) != self._nchild.get(id(module)):
            # children added or removed without a registration hook (Sequential.insert and
            # ModuleList.insert write ``_modules`` directly): re-scan before they run
            self._scan()
            name = self._names.get(id(module), name)
        top = _top_hooks(False)
        if top is not None and _is_recompute_pack(top[0]):
            self._compose(module, *top)
        if self._live and sum(map(_VERSION, self._live)) != self._vsum:
            self._entering = name
            self._roots.extend(a.grad_fn for a in _tensors(args) if a.grad_fn is not None)
            self._check_versions("pre-hook")
        idx = len(self._calls)
        self._calls.append(name)
        if not self._stack:
            self._pass = idx  # an outermost call: a new forward pass
        self._stack.append(idx)
        self._cur = idx
        self._last = ("pre", idx)
        if module is self.model:  # a new forward pass: its inputs are data, earlier outputs are another pass's
            self._grad_ptrs = {}
        elif self._grad_ptrs and args:
            a = args[0]
            if isinstance(a, torch.Tensor) and not a.requires_grad and a.is_floating_point() \
                    and torch.is_grad_enabled():
                src = self._grad_ptrs.get(_ptr(a))
                self._detached_input(idx, src[0] if src else None)
        return None

    def _detached_input(self, idx: int, src: int | None) -> None:
        """A module's first input is a float tensor without grad although autograd is
        recording and earlier outputs of this step required grad: the graph was cut
        before it. Confirmed (or dropped) in :meth:`after_backward`."""
        frame = _user_frame(sys._getframe(2))
        where = code = None
        if frame is not None:
            where, code = _where(frame.f_code, frame.f_lineno), _line_text(frame.f_code, frame.f_lineno)
            first, _ = _function_span(frame.f_code)
            for n in range(frame.f_lineno, max(first, frame.f_lineno - 200) - 1, -1):  # the cutting line
                text = linecache.getline(frame.f_code.co_filename, n).split("#", 1)[0]
                if _CUTTING.search(text):
                    where, code = f"{os.path.basename(frame.f_code.co_filename)}:{n}", text.strip()
                    break
        how = (f"its input shares memory with the output of {self._calls[src]}, which requires grad, but does "
               f"not require grad itself (a .detach() or .data between them)" if src is not None else
               "its input does not require grad although earlier outputs of this step did: the graph was cut "
               "before it (.detach(), .data, a NumPy round trip, or an op under torch.no_grad())")
        self._add_cut({"module": self._calls[idx], "call": idx, "how": "detached-input", "grad_enabled": True,
                          "source_module": self._calls[src] if src is not None else None,
                          "where": where, "code": code, "why": how})

    def _compose(self, module, pack, unpack) -> None:
        """Inside a non-reentrant checkpoint's recompute (in backward), torch.utils.checkpoint's
        own saved-tensor hooks shadow ours: push a pair that records each saved tensor for the
        version check and hands it on to theirs; popped when ``module`` returns or raises."""
        probes = self

        def cpack(t):
            inner = pack(t)  # may raise to stop the recompute early: nothing recorded then
            probes._pack(t)
            return inner

        cpack.optcheck = True
        torch._C._autograd._push_saved_tensors_default_hooks(cpack, unpack)
        self._pushed.append((module,))

    def _post(self, module, args, out):
        if torch.compiler.is_compiling():
            return None
        if self._pushed and self._pushed[-1][0] is module:
            self._pushed.pop()
            torch._C._autograd._pop_saved_tensors_default_hooks()
        if out is None and sys.exc_info()[0] is not None:  # the forward raised (an always_call hook)
            if self._active and id(module) in self._names and self._stack:
                self._stack.pop()
                self._cur = self._stack[-1] if self._stack else -1
            return None
        if not self._active or id(module) not in self._names:
            return None
        idx = self._stack.pop() if self._stack else -1
        if self._live and sum(map(_VERSION, self._live)) != self._vsum:
            self._cur_post, self._leaving = idx, module
            if isinstance(out, torch.Tensor) and out.grad_fn is not None:
                self._roots.append(out.grad_fn)
            self._check_versions("post-hook")
        self._cur = self._stack[-1] if self._stack else -1
        self._last = ("post", idx)
        has_float, rg = _float_outputs(out)
        if rg:
            if isinstance(out, torch.Tensor):
                self._roots.append(out.grad_fn)
                ptr = _ptr(out)
                if ptr:
                    self._grad_ptrs[ptr] = (idx, out)  # the reference keeps the address from being reused
            else:
                self._roots.extend(v.grad_fn for v in (out.values() if isinstance(out, dict) else out)
                                   if isinstance(v, torch.Tensor) and v.grad_fn is not None)
        elif has_float:
            self._maybe_cut(module, args, idx)
        if not self._stack and idx in self._cut_passes:  # a pass with cut records ends: keep what it gave
            outs = _float_tensors(out)
            self._pass_out[idx] = (rg, _grad_fns(out) if rg else [], outs)  # outs: their addresses stay theirs
            if not rg:
                self._eval_ptrs.update((ptr, idx) for ptr in map(_storage_ptr, outs) if ptr)
        return None

    def _maybe_cut(self, module, args, idx: int) -> None:
        inputs_rg = any(t.requires_grad for t in _tensors(args))
        own = [p for p in module.parameters() if p.requires_grad]
        if not inputs_rg and not own:
            return
        frame = _user_frame(sys._getframe(1))
        code = _code_of(module)
        self._add_cut({
            "module": self._calls[idx] if 0 <= idx < len(self._calls) else self._names.get(id(module)),
            "call": idx, "how": "output-lost-grad_fn", "grad_enabled": torch.is_grad_enabled(),
            "inputs_require_grad": inputs_rg, "params_require_grad": len(own),
            "where": _where(frame.f_code, frame.f_lineno) if frame else None,
            "code": _line_text(frame.f_code, frame.f_lineno) if frame else None,
            "forward": _where(code, code.co_firstlineno) if code is not None else None,
            "why": ("autograd was not recording (torch.is_grad_enabled() is False) when it ran"
                    if not torch.is_grad_enabled() else
                    "its forward detached the result or ran part of it under torch.no_grad()")})

    # -- loss and gradients -------------------------------------------------
    def check_loss(self, loss: torch.Tensor, step: int) -> None:
        """Before ``loss.backward()``: in-place writes since the last module
        boundary, a loss without ``grad_fn`` (raises ``StepStopped``; a leaf loss
        that requires grad is recorded instead: backward would run), a non-finite
        loss (recorded)."""
        self._step = step
        if self._active:
            self._check_versions("check_loss (after the model's forward, before backward)")
            self._last = ("loss", -1)
            self._in_backward = True
            roots = self._roots
            self._release()  # backward frees saved tensors as it goes: hold none of them from here on
            self._roots = roots
        if not isinstance(loss, torch.Tensor):
            return
        if loss.grad_fn is not None:
            self._roots.append(loss.grad_fn)
            if any(self._pass_out.get(p, (True,))[0] for p in self._cut_passes if p not in self._judged):
                self._judged |= self._passes_reaching(loss.grad_fn)
        elif not loss.requires_grad:
            self._stop(*self._full_cut(loss))
        elif loss.is_leaf and not any(loss is p for _, p in self._trainable()):
            _, event = self._full_cut(loss)
            event["detail"].update(pytorch_error=None, loss_is_leaf=True)
            self._record(event, key=("graph_cut", "leaf-loss"))
        if not bool(torch.isfinite(loss.detach()).all()):
            self._record({"kind": "nonfinite", "step": step, "where": None, "count": 1,
                          "detail": {"what": "loss", "value": float(loss.detach().float().reshape(-1)[0])}},
                         key=("nonfinite", "loss"))

    def _trainable(self) -> list[tuple[str, torch.Tensor]]:
        out = []
        for g in self.optimizer.param_groups:
            for p in g["params"]:
                if p.requires_grad:
                    out.append((self._param_names.get(id(p), f"<param {id(p)}>"), p))
        return out

    def _full_cut(self, loss: torch.Tensor) -> tuple[str, dict]:
        trainable = [n for n, _ in self._trainable()]
        first = self._first_cut()
        grad_on = torch.is_grad_enabled()
        if first is not None:
            where = first.get("where")
            what = f"the first module whose output lost grad_fn is {first['module']} ({where}): {first['why']}"
        else:
            where = _backward_caller()  # the line that called backward(): the loss is made just above it
            what = ("no module output lost grad_fn: the loss was computed from a detached tensor "
                    "(.detach(), .item(), .data, numpy) after the model's forward")
            if not self._calls and self.compiled:
                first = {"module": "the model's compiled forward", "call": -1, "how": "compiled",
                         "grad_enabled": None, "where": where, "code": None,
                         "why": ("torch.compile runs it without optcheck's module hooks, so the module is not "
                                 "known; it ran under torch.no_grad(), or the loss was computed from a "
                                 "detached output")}
                what = f"{first['module']} lost grad_fn: {first['why']}"
            if loss.requires_grad and loss.is_leaf:
                what = ("no module output lost grad_fn: the loss is a new leaf tensor that requires grad "
                        "(e.g. torch.tensor(loss.item(), requires_grad=True)), not connected to the model")
        detail = {"cut": "full", "loss_requires_grad": loss.requires_grad, "grad_enabled_at_loss": grad_on,
                  "first_module": first,
                  "modules_without_grad_fn": [c["module"] for c in self._judged_cuts(full=True)][:MAX_SAMPLES],
                  "n_params_without_grad": len(trainable), "params_without_grad": trainable[:MAX_SAMPLES],
                  "pytorch_error": "element 0 of tensors does not require grad and does not have a grad_fn"}
        event = {"kind": "graph_cut", "step": self._step, "where": where, "count": 1, "detail": detail}
        msg = f"step {self._step}: the loss has no grad_fn, backward() would raise; {what}"
        return msg, event

    def _passes_reaching(self, root) -> set[int]:
        """Passes with cut records whose output's ``grad_fn`` is reached from ``root`` (the
        loss's) through ``next_functions``; a pass still running counts as reaching it.
        Runs only when such records exist (a real cut, or an evaluation forward that kept
        grad on); cost: one walk of the loss's graph."""
        out = {p for p in self._cut_passes if p not in self._pass_out}
        want = {}
        for p, (rg, fns, _) in self._pass_out.items():
            for fn in fns if rg else ():
                want.setdefault(fn, set()).add(p)
        seen, todo = set(), [root]
        while todo and want and len(seen) < 200_000:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            hit = want.pop(node, None)
            if hit:
                out |= hit
            todo.extend(n for n, _ in getattr(node, "next_functions", ()))
        return out

    def _judged_cuts(self, full: bool, fed: bool = False) -> list[dict]:
        """The cut records that can explain a cut. A loss without ``grad_fn``: those of the
        last pass whose output did not require grad (the loss came from it). Otherwise: those
        of passes whose output reached a loss that was backwarded (through its graph, or saved
        by one of its ops, as a generator's no-grad output is by the discriminator), the last
        such pass first. A forward whose output never reaches a backward (validation,
        generation, an EMA or teacher forward) is evaluation, not a cut."""
        if full:
            done = [p for p in self._cut_passes if not self._pass_out.get(p, (False,))[0]]
            return [c for c in self._cut if c["pass"] == done[-1]] if done else []
        passes = sorted((p for p in self._cut_passes if p in self._judged or (fed and p in self._fed)), reverse=True)
        return [c for p in passes for c in self._cut if c["pass"] == p]

    def _first_cut(self, cuts: list[dict] | None = None) -> dict | None:
        cuts = self._judged_cuts(full=True) if cuts is None else cuts
        if not cuts:
            return None
        for c in cuts:  # a cut made while autograd was recording is the informative one
            if c["grad_enabled"] and (c.get("inputs_require_grad") or c["how"] == "detached-input"):
                return c
        return cuts[0]

    def after_backward(self, step: int) -> None:
        """After ``loss.backward()``: confirm partial graph cuts (optimizer
        parameters at or before a cut got no gradient) and check gradients."""
        self._in_backward = False
        trainable = self._trainable()
        cuts = self._judged_cuts(full=False) if self._cut else []
        if cuts:  # passes connected to this loss by its graph: judged now, then forgotten
            starved = [(n, p) for n, p in trainable if p.grad is None]
            if starved:
                self._partial_cut(starved, cuts)
            done = {c["pass"] for c in cuts}
            self._cut = [c for c in self._cut if c["pass"] not in done]
            for p in done:
                self._cut_passes.pop(p, None)
                self._pass_out.pop(p, None)
        if self.grad_check_every and step % self.grad_check_every == 0:
            grads = [_dense(p.grad) for _, p in trainable if p.grad is not None]
            if grads and not bool(torch.stack(torch._foreach_norm(grads)).isfinite().all()):
                bad = [n for n, p in trainable
                       if p.grad is not None and not bool(torch.isfinite(_dense(p.grad)).all())]
                self._record({"kind": "nonfinite", "step": step, "where": None, "count": 1,
                              "detail": {"what": "grad", "params": bad[:MAX_SAMPLES], "n_params": len(bad)}},
                             key=("nonfinite", "grad"))

    def _after_step(self, optimizer, args, kwargs) -> None:
        """Optimizer step post-hook: a no-grad forward whose output an op saved for backward
        (a generator run under ``no_grad`` whose output the discriminator's loss uses) is
        judged at the step of the watched optimizer, not at that backward (the discriminator's
        step legitimately leaves the generator without gradients): a partial cut when optimizer
        parameters at or before one of its cuts have no gradient when the optimizer steps."""
        if torch.compiler.is_compiling() or self._removed:
            return
        cuts = self._judged_cuts(full=False, fed=True) if self._cut else []
        self._forget_cuts()
        if cuts:
            starved = [(n, p) for n, p in self._trainable() if p.grad is None]
            if starved:
                self._partial_cut(starved, cuts)

    def _partial_cut(self, starved: list[tuple[str, torch.Tensor]], cuts: list[dict]) -> None:
        first_call = {}
        start = min(c["pass"] for c in cuts)  # the judged passes' calls only (not an earlier evaluation)
        for i in range(max(start, 0), len(self._calls)):
            first_call.setdefault(self._calls[i], i)

        def call_of(param_name: str) -> int | None:
            mod = param_name.rpartition(".")[0] or self._names[id(self.model)]
            while True:
                if mod in first_call:
                    return first_call[mod]
                if "." not in mod:
                    return None
                mod = mod.rpartition(".")[0]

        last_cut = max(c["call"] for c in cuts)
        prefixes = tuple(c["module"] + "." for c in cuts)
        affected = [n for n, _ in starved
                    if ((c := call_of(n)) is not None and c <= last_cut) or n.startswith(prefixes)]
        if not affected:
            return
        first = next((c for c in cuts if any(call_of(n) is not None and call_of(n) <= c["call"]
                                                   or n.startswith(c["module"] + ".") for n in affected)),
                     cuts[0])
        detail = {"cut": "partial", "first_module": first, "cuts": [c["module"] for c in cuts][:MAX_SAMPLES],
                  "n_cuts": len(cuts), "n_params_without_grad": len(affected),
                  "params_without_grad": affected[:MAX_SAMPLES]}
        self._record({"kind": "graph_cut", "step": self._step, "where": first.get("where"), "count": 1,
                      "detail": detail}, key=("graph_cut", first["module"], first["how"]))

    # -- non-leaf .grad reads (OC201) ---------------------------------------
    def _install_warning_hook(self) -> None:
        self._orig_showwarning = warnings.showwarning
        probes = self

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, UserWarning) and str(message).startswith(NONLEAF_WARNING):
                probes._nonleaf_read(filename, lineno)
                return None
            return probes._orig_showwarning(message, category, filename, lineno, file, line)

        self._showwarning = showwarning
        warnings.showwarning = showwarning
        warnings.filterwarnings("always", message=_NONLEAF_RE, category=UserWarning)
        self._filter = warnings.filters[0]

    def _nonleaf_read(self, filename: str, lineno: int) -> None:
        where = f"{os.path.basename(filename)}:{lineno}"
        self._record({"kind": "nonleaf_grad_access", "step": self._step, "where": where, "count": 1,
                      "detail": {"file": filename, "code": linecache.getline(filename, lineno).strip(),
                                 "value": "None (autograd populates .grad on leaf tensors only)"}},
                     key=("nonleaf_grad_access", where))

    # -- events ------------------------------------------------------------------
    def _record(self, event: dict, key: tuple) -> None:
        """Merge ``event`` into the pending one of the same ``key`` (count summed,
        first step kept, ``last_step`` updated); a key not seen before forces a snapshot."""
        pending = self._events.get(key)
        if pending is None:
            self._events[key] = event
            if key not in self._seen_keys:
                self._seen_keys.add(key)
                self._urgent = True
        else:
            pending["count"] += event["count"]
            pending["detail"]["last_step"] = event["step"]

    def has_events(self) -> bool:
        """True when an event of a kind/place not seen before was recorded since the last drain."""
        return self._urgent

    def drain(self) -> list[dict]:
        """Events since the last drain (then forgotten), plus non-finite parameters and
        optimizer state found now (checked here, at snapshot time)."""
        self._check_state()
        out = list(self._events.values())
        self._events.clear()
        self._urgent = False
        return out

    def _check_state(self) -> None:
        tensors, names = [], []
        for n, p in self._trainable():
            tensors.append(p.detach())
            names.append(("param", n))
            for k, v in self.optimizer.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0:
                    tensors.append(v)
                    names.append(("optimizer_state", f"{n}:{k}"))
        if not tensors:
            return
        with torch.no_grad():
            ok = bool(torch.stack([x.float() for x in torch._foreach_norm(tensors)]).isfinite().all())
        if ok:
            return
        bad: dict[str, list[str]] = {}
        for (what, name), t in zip(names, tensors):
            if not bool(torch.isfinite(t).all()):
                bad.setdefault(what, []).append(name)
        for what, lst in bad.items():
            self._record({"kind": "nonfinite", "step": self._step, "where": None, "count": 1,
                          "detail": {"what": what, "params": lst[:MAX_SAMPLES], "n_params": len(lst)}},
                         key=("nonfinite", what))

    def __deepcopy__(self, memo):
        """``copy.deepcopy(model)`` (a best-model copy, ``AveragedModel``) copies the
        module hooks, which are bound to these probes: the copy shares the probes,
        whose hooks ignore modules they were not built for."""
        return self

    def __reduce__(self):
        """``torch.save(model)`` pickles the module hooks: they unpickle as no-ops."""
        return (_inert_probes, ())

    def remove(self) -> None:
        """Remove every hook and the warnings filter; the probes record nothing afterwards."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for _, hs in self._hooked.values():
            for h in hs:
                h.remove()
        self._hooked = {}
        if warnings.showwarning is self._showwarning:
            warnings.showwarning = self._orig_showwarning
        try:
            warnings.filters.remove(self._filter)
            warnings._filters_mutated()
        except (ValueError, AttributeError):
            pass
        self._active = False
        self._removed = True


_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks


def _is_recompute_pack(pack) -> bool:
    """The pack hook ``torch.utils.checkpoint`` pushes while a non-reentrant checkpoint
    re-runs its function in backward (``_recomputation_hook``; torch/utils/checkpoint.py)."""
    fn = getattr(pack, "__wrapped__", pack)  # it is wrapped in torch._dynamo.disable
    return getattr(fn, "__module__", None) == "torch.utils.checkpoint" and \
        getattr(fn, "__qualname__", "").startswith("_recomputation_hook.")


def _clean(name: str) -> str:
    """A module or parameter name without the ``_orig_mod`` level ``torch.compile`` adds
    (``OptimizedModule`` keeps the model as ``_orig_mod``): ``_orig_mod.fc.weight`` → ``fc.weight``."""
    if "_orig_mod" not in name:
        return name
    return ".".join(part for part in name.split(".") if part != "_orig_mod")


def _float_tensors(out) -> list:
    """The floating tensors of a module output (a tensor, or a tuple/list/dict of them)."""
    vals = [out] if isinstance(out, torch.Tensor) else \
        list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, (tuple, list)) else []
    return [v for v in vals if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())]


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - sparse, meta, tensor subclasses without storage
        return 0


def _grad_fns(out) -> list:
    """``grad_fn`` of each tensor of a module output (a tensor, or a tuple/list/dict of them)."""
    if isinstance(out, torch.Tensor):
        return [out.grad_fn] if out.grad_fn is not None else []
    vals: Iterable = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    return [v.grad_fn for v in vals if isinstance(v, torch.Tensor) and v.grad_fn is not None]


def _backward_caller() -> str | None:
    """``file:line`` of the first frame outside torch and optcheck (the user's
    ``loss.backward()``), or None."""
    pkg = os.path.dirname(os.path.dirname(_THIS)) + os.sep
    f = sys._getframe(1)
    while f is not None and (_internal(f.f_code.co_filename) or f.f_code.co_filename.startswith(pkg)):
        f = f.f_back
    return _where(f.f_code, f.f_lineno) if f is not None else None


def _dense(g: torch.Tensor) -> torch.Tensor:
    """The values of a gradient, dense (``nn.Embedding(sparse=True)`` gives sparse COO
    gradients, which ``torch._foreach_norm`` does not take)."""
    return g._values() if g.is_sparse else g


class _InertProbes:
    """What a watched model's hooks point to after it was pickled (``torch.save(model)``):
    nothing (the probes belong to the process that watched it)."""

    def _pre(self, module, args):
        return None

    def _post(self, module, args, out):
        return None


def _inert_probes() -> _InertProbes:
    return _InertProbes()


def _ptr(t: torch.Tensor) -> int:
    try:
        return t.data_ptr()
    except Exception:  # noqa: BLE001 - sparse, meta, tensor subclasses without storage
        return 0


def _safe(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None


def _line_text(code, line) -> str | None:
    if code is None:
        return None
    return linecache.getline(code.co_filename, line).strip() or None
