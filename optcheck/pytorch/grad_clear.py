"""Gradient flow between optimizer steps (the probe behind OC204, OC207, OC208).

Which parameters received a fresh gradient since the last ``optimizer.step()``
is recorded by a post-accumulate-grad hook on each of the optimizer's
parameters (``Tensor.register_post_accumulate_grad_hook``, torch >= 2.1: called
with the parameter right after autograd's ``AccumulateGrad`` wrote ``.grad``).
That hook is ``functools.partial(operator.setitem, fresh, i)``: a C-level
callable that sets ``fresh[i] = param`` without running a Python frame: 1.0–1.3 µs
per parameter per ``backward()``, almost all of it PyTorch calling into Python at
all, against 2.5 µs for the Python closure per parameter it replaced (CPU time,
``backward()`` over 200 small leaves with and without the probe, 1 thread, this
project's 2-core machine). The dict holds one entry per parameter however many
``backward()`` calls come without a step. Only
the smallest parameter also has a Python tensor hook (``Tensor.register_hook``:
called with the incoming gradient *before* it is accumulated), for OC204.
Optimizer step pre/post hooks (torch >= 2.0) look at the record once per step:

- ``grad_not_cleared`` (OC204): the first gradient after a step found ``.grad``
  still holding the previous step's (no ``zero_grad()``), and no later gradient
  before the next step found it cleared. Checked on the smallest parameter: one
  ``any()`` over a bias-sized tensor per ``backward()`` until it is settled. The
  second condition keeps GAN loops silent when the discriminator is watched: the
  generator's ``backward()`` flows through D right after ``optimizerD.step()``,
  and ``netD.zero_grad()`` clears that before D's own ``backward()`` (the PyTorch
  DCGAN tutorial's order).
- ``grad_cleared_before_step`` (OC207): gradients flowed in, but by
  ``optimizer.step()`` every parameter that got one has ``.grad`` None or all
  zero (the smallest is looked at first; the others only when it is zero):
  ``zero_grad()`` ran between ``backward()`` and ``step()``.
- ``stale_grad_step`` (OC208): ``optimizer.step()`` ran although no gradient
  was accumulated since the previous step while ``.grad`` is set, and the
  smallest parameter's ``.grad`` is still the very tensor it held after that
  step: the same gradients are applied twice (``step()`` called twice, or
  ``backward()`` skipped). A ``.grad`` replaced by a new tensor (gradients from
  ``torch.autograd.grad`` assigned by hand, which ``AccumulateGrad`` never
  sees) is a fresh gradient, not a stale one.

With ``per_backward=True`` (``optcheck.Monitor``, whose ``backward`` wrappers call
:meth:`GradClearProbe.before_backward` / :meth:`GradClearProbe.after_backward`
around each outermost backward pass) no per-parameter hook is registered: a
parameter got a fresh gradient when its ``.grad`` is a new tensor after the pass,
or the same tensor with a moved version counter (``AccumulateGrad`` replaces a
missing gradient or adds in place). Two C-level maps over the parameters per pass
instead of one hook call per parameter (issue 25: 6 parameters, a tiny MLP,
60 µs a step less; ``docs/guide/cost.md``). A gradient that reaches the smallest
parameter outside such a pass (a ``backward`` imported by name before the Monitor,
a second Monitor's loop) makes that step's arrival unknown: no OC207/OC208 check
and no ``grad_arrived`` for it (the rules fall back to ``.grad``).

Gradient accumulation over micro-batches and closures (LBFGS) stay silent. No
host sync per step (docs/gpu.md): the two ``any()`` checks are made on the device and
read at the driver's next snapshot or metrics batch (``optcheck.pytorch.deferred``),
the event dated at the step they were made at; OC207 looks at the smallest and the
largest parameter that got a gradient (both all zero: cleared), and with
``zero_grad(set_to_none=True)`` at none (``.grad`` is None: no device value at all).
Cost per optimizer step: a dict look-up, two or three small ``any()`` kernels and
a weak reference (a few µs). An event is recorded at its first occurrence
(``step``); from then on ``count`` is the number of optimizer steps at which it
happened and ``detail["steps"]`` the number of optimizer steps checked since
(both counting the first). Every later :meth:`drain` hands the event again with
its running numbers, so each snapshot carries them; only a new kind makes
:meth:`has_events` true (the immediate snapshot).
"""

