"""When the hazard probes are armed (mixin of :class:`HazardProbes`; docs/hazards.md,
"Armed on demand").

Armed, a step runs with every module hook and the saved-tensor hooks (write site,
module and line of an OC301; the module of an OC203). Unarmed, none of them is
installed: PyTorch's own version check stays on (``torch/csrc/autograd/saved_variable.cpp``
checks every saved tensor's version at ``backward()`` when no saved-tensor hooks are
set), so an in-place write to a saved tensor still fails there, and
:meth:`ArmingPolicy.backward_failed` turns that ``RuntimeError`` into the OC301 event.
What runs on every step, armed or not: the loss checks, the gradient NaN/Inf check, the
non-leaf ``.grad`` warning hook and the gradient-arrival check (which trainable
parameters got a gradient in each backward: their ``.grad`` identity and version
counter before and after, one C-level ``map`` each).

Policy ``auto`` arms: the first step (and the step after :meth:`arm`, e.g. a resume),
the step after each snapshot (:meth:`drain`), a step whose module structure changed
(a sub-module registered, a container's children, a ``forward`` replaced on an
instance; a sub-module registered while a step runs unarmed, before its forward,
arms that very step: :meth:`ArmingPolicy._arm_now`), the step after a *trigger* (trainable parameters that got a gradient at the
previous step got none at this one, as a set not confirmed clean already), and every
step for good once an armed step saw a non-reentrant checkpoint's recompute or foreign
saved-tensor hooks, or with ``allow_inplace``. Policy ``always`` arms every step.
"""

from __future__ import annotations

import re
from itertools import compress, repeat
from operator import attrgetter, is_not

import torch

from optcheck.pytorch.hazards.unsaved import own
from optcheck.pytorch.hazards.compiled import any_compiled_in_place, called_from_compiled
from optcheck.wording import describe_inplace

MODES = ("auto", "always")
_SHARED = ("shared",)  # _gb's mark: this pass's arrival is read from ``arrival_source``
_GRAD = attrgetter("grad")
_FORWARD = repeat("forward")  # a forward replaced on the instance lives in its __dict__
_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
# torch/csrc/autograd/saved_variable.cpp (SavedVariable::unpack), torch 2.x wording
_PYTORCH_INPLACE = re.compile(
    r"modified by an inplace operation: \[(?P<type>[\w.]+) \[(?P<shape>[^\]]*)\]\]"
    r"(?:, which is output (?P<nr>\d+) of (?P<node>\w+),)? is at version (?P<version>\d+); "
    r"expected version (?P<saved>\d+) instead")


def _live(hooked: tuple):
    """An entry of ``_hooked`` (weakref, handles) -> the module, or None once it is gone."""
    return hooked[0]()


def _hooks_owner(pack) -> str:
    """Why saved-tensor hooks of someone else keep the probes armed: a non-reentrant
    checkpoint's (``torch/utils/checkpoint.py``: ``_checkpoint_hook`` in forward,
    ``_recomputation_hook`` in backward), or others' (``save_on_cpu``, a user's own)."""
    fn = getattr(pack, "__wrapped__", pack)  # torch._dynamo.disable wraps the checkpoint's
    if getattr(fn, "__module__", None) == "torch.utils.checkpoint":
        return "checkpoint (non-reentrant)"
    return "foreign saved-tensor hooks"


def pytorch_inplace_error(exc: BaseException) -> re.Match | None:
    """The parts of PyTorch's "one of the variables needed for gradient computation has been
    modified by an inplace operation" ``RuntimeError`` (None for any other exception)."""
    return _PYTORCH_INPLACE.search(str(exc)) if isinstance(exc, RuntimeError) else None


