"""The hook installer: :class:`HazardProbes` puts the module, saved-tensor, optimizer and
module-registration hooks in place and hands each event to the probe that reads it
(``inplace``, ``graph_cut``, ``nonleaf``, ``nonfinite``).

Over 400 lines: HazardProbes composes the probe mixins (inplace, graph_cut, nonfinite, nonleaf, arming) and owns the hooks they share per step; the mixins live in their own modules.
"""

from __future__ import annotations

import functools
import sys
import weakref
from itertools import chain, compress
from operator import attrgetter, itemgetter
from typing import Any

import torch

from optcheck.pytorch.hazards._tensors import (_VERSION, _clean, _float_outputs, _float_tensors, _grad_fns, _ptr,
                                               _storage_ptr, _tensors)
from optcheck.pytorch.hazards.arming import MODES, ArmingPolicy, _hooks_owner
from optcheck.pytorch.dynamo_safe import COMPILED_FORWARD_NOTE, UNPACK_RUNNER, EagerHook, compiled_autograd_on
from optcheck.pytorch.hazards.compiled import EntryHook, compiled_modules, is_compile_wrapper
from optcheck.pytorch.hazards.graph_cut import GraphCutProbe
from optcheck.pytorch.hazards.checkpoints import NON_REENTRANT, REENTRANT, non_reentrant_frame, reentrant_forward
from optcheck.pytorch.hazards.inplace import InplaceProbe, _is_recompute_pack, _top_hooks, graph_task_id
from optcheck.pytorch.hazards.nonfinite import NonfiniteProbe
from optcheck.pytorch.hazards.nonleaf import NonleafGradProbe
from optcheck.pytorch.hazards.replay import ForwardReplay
from optcheck.pytorch.hazards.writes import ModeSlot, WriteWatch, unmoded
from optcheck.pytorch.deferred import DeviceLedger
from optcheck.errors import StepStopped
from optcheck.pytorch import step_hooks
from optcheck.pytorch.probe import same_objects

_PARAMS, _SECOND, _REQUIRES_GRAD = itemgetter("params"), itemgetter(1), attrgetter("requires_grad")

#: what the probes cannot see inside a ``torch.compile``d forward (module hooks are traced as no-ops
#: there, so the compiled graph has no break and no guard on optcheck's state); see docs/hazards.md
NOT_CHECKED_UNDER_COMPILE = (
    "OC203 partial graph cuts inside the compiled forward (a .detach() or no_grad in a module) are not "
    "named; OC202 still reports the parameters left without gradients",
    "OC301 write sites inside the compiled forward: an in-place write to a saved tensor there makes "
    "compilation fail with PyTorch's own 'modified by an inplace operation' error instead",
    "OC203 full cut (a loss without grad_fn) is still found, without the module that lost grad_fn",
)