from __future__ import annotations

import functools
import operator
import weakref
from itertools import compress, repeat

import torch

from optcheck.pytorch.deferred import DeviceLedger
from optcheck.pytorch.dynamo_safe import EagerHook
from optcheck.pytorch import step_hooks
from optcheck.pytorch.unwrap import ZeroOptimizer


_GRAD = operator.attrgetter("grad")


def _uninitialized(p: torch.Tensor) -> bool:
    """An ``UninitializedParameter`` (a lazy module's, before its first forward)."""
    return isinstance(p, torch.nn.parameter.UninitializedTensorMixin)


class GradClearProbe:
    """Records gradient-flow events for ``optimizer``'s parameters (see module docstring).

    Args:
        optimizer: the optimizer whose ``step()`` delimits training steps.
        ledger: where the device checks wait for the driver's next read (default: one of its own).
        per_backward: arrival from :meth:`before_backward` / :meth:`after_backward` (module docstring).
        hook_wrap: ``hook_wrap(hook)`` is registered in place of each step hook
            (``optcheck.pytorch.step_hooks.register``'s ``wrap``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, ledger: DeviceLedger | None = None,
                 per_backward: bool = False, hook_wrap=None):
        self.ledger = ledger if ledger is not None else DeviceLedger()
        self._per_backward = per_backward  # arrival from before/after_backward, no per-parameter hook
        self._gb: tuple | None = None  # (.grad of each parameter, their versions) before the pass under way
        # indices (into the watched parameters) that got a gradient in the last pass, None when unknown
        # (not per pass, or not told before it): the hazard probes' gradient arrival reads it (shared pass)
        self.pass_arrived: list[int] | None = None
        self.ids: tuple = ()  # id of each watched parameter, in order
        self._in_pass = False
        self._bypassed = False  # a gradient arrived outside a pass this probe was told of: arrival unknown
        self.events: list[dict] = []  # kinds first seen since the last drain()
        self._by_kind: dict[str, dict] = {}  # every kind seen, with running numbers
        self._fresh: dict[int, torch.Tensor] = {}  # index -> parameter, for each accumulated into since the last step
        self._first = False  # the first gradient after a step is still to come
        self._stale = None  # device flag: that first gradient found .grad holding the previous step's,
        # and every later one of the step too (None: not held, or cleared since)
        self._steps = 0
        self._after: weakref.ref | None = None  # the smallest parameter's .grad right after the last step
        self._arrived: list[int] = []  # indices accumulated into between the last two steps (arrived_ids)
        self._handles = []
        self._small_handle = None
        self._small_i = self._large_i = self._small = None  # none watched yet (FSDP2: every member a DTensor)
        self._in_bwd = False  # steps are taken inside backward: the Monitor ends them (step_ended)
        # (small .grad, its version, large .grad, its version, clip total or None) as the last backward
        # pass left them (or clip_grad_norm_ after it): OC207's check without a kernel when untouched since
        self._seen: tuple | None = None
        # DeepSpeed ZeRO moves each gradient out of .grad into its partitions during backward (a reduce
        # and .grad = None): .grad says nothing at step(), so OC207's check is off (zero.py: not_checked)
        self._moved = isinstance(optimizer, ZeroOptimizer)
        members = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad and p.is_leaf
                   and not hasattr(p, "to_local")]  # FSDP2 DTensor: reduce-scatter writes .grad, no tensor hook runs (docs/distributed.md)
        # nn.LazyLinear & co. before their first forward: no shape, no hooks yet; they materialise in
        # place (same object) at the first forward, and are adopted then (:meth:`adopt_materialized`)
        self._pending = [p for p in members if _uninitialized(p)]
        self._params: list[torch.Tensor] = []
        self._add([p for p in members if not _uninitialized(p)])
        self._handles += step_hooks.register(optimizer, self._before_step, self._after_step, wrap=hook_wrap)

    def _add(self, params: list) -> None:
        """Hook ``params`` (materialised leaves), and watch the smallest of all for OC204."""
        if not params:
            return
        start = len(self._params)
        self._params.extend(params)
        self.ids = tuple(map(id, self._params))
        for i, p in enumerate(params, start):  # C-level: no Python frame per parameter per backward()
            if not self._per_backward:
                self._handles.append(p.register_post_accumulate_grad_hook(functools.partial(operator.setitem,
                                                                                            self._fresh, i)))
        self._large_i = max(range(len(self._params)), key=lambda i: self._params[i].numel())
        small_i = min(range(len(self._params)), key=lambda i: self._params[i].numel())
        if self._small_handle is None or small_i != self._small_i:
            if self._small_handle is not None:
                self._small_handle.remove()
            self._small_i, self._small = small_i, self._params[small_i]
            # run outside Dynamo, traced as nothing (compiled autograd traces backward(): dynamo_safe.py)
            self._small_handle = self._small.register_hook(EagerHook(self._small_hook))
            self._handles.append(self._small_handle)

    def adopt(self, optimizer) -> None:
        """Watch the param-group members of ``optimizer`` not watched yet (an optimizer
        swapped in mid-run over new parameters as well: ``optcheck/pytorch/step_hooks.py``);
        those already watched keep their hooks."""
        have = set(map(id, self._params)) | set(map(id, self._pending))
        new = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in have and p.requires_grad
               and p.is_leaf and not hasattr(p, "to_local")]
        self._pending += [p for p in new if _uninitialized(p)]
        self._add([p for p in new if not _uninitialized(p)])

    def adopt_materialized(self) -> None:
        """Hook the lazy parameters that have materialised since (call before a backward
        pass: a lazy module materialises in its first forward). A no-op when none is
        pending."""
        if self._pending:
            ready = [p for p in self._pending if not _uninitialized(p)]
            if ready:
                self._pending = [p for p in self._pending if _uninitialized(p)]
                self._add(ready)

    @property
    def per_pass(self) -> bool:
        """Arrival is read around each backward pass (:meth:`before_backward` /
        :meth:`after_backward`), and :attr:`pass_arrived` says which parameters got a gradient."""
        return self._per_backward

    def before_backward(self) -> None:
        """Before an outermost backward pass: the lazy parameters materialised since are adopted
        (:meth:`adopt_materialized`); with ``per_backward``, each parameter's ``.grad`` and its
        version counter."""
        if self._pending:  # lazy modules materialise in their first forward: adopt them first
            self.adopt_materialized()
        if not self._per_backward:
            return
        self._in_pass = True
        self.pass_arrived = None
        gb = list(map(_GRAD, self._params))
        self._gb = (gb, None if not any(map(operator.is_not, gb, repeat(None)))
                    else [g._version if g is not None else -1 for g in gb])

    def after_backward(self) -> bool | None:
        """After it: the parameters whose ``.grad`` is new or was added to are fresh. Returns
        whether the pass reached any of them (a Monitor takes the pass's loss as its step's only
        then: another optimizer's loss is not this one's), None when it cannot tell."""
        self.pass_arrived = None
        if not self._per_backward:
            return None
        self._in_pass = False
        before, self._gb = self._gb, None
        ps = self._params
        ga = list(map(_GRAD, ps))
        self._seen = None
        if before is None or len(before[0]) != len(ga):  # not told before the pass (or parameters adopted in it)
            self._bypassed = True
            return None
        gb, vb = before
        if vb is None:  # no gradient before the pass (zero_grad(set_to_none=True)): those set now
            new = list(compress(range(len(ga)), map(operator.is_not, ga, repeat(None))))
        else:  # a new .grad tensor, or the same one added to (its version moved)
            new = [i for i, a, b, v in zip(range(len(ga)), ga, gb, vb)
                   if a is not None and (a is not b or a._version != v)]
        self._fresh.update(zip(new, map(ps.__getitem__, new)))  # (C-level: no frame per parameter)
        self.pass_arrived = new
        reached = bool(new)
        if not ps:  # nothing watched (every member a DTensor, or lazy still): reached is unknown
            return None
        gs, gl = ga[self._small_i], ga[self._large_i]
        if gs is not None and gl is not None:
            self._seen = (gs, gs._version, gl, gl._version, None)
        return reached

    def clipped(self, ids, total) -> None:
        """``clip_grad_norm_`` over the parameters whose ``id`` is in ``ids`` returned ``total`` (``optcheck.pytorch.monitor_hooks.ClipNorm``):
        it scaled the gradients in place (their versions move). When it covered the smallest
        and the largest parameter and their ``.grad`` are the tensors the last backward pass
        left, OC207's check before the step reads ``total`` (0: every gradient zero, cleared
        before the clip) instead of the gradients."""
        seen = self._seen
        if seen is None or not isinstance(total, torch.Tensor) or total.numel() != 1:
            return
        gs, gl = self._params[self._small_i].grad, self._params[self._large_i].grad
        if gs is seen[0] and gl is seen[2] and id(self._params[self._small_i]) in ids \
                and id(self._params[self._large_i]) in ids:
            self._seen = (gs, gs._version, gl, gl._version, total)
        else:
            self._seen = None

    def _small_hook(self, grad: torch.Tensor) -> None:
        """The smallest parameter's tensor hook, before its gradient is accumulated (OC204)."""
        if self._per_backward and not self._in_pass:
            self._bypassed = True
        if self._first or self._stale is not None:
            g = self._small.grad
            held = g.detach().any() if g is not None else None  # on the device: read at the ledger's read
            if self._first:
                self._first, self._stale = False, held
            elif held is None:  # cleared after a backward() meant for another optimizer
                self._stale = None
            else:
                self._stale = self._stale & held
        return None

    def steps_in_backward(self) -> None:
        """The training step is a backward pass that moves the parameters
        (``optcheck/pytorch/in_backward.py``): gradients are released inside it, so
        arrival is recorded by a post-accumulate-grad hook on every parameter (as
        without ``per_backward``), OC207's check (gradients gone by ``step()``: the
        design here) is not made, and the step ends when :meth:`step_ended` is called."""
        if self._in_bwd:
            return
        self._in_bwd = True
        if self._per_backward:
            self._per_backward = False
            self._gb, self._in_pass = None, False
            for i, p in enumerate(self._params):
                self._handles.append(p.register_post_accumulate_grad_hook(functools.partial(operator.setitem,
                                                                                            self._fresh, i)))

    def step_ended(self) -> None:
        """A training step taken inside backward ended (:meth:`steps_in_backward`)."""
        self._end_step()

    def _before_step(self, optimizer, args, kwargs) -> None:
        if self._in_bwd:
            return
        if self._pending:
            self.adopt_materialized()
        if not self._fresh or self._bypassed or self._moved:
            return
        # (torch's step wrapper hands the hooks step's whole args: the optimizer, then the closure)
        if any(map(callable, args or ())) or callable((kwargs or {}).get("closure")):
            # step(closure): the step's gradients arrive inside it, from the closure's backward (a
            # wrapper such as heavyball's SAMWrapper zeroes them before calling it); what .grad
            # holds now says nothing about what the step will write
            return
        step = self._steps + 1
        seen, self._seen = self._seen, None
        if seen is not None and self._small_i in self._fresh and self._large_i in self._fresh:
            gs, gl = self._params[self._small_i].grad, self._params[self._large_i].grad
            if gs is seen[0] and gl is seen[2] and gs._version == seen[1] and gl._version == seen[3]:
                # untouched since the backward pass wrote them (or since clip_grad_norm_ scaled them):
                # not cleared in between; after a clip, cleared iff its total is 0 (read later, no kernel)
                if seen[4] is not None:
                    self.ledger.add(seen[4], lambda v, step=step, n=len(self._fresh): v[0] != 0 or self._record(
                        "grad_cleared_before_step", step=step, params=n))
                return
        fresh = list(self._fresh.values())
        held = [p.grad for p in fresh if p.grad is not None]
        if not held:  # zero_grad(set_to_none=True) between backward() and step(): no device read
            self._record("grad_cleared_before_step", step=step, params=len(fresh))
            return
        # the smallest and the largest that got one (a dead-ReLU bias alone is 0): both zero = cleared
        small = self._small.grad if self._small_i in self._fresh and self._small.grad is not None else held[0]
        big = self._params[self._large_i]
        large = big.grad if self._large_i in self._fresh and big.grad is not None else held[-1]
        flag = small.detach().any() if large is small else small.detach().any() | large.detach().any()
        self.ledger.add(flag, lambda v, step=step, n=len(fresh): v[0] or self._record(
            "grad_cleared_before_step", step=step, params=n))

    def _after_step(self, optimizer, args, kwargs) -> None:
        if not self._in_bwd:
            self._end_step()

    def _end_step(self) -> None:
        if not self._params:
            return
        if self._stale is not None:
            self.ledger.add(self._stale, lambda v, step=self._steps + 1, shape=list(self._small.shape): v[0] and
                            self._record("grad_not_cleared", step=step, shape=shape))
        g = self._small.grad
        bypassed, self._bypassed = self._bypassed, False
        if not self._fresh and not bypassed and self._steps > 0 and g is not None and self._after is not None \
                and self._after() is g:
            self._record("stale_grad_step")
        self._after = weakref.ref(g) if g is not None else None
        self._arrived = None if bypassed else list(self._fresh)
        self._fresh.clear()  # cleared in place: the hooks hold this dict
        self._first, self._stale = True, None
        self._steps += 1
        for ev in self._by_kind.values():  # one more optimizer step checked for every kind seen
            ev["detail"]["steps"] += 1

    def arrival(self) -> tuple[set[int], set[int]]:
        """``(watched, arrived)``: the ``id`` of every parameter these hooks watch, and of
        those a gradient was accumulated into (``AccumulateGrad``) between the last two
        optimizer steps. The snapshot's ``grad_arrived`` (OC202): optimizers that consume
        ``.grad`` inside ``step()`` and set it to None (heavyball) leave nothing to see
        after the step, yet their parameters got a gradient."""
        if self._arrived is None:  # unknown at the last step (a gradient arrived outside a watched pass)
            return set(), set()
        return set(map(id, self._params)), {id(self._params[i]) for i in self._arrived}

    def _record(self, kind: str, step: int | None = None, **detail) -> None:
        """An occurrence of ``kind`` at ``step`` (default: the step running now); read
        later (deferred), it counts the steps checked since it as well."""
        step = self._steps + 1 if step is None else step
        ev = self._by_kind.get(kind)
        if ev is None:
            ev = self._by_kind[kind] = {"kind": kind, "step": step, "where": None, "count": 1,
                                        "detail": {**detail, "steps": max(0, self._steps + 1 - step)}}
            self.events.append(ev)
        else:
            ev["count"] += 1

    def has_events(self) -> bool:
        """True when a kind not seen before was recorded since the last :meth:`drain`."""
        return bool(self.events)

    def drain(self) -> list[dict]:
        """Every event seen so far, as copies with their running ``count`` and ``detail["steps"]``
        (the device checks still pending are read first)."""
        self.ledger.read()
        self.events = []
        return [{**ev, "detail": dict(ev["detail"])} for ev in self._by_kind.values()]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