class ArmingPolicy:
    """Arming policy and the checks of unarmed steps (see the module docstring)."""

    def _init_arming(self, mode: str) -> None:
        self.mode = mode
        self.armed = False  # the running step is armed
        self.armed_reason: str | None = None
        self._fresh = False  # the step context is entered armed and nothing ran in it yet
        self._arm_next: str | None = "start"
        self._drains = 0  # snapshots taken (drain() calls): the step after some of them is armed
        self._sticky: str | None = "allow_inplace" if self.allow_inplace else None
        self.armed_steps = 0  # optimizer steps taken armed / in all (counted at the watched optimizer's step)
        self.steps = 0
        self.arm_reasons: dict[str, int] = {}
        self._got: set[int] = set()  # ids of parameters that got a gradient in a backward of this step
        self._arrival_key = None  # _trainable_key the cached parameter list below was made for
        self._arrival_ps: list = []
        self._arrival_ids: tuple = ()
        self._got_prev: frozenset | None = None  # ... of the previous step
        self._prev_saved: frozenset | None = None  # _got_prev before this step's end (a replay restores it)
        # the step's one shared pass, as the gradient-flow probe gave it: (ids it indexes, indices that got
        # a gradient), kept as it is until the step ends; and the previous step's, when that step had only
        # it: an arrival list equal to the last one is the same set, not built again (issue 34)
        self._got_pass: tuple | None = None
        self._prev_pass: tuple | None = None
        self._gb: tuple | None = None  # grads (and their versions) before the running backward
        # a GradClearProbe (per pass) over the same parameters whose pass arrival is read instead of
        # mapping the gradients a second time (set by optcheck.Monitor: one pass per backward, issue 34)
        self.arrival_source = None
        self._ended = 0  # the last step whose gradient arrival was judged
        self._clean_sets: set[frozenset] = set()  # gradless sets an armed step found no cut for
        self._trigger: tuple | None = None  # (step, frozenset of ids): a gradless set waiting for an armed step
        self._cut_sets: dict[tuple, tuple] = {}  # event key -> (ids of its parameters, event): confirmed cuts
        self._struct = self._structure()
        self._in_ctx = False  # inside step_context (a step is running)
        self._late = None  # saved-tensor hooks pushed by _arm_now, popped at the step's end

    # -- the decision --------------------------------------------------------------------
    def arm(self, reason: str) -> None:
        """Arm the next step (``reason`` goes to :meth:`stats`), e.g. after ``load_state_dict``.
        Nothing to do when the step about to run is armed already (its context entered, armed,
        nothing run in it yet: the Monitor's first step, before its step-0 snapshot)."""
        if not self._fresh:
            self._arm_next = self._arm_next or reason

    def _arm_now(self) -> None:
        """A sub-module was registered while the running step is unarmed and nothing of its
        forward ran yet (``ff[1] = Gate()`` between two steps): arm this step now, so the
        step in which the new module first runs names its own write site (OC301 with the
        line). Only at the outer level: not inside a forward or a backward, and with no
        saved-tensor hooks of anyone else on the stack (ours are pushed here and popped at
        the step's end, :meth:`_disarm_late`). The new module is hooked at the first
        hooked forward (it is not in its parent yet while the registration hook runs)."""
        if (self.armed or not self._in_ctx or self._removed or self.mode != "auto" or self._stack
                or self._in_backward or self._late is not None or _top_hooks(False) is not None
                or torch._C._current_graph_task_id() != -1):
            return
        self.armed, self.armed_reason = True, "registration"
        self._hooks_on = True
        self._hook_modules()  # the modules there now; the new one at the first forward (_dirty)
        self._reset_step()
        self._active = self._fresh = True
        self._late = torch.autograd.graph.saved_tensors_hooks(self._pack_hook, self._unpack_hook)
        self._late.__enter__()

    def _disarm_late(self) -> None:
        """At the end of a step armed by :meth:`_arm_now`: pop its saved-tensor hooks."""
        late, self._late = self._late, None
        if late is not None:
            late.__exit__(None, None, None)

    def _decide(self) -> str | None:
        """Why the step starting now is armed, or None (unarmed)."""
        if self.mode == "always":
            return "always"
        if self._sticky:
            return self._sticky
        reason, self._arm_next = self._arm_next, None
        struct = self._structure()
        if struct != self._struct or self._dirty:
            self._struct = struct
            reason = reason or "structure"
        return reason

    def _hook_modules(self) -> None:
        """Module hooks on every module of the model not hooked yet, except those that run under
        ``torch.compile`` (``compiled.py``: Dynamo would trace them); off those no longer in it or
        compiled since. The model's own are :class:`EntryHook` s (never traced when its call is
        a compiled region's entry)."""
        compiled = self._compiled_ids
        for key, ref in self._mods.items():
            m = ref()
            have = self._hooked.get(key)  # (none added once traced in a compiled function: Dynamo guards on them)
            if m is not None and key not in compiled and (have is None or have[0]() is not m) \
                    and not self._hook_traced:  # EntryHooks: nothing traced, eager outside Dynamo (dynamo_safe)
                self._hooked[key] = (ref, (own(m.register_forward_pre_hook(self._entry_pre)),  # (unsaved.py)
                                           own(m.register_forward_hook(self._entry_post, always_call=True))))
        for key in [k for k in self._hooked if k not in self._mods or k in compiled]:
            for h in self._hooked.pop(key)[1]:
                h.remove()
        self._hooked_dicts = [m.__dict__ for m in map(_live, self._hooked.values()) if m is not None]

    def _unhook_modules(self) -> None:
        """No module hook at all (an unarmed step): every module call takes
        ``Module._call_impl``'s fast path again (``torch/nn/modules/module.py``)."""
        for _, hs in self._hooked.values():
            for h in hs:
                h.remove()
        self._hooked = {}
        self._hooked_dicts = []

    def _leave_compiled(self, frame) -> None:
        """Armed, at the start of the model's call (its first hook, an :class:`EntryHook` run
        outside Dynamo; ``frame``: its frame): when the call enters a compiled region
        (``torch.compile(model)`` made before the Monitor, ``model.compile()``), or a hooked
        sub-module was compiled in place or a module assigned since the last scan, re-scan:
        every hook of a module that runs under Dynamo comes off before the compiled frame is
        traced (``compiled.py``)."""
        if not self._root_compiled and called_from_compiled(frame):
            self._root_compiled = self._dirty = True
        if self._dirty or any_compiled_in_place(self._hooked_dicts):
            self._scan()

    def _set_armed(self, on: bool) -> None:
        on = on or self._hook_traced  # (Dynamo may guard on the hooks it traced: adding or removing them recompiles)
        if on and self._dirty:
            self._hooks_on = True
            self._scan()
        elif on != self._hooks_on:
            self._hooks_on = on
            self._hook_modules() if on else self._unhook_modules()

    def _structure(self):
        """A cheap signature of the model's structure (two C-level maps over its modules): a
        ``forward`` replaced on an instance, children added or removed (``Sequential.insert``
        writes ``_modules`` without the registration hook)."""
        # (map(dict.get, dicts, repeat(key)): 0.9 µs over 26 modules, methodcaller 2.4 µs; issue 34)
        return tuple(map(dict.get, self._mod_dicts, _FORWARD)), tuple(map(len, self._mod_children))

    def _stay_armed(self, why: str) -> None:
        self._sticky = self._sticky or why

    def _watch_foreign_hooks(self) -> None:
        """Unarmed, at ``check_loss``: saved-tensor hooks of someone else on the stack
        (``torch.autograd.graph.save_on_cpu``, a non-reentrant checkpoint): PyTorch checks no
        version under them, so only the armed probes can: stay armed."""
        top = _top_hooks(False)
        if top is not None and top[0] is not self._pack_hook and not getattr(top[0], "optcheck", False):
            self._stay_armed(_hooks_owner(top[0]))

    def stats(self) -> dict:
        """``summary.json``'s ``hazards``: mode, optimizer steps taken armed and in all, and
        how many armed steps each reason armed (docs/summary.md)."""
        return {"mode": self.mode, "armed_steps": self.armed_steps, "steps": self.steps,
                "reasons": dict(sorted(self.arm_reasons.items())), "stays_armed": self._sticky}

    # -- gradient arrival -----------------------------------------------------------------
    def _arrival_params(self) -> list:
        """The optimizer's parameters (cached with the names of ``_trainable``)."""
        if self._arrival_key is not self._trainable_key or self._trainable_key is None:
            self._trainable()
            self._arrival_ps = [p for _, p in self._trainable_all]
            ids = tuple(map(id, self._arrival_ps))
            src = self.arrival_source
            # the very tuple of the gradient-flow probe when equal: the per-pass test below compares
            # their elements by identity then (no integer comparison per parameter)
            self._arrival_ids = src.ids if src is not None and src.ids == ids else ids
            self._arrival_key = self._trainable_key
        return self._arrival_ps

    def _before_backward_grads(self) -> None:
        """Before a backward: each trainable parameter's ``.grad`` and its version counter (or
        nothing, when :attr:`arrival_source` watches the same parameters pass by pass)."""
        ps = self._arrival_params()
        src = self.arrival_source
        if src is not None and src.per_pass and src.ids == self._arrival_ids:
            self._gb = _SHARED
            return
        gb = list(map(_GRAD, ps))
        if not any(map(is_not, gb, repeat(None))):  # zero_grad(set_to_none=True): nothing to compare
            # (not gb.count(None): list.count compares with ==, and Tensor == None runs a torch op)
            self._gb = None
        else:
            self._gb = (gb, [g._version if g is not None else -1 for g in gb])

    def _after_backward_grads(self) -> None:
        """After it: the parameters whose ``.grad`` is new or was added to (AccumulateGrad
        replaces a missing gradient or adds in place, which bumps the version)."""
        ps = self._arrival_params()
        if self._gb is _SHARED:  # the gradient-flow probe's map of this pass (its parameters are these)
            self._gb = None
            arrived = self.arrival_source.pass_arrived
            if arrived is not None and self.arrival_source.ids == self._arrival_ids:
                if self._got_pass is None and not self._got:  # the step's first pass: kept as it is
                    self._got_pass = (self._arrival_ids, arrived)
                else:
                    self._got.update(map(self._arrival_ids.__getitem__, arrived))
                return
            # unknown to it (it was not told before the pass): those whose .grad is set now
            self._got.update(compress(self._arrival_ids, map(is_not, map(_GRAD, ps), repeat(None))))
            return
        ga = list(map(_GRAD, ps))
        if self._gb is None:  # C-level: the ids of the parameters whose .grad is set now
            self._got.update(compress(self._arrival_ids, map(is_not, ga, repeat(None))))
        else:
            gb, vb = self._gb
            if len(gb) == len(ga):
                self._got.update(id(p) for p, a, b, v in zip(ps, ga, gb, vb)
                                 if a is not None and (a is not b or a._version != v))
        self._gb = None

    def end_step(self, step: int) -> bool:
        """Judge the gradient arrival of step ``step`` (once; at the watched optimizer's step, or
        before it when the soak calls it). Unarmed: merge the steps of confirmed cuts whose
        parameters are still gradless, and set a trigger (arm the next step) for a new gradless
        set. Armed after a trigger: a set still gradless without a cut is confirmed clean.
        Returns True when this (unarmed) step set a trigger."""
        if self._ended == step:
            return False
        self._ended = step
        one, self._got_pass = self._got_pass, None
        if one is not None and not self._got and self._prev_pass is not None and self._got_prev is not None \
                and one[0] is self._prev_pass[0] and one[1] == self._prev_pass[1]:
            got = self._got_prev  # one pass, the same parameters as the last step's one pass
        else:
            if one is not None:
                self._got.update(map(one[0].__getitem__, one[1]))
            got = frozenset(self._got)
        self._prev_pass = one if one is not None and len(got) == len(one[1]) else None
        self._got = set()
        prev, self._prev_saved, self._got_prev = self._got_prev, self._got_prev, got
        if self.armed:
            if self._trigger is not None:  # not consumed by a cut: no cut explains it
                _, lost = self._trigger
                self._trigger = None
                if not (lost & got):  # still gradless, armed, no cut: legitimately unused (an auxiliary head)
                    self._clean_sets.add(lost)
            return False
        for key, (ids, ev) in self._cut_sets.items():  # a confirmed cut goes on: same event, this step
            if ids and not (ids & got):
                self._record({**ev, "step": step, "count": 1, "detail": dict(ev["detail"])}, key)
        if prev is None:
            return False
        lost = prev - got if got is not prev else frozenset()
        if not lost or lost in self._clean_sets or any(lost <= ids for ids, _ in self._cut_sets.values()):
            return False
        self._trigger = (step, lost)
        self.arm("gradient-arrival")
        return True

    def replay(self, step: int) -> None:
        """Arm step ``step`` again, for the soak's replay of it (its gradients are cleared and
        the RNG restored by the caller): this step's gradient arrival is judged anew."""
        self._got, self._gb = set(), None
        self._got_pass = self._prev_pass = None
        if self._ended == step:
            self._got_prev, self._ended = self._prev_saved, 0
        self._arm_next = "replay"

    def _confirmed_cut(self, event: dict, key: tuple, ids: frozenset) -> None:
        """An armed step named a partial cut: when it explains a trigger's gradless set, the
        event carries the trigger's step (the first step without gradients)."""
        trig = self._trigger
        if trig is not None and trig[1] & ids:
            self._trigger = None
            if trig[0] != self._step:
                event["detail"]["named_at_step"] = self._step
                event["step"] = trig[0]
        ev = {**event, "detail": {k: v for k, v in event["detail"].items() if k != "named_at_step"}}
        self._cut_sets[key] = (ids, ev)

    def _count_step(self) -> None:
        if self._stopped_step == self._step:  # counted when it was stopped (hooks.py _stop)
            return
        self.steps += 1
        if self.armed:
            self.armed_steps += 1
            self.arm_reasons[self.armed_reason] = self.arm_reasons.get(self.armed_reason, 0) + 1

    def check_grads_now(self, step: int) -> None:
        """The gradients' NaN/Inf check (OC501) now, whatever ``grad_check_every`` says (the soak
        calls it when ``clip_grad_norm_``'s total norm is not finite)."""
        self._check_grads_finite(self._trainable(), step, force=True)

    # -- OC301 found by PyTorch's own check ----------------------------------------------------
    def backward_failed(self, exc: BaseException, step: int) -> None:
        """``backward()`` raised ``exc``. When it is PyTorch's version-check error (an in-place
        write to a saved tensor, found by PyTorch on an unarmed step, or in a reentrant
        checkpoint's recompute), record the OC301 event with what the message gives and raise
        ``StepStopped`` from it; any other exception: return (the caller re-raises it)."""
        m = pytorch_inplace_error(exc)
        if m is None or self._removed:
            return
        text = str(exc).split("\n", 1)[0]
        shape = [int(s) for s in m["shape"].split(",") if s.strip()]
        event = {"kind": "inplace_on_saved", "step": step, "where": None, "count": 1, "detail": {
            "tensor": {"type": m["type"], "shape": shape, "grad_fn": m["node"],
                       "output_nr": int(m["nr"]) if m["nr"] is not None else None},
            "saved_version": int(m["saved"]), "version": int(m["version"]),
            "saved_by": {"op": None, "module": None, "where": None, "code": None},
            "written": {"detected_at": "backward() (PyTorch's own version check)", "where": None},
            "phase": "before backward", "stopped": True, "pytorch_error": text, "found_by": "pytorch",
            "armed": self.armed}}
        if not self.armed:
            self._merge_replay(event, self._replay_passes())
        self._stop(f"step {step}: {describe_inplace(event)}", event, cause=exc)

    @staticmethod
    def _merge_replay(event: dict, found: dict | None) -> None:
        """PyTorch's error on an unarmed step, completed by the armed re-run of its forward
        (``replay.py``): the re-run's write, when it wrote the tensor PyTorch names (same type
        and shape), gives the writer, the saving op and their lines."""
        d = event["detail"]
        t = d["tensor"]
        if found is None:
            d["rerun"] = "forward: no write seen"
            return
        fd = found["detail"]
        ft = fd.get("tensor") or {}
        if (ft.get("type"), ft.get("shape")) != (t.get("type"), t.get("shape")):
            d["rerun"] = "forward: another write seen"
            d["replay_found"] = {"tensor": ft, "written": fd.get("written")}
            return
        d["rerun"] = "forward"
        d.update(saved_by=fd["saved_by"], written=fd["written"], phase=fd.get("phase"))
        t.update({k: v for k, v in ft.items() if k not in t or t[k] is None})
        for k in ("checkpoint", "parameter"):
            if k in fd:
                d[k] = fd[k]
        event["where"] = found.get("where")