class HazardProbes(ArmingPolicy, ForwardReplay, InplaceProbe, GraphCutProbe, NonleafGradProbe, NonfiniteProbe):
    """Autograd hazard probes for one model and optimizer (see the package docstring).

    Args:
        model: any ``nn.Module``; forward pre/post hooks go on every sub-module.
        optimizer: its param groups define "the parameters that should get gradients".
        allow_inplace: record an in-place write to a saved tensor and continue
            (backward uses the written values) instead of raising ``StepStopped``.
        grad_check_every: check gradients for NaN/Inf every this many steps
            (1 = every step; 0 = only at drain time via the optimizer state).
        compiled: the model is run through ``torch.compile`` (``model`` is the module it
            wraps): :attr:`not_checked` then lists what the probes cannot see.
        mode: "auto" (arm the module and saved-tensor hooks on the steps the policy picks,
            ``optcheck/pytorch/hazards/arming.py``) or "always" (every step).
        ledger: where the loss and gradient NaN/Inf checks leave their device flags
            (``optcheck.pytorch.deferred.DeviceLedger``, shared with the driver, which reads
            it at its next snapshot or metrics batch); default: one of its own, read at
            :meth:`drain`.
        hook_wrap: ``hook_wrap(hook)`` is registered in place of each optimizer step hook
            (``optcheck.pytorch.step_hooks.register``'s ``wrap``: ``optcheck.Monitor`` times them
            as its own).

    Raises (from the hooks):
        optcheck.errors.StepStopped: an in-place write to a saved tensor
            (unless ``allow_inplace``), or a loss without ``grad_fn``; ``.event``
            is the schema-1 event (it is *not* also returned by :meth:`drain`).
        ValueError: ``mode`` is not one of :data:`MODES`.
    """

    can_replay = True  # a step run unarmed can be re-run armed (the soak's Trainer.train_step)

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, allow_inplace: bool = False,
                 grad_check_every: int = 1, compiled: bool = False, mode: str = "auto", ledger=None,
                 hook_wrap=None):
        if mode not in MODES:
            raise ValueError(f"hazard probe mode must be one of {MODES}, got {mode!r}")
        self.model, self.optimizer = model, optimizer
        # module hooks installed (armed); unarmed steps have none. Never on a module that runs under
        # torch.compile (compiled.py): Dynamo would trace them (it keeps no guard on hooks: no recompile)
        self._hooks_on = mode == "always"
        self.compiled = compiled  # some module of the model runs under torch.compile (sticky)
        self._root_compiled = compiled  # the model's call is a compiled region's entry (compiled.py)
        self._compiled_ids: set[int] = set()  # ids of the modules that run under Dynamo (never hooked)
        self._hook_traced = False  # a module hook was traced all the same (_pre): the hooks stay as they are
        self._hooked_dicts: list[dict] = []  # the hooked modules' __dict__ (compiled in place since? compiled.py)
        self._entry_pre, self._entry_post = EntryHook(self, "_pre"), EntryHook(self, "_post")  # the model's own
        self.allow_inplace = allow_inplace
        self.grad_check_every = grad_check_every
        self.ledger = ledger if ledger is not None else DeviceLedger()
        self._step = 0
        self._active = False
        self._events: dict[tuple, dict] = {}
        self._seen_keys: set[tuple] = set()
        self._urgent = False
        self._handles = []
        self._removed = False
        self.on_stop = None  # optional callback f(StepStopped) called before the raise
        self._stopped_step = None  # the step a StepStopped was raised in (counted then, arming.py stats)
        self._names: dict[int, str] = {}
        self._hooked: dict[int, tuple] = {}  # id(module) -> (weakref to it, its two hook handles)
        self._param_names: dict[int, str] = {}
        self._pushed: list[tuple] = []  # (module,) whose call pushed composed checkpoint-recompute hooks
        # the writer of an in-place write (writes.py): a torch-function mode on armed steps, pushed at the
        # first eager module call (never inside a compiled forward: Dynamo guards on the mode stack)
        self._watch = WriteWatch(self._seen_write, self._watch_failed)
        self._slot, self._bw_slot = ModeSlot(self._watch), ModeSlot(self._watch)
        self._bw_pushed: list = []  # modules whose forward in backward() (a recompute) pushed the mode
        self.faults: list[str] = []  # optcheck's own errors inside the step (reported in not_checked)
        self._compiled_saves = 0  # tensors a compiled graph saved while armed (not checked: dynamo_safe.py)
        self._replaying = False  # the armed re-run of an unarmed step's forward (replay.py)
        self._init_replay()
        # the saved-tensor hooks: one bound method each, the innermost hook is ours when it is this object;
        # the torch.compiler.disable'd pair once a module runs compiled (_saved_hooks_outside)
        self._pack_plain = self._pack_hook = self._pack
        # the unpack hook run outside Dynamo, traced as the saved tensor where Dynamo inlines it: under
        # compiled autograd (Dynamo traces backward()) and once a module runs compiled
        self._unpack_outside = functools.partial(UNPACK_RUNNER, self._unpack)
        self._unpack_hook = self._unpack_outside if compiled_autograd_on() else self._unpack
        self.rescans = 0
        self._scan()
        # a sub-module assigned later (``ff[1] = Gate()``, ``m.blocks = Wrapper(m.blocks)``) marks the
        # names stale; the next hooked forward re-scans (torch/nn/modules/module.py: register_module runs
        # the global module-registration hooks on every sub-module assignment)
        self._dirty = False
        # (process-wide: run outside Dynamo and traced as nothing where a compiled region registers a
        # module, as compiled autograd's fx modules are: dynamo_safe.py)
        self._handles.append(torch.nn.modules.module.register_module_module_registration_hook(
            EagerHook(self._registered)))
        self._handles += step_hooks.register(optimizer, self._before_step, self._after_step,  # once per outer step()
                                             wrap=hook_wrap)
        self._internal_code: dict[Any, bool] = {}
        self._trainable_key: object | None = None  # a token, new whenever _trainable_all is rebuilt
        self._trainable_all: list[tuple[str, torch.Tensor]] = []  # every param-group member, named
        self._trainable_flat: list = []  # the members it was made from, in order
        self._trainable_at = -1  # self.rescans when it was made
        self._trainable_rg: tuple | None = None  # their requires_grad flags when _trainable_now was made
        self._trainable_now: list[tuple[str, torch.Tensor]] = []  # those that require grad
        self._trainable_ps: list = []  # and their parameters (as the last _trainable() call left them)
        self._install_warning_hook()
        self._step_hooks, self._step_entered = None, False  # begin_step's (the step context's, held here)
        self._init_arming(mode)
        self._reset_step()

    @property
    def not_checked(self) -> list[str]:
        """What these probes do not check on this model (empty for an eager model)."""
        hidden = [COMPILED_FORWARD_NOTE] if self._compiled_saves and not self.compiled else []
        return (list(NOT_CHECKED_UNDER_COMPILE) if self.compiled else []) + hidden + self.faults

    def _watch_failed(self, e: BaseException) -> None:
        """The write log raised (optcheck's own error): said once, the step goes on."""
        note = f"in-place write log failed ({type(e).__name__}: {str(e)[:120]}); writers may be unnamed"
        if note not in self.faults:
            self.faults.append(note)

    def _scan(self) -> None:
        """(Re)build module and parameter names from the model as it is now, hook
        modules not hooked yet and unhook those no longer in it. Cost: one
        ``named_modules()`` walk (see ``benchmarks/``), run only after a sub-module
        assignment."""
        root = type(self.model).__name__
        names: dict[int, str] = {}
        self._nchild: dict[int, int] = {}
        mods = {}
        for name, m in self.model.named_modules():
            names.setdefault(id(m), _clean(name) or root)
            self._nchild[id(m)] = len(m._modules)
            mods.setdefault(id(m), m)
        self._mods = {k: weakref.ref(m) for k, m in mods.items()}
        self._compiled_ids = compiled_modules(self.model, self._root_compiled)
        self.compiled = self.compiled or bool(self._compiled_ids)
        if self.compiled:
            self._saved_hooks_outside()
        self._mod_dicts = [m.__dict__ for m in mods.values()]
        self._mod_children = [m._modules for m in mods.values()]
        self._struct = self._structure()
        self._names = names
        if self._hooks_on:
            self._hook_modules()
        self._param_names = {}
        for name, p in self.model.named_parameters():
            self._param_names.setdefault(id(p), _clean(name))
        self._dirty = False
        self.rescans += 1

    def _saved_hooks_outside(self) -> None:
        """A module runs compiled: the saved-tensor hooks from now on are ``torch.compiler.disable``'d.
        Autograd calls them from C++ inside the compiled call, where Dynamo's frame callback is on
        and would compile them (a ``torch.nn`` layer compiled in place: its own frames are skipped,
        the first frame it meets is ours). This step's pair, when it is the innermost, is swapped."""
        if self._pack_hook is not self._pack_plain:
            return
        pack, unpack = torch.compiler.disable(self._pack), self._unpack_outside
        pack.optcheck = True  # (ours: not someone else's hooks, arming.py)
        self._pack_hook, self._unpack_hook = pack, unpack
        top = _top_hooks(False)
        if top is not None and top[0] is self._pack_plain:
            torch._C._autograd._pop_saved_tensors_default_hooks()
            torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)

    def _registered(self, module, name, submodule):
        """Global module-registration hook: a sub-module was assigned to a watched module (a
        watched module put into a module outside the watched tree is no change of it). ``torch.compile(model)`` puts the model
        into an ``OptimizedModule``: from now on its call is a compiled region's entry, and
        every module hook comes off before it is first called (``compiled.py``)."""
        if submodule is self.model and is_compile_wrapper(module):
            self._root_compiled = True
            self._scan()
            return None
        # only a change of the watched tree itself: a watched module registered into a container outside
        # it (``self.layers[:n]`` makes a new ModuleList each forward in HF Llama-family models, a temporary
        # ``nn.Sequential(*blocks)``) changes nothing the probes watch (``m.blocks = Wrapper(m.blocks)``
        # still reaches here as the wrapper's registration into ``m``)
        if id(module) in self._names:
            self._dirty = True
            self._arm_now()
        return None

    def _reset_step(self) -> None:
        self._calls: list[str] = []  # module name per forward call, in call order
        self._pass = -1  # call index of the outermost module call running now (a forward pass)
        self._forget_cuts()
        self._in_backward = False
        self._reported: set[int] = set()  # ids of saved tensors already reported this step
        self._writes: dict[int, list] = {}  # storage address -> in-place writes the mode saw (inplace.py)
        self._pending = None  # (message, event) of a write seen inside the mode: stopped at the next hook
        self._release()

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
        self._clean_ptrs: dict[int, torch.Tensor] = {}  # data_ptr of float tensors no cut made (graph_cut.py)
        self._introspecting = False
        self._kept: dict[tuple, dict] = {}  # inputs checkpoints keep for their recompute (checkpoints.py)
        self._ck_seen: dict[int, object] = {}  # the checkpoint calls whose inputs were read this step
        self._entering = None
        self._cur_post, self._leaving = -1, None

    def step_context(self, step: int) -> "_StepContext":
        """Wrap forward and backward of training step ``step`` (1-based). After
        :meth:`remove` it does nothing (PyTorch's own version check applies again).
        (A plain object, not a ``contextlib.contextmanager`` generator: entered and left
        once per training step, issue 34.)"""
        return _StepContext(self, step)

    def begin_step(self, step: int) -> None:
        """Begin training step ``step``: its arming decided now (the saved-tensor hooks of an armed
        step entered); :meth:`finish_step` undoes it. :meth:`step_context` wraps the pair; a driver
        that enters and leaves each step from its own hooks calls them itself (``optcheck.Monitor``:
        no object per training step, issue 34)."""
        self._step_hooks = self._enter_step(step)
        self._step_entered = not self._removed

    def finish_step(self) -> None:
        """End the step :meth:`begin_step` began (the saved-tensor hooks of an armed step
        popped); nothing when none is running."""
        hooks, self._step_hooks = self._step_hooks, None
        entered, self._step_entered = self._step_entered, False
        try:
            if hooks is not None:
                hooks.__exit__(None, None, None)
        finally:
            if entered:
                self._exit_step()

    def _enter_step(self, step: int):
        """:meth:`step_context`'s entry: decide arming; the saved-tensor hooks' context
        when armed (entered here), else None."""
        if self._removed:
            return None
        if self._step and self._step != step and self._ended != self._step:
            self.end_step(self._step)  # the watched optimizer did not step (or another one is stepping)
        self._step = step
        reason = self._decide()
        self.armed, self.armed_reason = reason is not None, reason
        self._set_armed(self.armed)
        self._reset_step()
        self._active = self._fresh = self.armed
        self._in_ctx = True
        if not self.armed:  # no hook: PyTorch's own version check is on (backward_failed reads its error)
            return None
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack_hook, self._unpack_hook)
        try:
            hooks.__enter__()
        except BaseException:
            self._exit_step()
            raise
        return hooks

    def _exit_step(self) -> None:
        self._in_ctx = False
        self._slot.pop()
        self._disarm_late()
        self._active = self._fresh = False
        self._release()

    @unmoded
    def _pre(self, module, args):
        if torch.compiler.is_compiling():
            # traced by Dynamo: a module compiled in a way the probes did not see (compiled.py takes the hooks
            # off every module it knows runs under Dynamo). Returning at once keeps it out of the graph (no
            # graph break, no guard on optcheck's state); see docs/hazards.md. Dynamo may guard on the hooks
            # there (a model called from a compiled function): keep them as they are from now on
            self.compiled = self._hook_traced = True
            return None
        if not self._active or id(module) in self._compiled_ids:  # (the model's own: compiled since, _log_pass)
            return None
        if self._dirty:
            self._scan()
        name = self._names.get(id(module))
        if name is None:  # a copy of a watched module (copy.deepcopy(model) copies its hooks)
            return None
        if self._pending is not None:
            self._raise_pending(_tensors(args))
        if self.compiled:
            pass  # never the mode while a module runs compiled: Dynamo would trace it (docs/hazards.md)
        elif graph_task_id() == -1:
            if not self._slot.on:
                self._slot.push()  # the first eager module call of an armed step (see __init__)
        elif not self._bw_slot.on:
            # in backward() (a checkpoint's recompute): Tensor.backward's dispatch took the mode off for
            # the call's length; on again for this module's forward (writes.py)
            self._bw_slot.push()
            self._bw_pushed.append(module)
        if len(module._modules) != self._nchild.get(id(module)):
            # children added or removed without a registration hook (Sequential.insert and
            # ModuleList.insert write ``_modules`` directly): re-scan before they run
            self._scan()
            name = self._names.get(id(module), name)
        top = _top_hooks(False)
        if top is not None and top[0] is not self._pack_hook and top[0] is not self._pack_plain:
            if _is_recompute_pack(top[0]):
                self._stay_armed("checkpoint (non-reentrant)")  # PyTorch checks no version in its recompute
                self._compose(module, *top)
            elif not getattr(top[0], "optcheck", False):
                self._stay_armed(_hooks_owner(top[0]))
                ck = non_reentrant_frame(top[0])  # a non-reentrant checkpoint's forward: what it keeps
                if ck is not None and graph_task_id() == -1:
                    self._checkpoint_inputs(NON_REENTRANT, ck, sys._getframe())
        elif not torch.is_grad_enabled() and graph_task_id() == -1:
            cf = reentrant_forward(sys._getframe())  # a reentrant checkpoint's forward runs under no_grad
            if cf is not None:
                self._checkpoint_inputs(REENTRANT, cf, cf)
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
            self._grad_ptrs, self._clean_ptrs = {}, {}
        elif args:
            a = args[0]
            if isinstance(a, torch.Tensor) and not a.requires_grad and a.is_floating_point() \
                    and torch.is_grad_enabled():
                ptr = _ptr(a)
                src = self._grad_ptrs.get(ptr) if self._grad_ptrs else None
                if src is not None:
                    self._detached_input(idx, src[0])
                elif not self._grad_ptrs:  # made before any output of this pass required grad: no cut
                    self._clean_ptrs[ptr] = a  # (the reference keeps the address from being reused)
                elif ptr not in self._clean_ptrs:
                    # (a frozen module's input that an earlier module took before anything required grad,
                    # or that a module without trainable inputs made, is data: PEFT LoRA's frozen k_proj
                    # reads what the LoRA-targeted q_proj read)
                    self._detached_input(idx, None)
        return None

    @unmoded
    def _post(self, module, args, out):
        if torch.compiler.is_compiling() or id(module) in self._compiled_ids:
            return None
        if self._bw_pushed and self._bw_pushed[-1] is module:
            self._bw_pushed.pop()
            self._bw_slot.pop_here()
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
        if self._pending is not None:
            self._raise_pending(_float_tensors(out))
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
            self._maybe_cut(module, args, idx, out)
        if not self._stack and idx in self._cut_passes:  # a pass with cut records ends: keep what it gave
            outs = _float_tensors(out)
            self._pass_out[idx] = (rg, _grad_fns(out) if rg else [], outs)  # outs: their addresses stay theirs
            if not rg:
                self._eval_ptrs.update((ptr, idx) for ptr in map(_storage_ptr, outs) if ptr)
        return None

    @unmoded
    def check_loss(self, loss: torch.Tensor, step: int, value: torch.Tensor | None = None) -> None:
        """Before ``loss.backward()``: in-place writes since the last module
        boundary, a loss without ``grad_fn`` (raises ``StepStopped``; a leaf loss
        that requires grad is recorded instead: backward would run), a non-finite
        loss (recorded). ``value``: ``loss`` detached, as the caller keeps it (a Monitor's
        step loss): the non-finite check hands that tensor to the ledger, which then copies
        it once for both (``optcheck/pytorch/deferred.py``)."""
        self._step = step
        self._fresh = False
        if self._active and self._compiled_saves and not self._calls and not self._hook_traced:
            # the model ran inside a compiled function (its hooks traced as nothing, its tensors saved by
            # the compiled graph): Dynamo guards on the hooks it inlined, so they stay as they are now
            self.compiled = self._hook_traced = True
        self._before_backward_grads()
        if not self.armed and not self._removed:
            self._watch_foreign_hooks()
        if self._active:
            if self._pending is not None:
                self._raise_pending((loss,))
            self._check_versions("check_loss (after the model's forward, before backward)")
            # backward starts: the mode off until the next forward (a recompute puts it back per module)
            # so the rest of the step — optcheck's own bookkeeping, clipping, the step — runs without it
            self._slot.pop()
            self._last = ("loss", -1)
            self._in_backward = True
            roots = self._roots
            self._release()  # backward frees saved tensors as it goes: hold none of them from here on
            self._roots = roots
        if not isinstance(loss, torch.Tensor):
            return
        grad_fn = loss.grad_fn
        if grad_fn is not None and self._active:  # (a root of the graph walk that names a saving op: armed)
            self._roots.append(grad_fn)
        if grad_fn is None or self._cut_passes:  # (else nothing for the graph check: every unarmed step)
            self._check_loss_graph(loss)
        self._check_loss_finite(loss if value is None else value, step)

    @unmoded
    def after_backward(self, step: int) -> None:
        """After ``loss.backward()``: confirm partial graph cuts (optimizer
        parameters at or before a cut got no gradient). The gradients' NaN/Inf check runs
        once per step, at the optimizer's step pre-hook (:meth:`_before_step`)."""
        self._in_backward = False
        self._forget_passes()  # the passes of this backward are done (replay.py)
        self._after_backward_grads()
        if self._cut:  # cut records to judge (none on an unarmed step: no module hook recorded one)
            self._judge_at_backward(self._trainable())

    @unmoded
    def _before_step(self, optimizer, args, kwargs) -> None:
        """The watched optimizer is about to step: the write log's mode off (the step's own in-place
        writes are no hazard), and the gradients' NaN/Inf check on the device."""
        self._slot.pop()
        if self._removed or not self.grad_check_every or torch.compiler.is_compiling():
            return
        self._check_grads_finite(self._trainable(), self._step)

    def _members(self) -> list:
        """Every param-group member of the watched optimizer now, in order."""
        return list(chain.from_iterable(map(_PARAMS, self.optimizer.param_groups)))

    def _members_unchanged(self) -> bool:
        """The param groups hold the objects :meth:`_trainable` last listed, in the same order."""
        return same_objects(self._members(), self._trainable_flat)

    def _trainable(self) -> list[tuple[str, torch.Tensor]]:
        """(name, parameter) of the optimizer's parameters that require grad now (a list shared
        between calls: read it, never change it). Kept, names and all, while the param groups
        hold the same objects in the same order, the model's names are not re-scanned and no
        ``requires_grad`` flag moved: per call two C-level maps over the parameters and no
        Python frame per parameter (issue 34: called once per training step)."""
        flat = self._members()
        if self._trainable_at != self.rescans or not same_objects(flat, self._trainable_flat):
            self._trainable_all = [(self._param_names.get(id(p), f"<param {id(p)}>"), p) for p in flat]
            self._trainable_flat, self._trainable_at = flat, self.rescans
            self._trainable_key = object()  # a new token: the arrival list (arming.py) is rebuilt from it
            self._trainable_rg = None
        rg = tuple(map(_REQUIRES_GRAD, flat))
        if rg != self._trainable_rg:
            self._trainable_now = list(compress(self._trainable_all, rg))
            self._trainable_ps = list(map(_SECOND, self._trainable_now))
            self._trainable_rg = rg
        return self._trainable_now

    @unmoded
    def _after_step(self, optimizer, args, kwargs) -> None:
        """The watched optimizer stepped: judge cuts fed to it (graph_cut), then the step's
        gradient arrival (arming.py), and count the step."""
        GraphCutProbe._after_step(self, optimizer, args, kwargs)
        if torch.compiler.is_compiling() or self._removed:
            return
        self.end_step(self._step)
        self._count_step()

    def step_ended(self, step: int) -> None:
        """A training step taken inside backward ended (``optcheck/pytorch/in_backward.py``):
        judge its gradient arrival and count it, as after the watched optimizer's step. No
        judgment of no-grad forwards fed to it (:meth:`_after_step`): the gradients were
        released inside backward, so ``.grad`` being None says nothing."""
        if torch.compiler.is_compiling() or self._removed:
            return
        self.end_step(step)
        self._count_step()

    def _stop(self, msg: str, event: dict, cause: BaseException | None = None) -> None:
        """Raise StepStopped, after telling ``on_stop`` (a Monitor records the finding
        there, before the exception unwinds the user's forward)."""
        exc = StepStopped(msg, event)
        if self._stopped_step != self._step and not self._replaying:
            # the stopped step never reaches the optimizer's step: counted here (not the re-run's own stop, replay.py)
            self._count_step()
            self._stopped_step = self._step
        if self.on_stop is not None:
            self.on_stop(exc)
        raise exc from cause

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

    def drain(self, norms: dict | None = None) -> list[dict]:
        """Events since the last drain (then forgotten), plus non-finite parameters and
        optimizer state found now (checked here, at snapshot time; from ``norms``, the
        snapshot body's ``optcheck.pytorch.probe.Norms``, when given). The device checks
        still pending are read first (a snapshot reads them in its flush already)."""
        self.ledger.read()
        self._check_state(norms)
        n, self._drains = self._drains, self._drains + 1  # (the start snapshot is n = 0: its step is armed)
        if n in (1, 2, 4) or (n and n % 8 == 0):
            # the step after the 1st, 2nd, 4th and every 8th snapshot after the start: an armed step
            # costs about two thirds of a small model's step (issue 34); a structure change arms its own
            self.arm("snapshot")
        out = list(self._events.values())
        self._events.clear()
        self._urgent = False
        return out

    def __deepcopy__(self, memo):
        """``copy.deepcopy(model)`` (a best-model copy, ``AveragedModel``) leaves optcheck's
        hooks out (``unsaved.py``); where a module's own ``__getstate__`` bypasses that, the
        copy's hooks share these probes, whose hooks ignore modules they were not built for."""
        return self

    def __reduce__(self):
        """``torch.save(model)`` leaves optcheck's hooks out (``unsaved.py``); where a module's
        own ``__getstate__`` bypasses that, they unpickle as no-ops."""
        return (_inert_probes, ())

    def remove(self) -> None:
        """Remove every hook and the warnings filter; the probes record nothing afterwards."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._pass_hook.remove()
        self._forget_passes()
        self._unhook_modules()
        # the write log's mode out of this thread's stack, both slots, even inside backward() (a Monitor
        # closed there, or after a backward() an exception ended, would leave it on the user's stack:
        # traced by every torch.compile after, and a torch function detour on every op)
        self._slot.release()
        self._bw_slot.release()
        self._hooks_on = False
        self._remove_warning_hook()
        self._active = False
        self._removed = True


class _InertProbes:
    """What a watched model's hooks point to after it was pickled (``torch.save(model)``):
    nothing (the probes belong to the process that watched it)."""

    def _pre(self, module, args):
        return None

    def _post(self, module, args, out):
        return None

    def _log_pass(self, module, args, kwargs):
        return None


class _StepContext:
    """:meth:`HazardProbes.step_context`: :meth:`HazardProbes.begin_step` on entry,
    :meth:`HazardProbes.finish_step` on exit (whatever the block raised)."""

    __slots__ = ("probes", "step")

    def __init__(self, probes: "HazardProbes", step: int):
        self.probes, self.step = probes, step

    def __enter__(self) -> "HazardProbes":
        self.probes.begin_step(self.step)
        return self.probes

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.probes.finish_step()
        return False


def _inert_probes() -> _InertProbes:
    return _InertProbes()
