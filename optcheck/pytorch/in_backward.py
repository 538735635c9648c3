"""Training steps taken inside backward: which backward pass moved the parameters.

A training step is a backward pass that moves parameters, whoever moves them. With
an ordinary optimizer that is ``optimizer.step()`` after ``backward()``
(``optcheck/pytorch/step_hooks.py``). Three contracts move them inside backward
instead, from gradient hooks (``Tensor.register_post_accumulate_grad_hook`` or
``Tensor.register_hook``), and never call a ``step()`` that could be counted:

- PyTorch's recipe "How to save memory by fusing the optimizer step into the
  backward pass" and torchtune's ``optimizer_in_bwd``: one optimizer per parameter,
  ``step()`` + ``zero_grad()`` from its post-accumulate-grad hook
  (``optcheck/pytorch/optimizer_set.py``);
- optimi's ``gradient_release=True``: ``optimizer.step(param=p)`` and
  ``zero_grad(param=p)`` from the hook that ``prepare_for_gradient_release`` adds
  (``optimi/gradientrelease.py``); a ``step()`` after backward, if the loop still
  calls it, finds no gradient and does nothing;
- LOMO and AdaLOMO (``lomo_optim``, pytorch-optimizer's ``LOMO``): the update is
  fused into the hooks (``fused_backward(loss, lr)``), written through ``p.data``,
  no ``step()`` at all.

:class:`BackwardSteps` watches each outermost backward pass (the Monitor's backward
wrappers call :meth:`BackwardSteps.before` and :meth:`BackwardSteps.after`) for
three signs that it moved parameters:

1. a parameter's version counter moved during the pass (an in-place write:
   ``param.addcdiv_``; PyTorch's fused kernels and ``p.data`` writes do not bump it);
2. a ``step()`` over the watched parameters ran inside the pass (a per-parameter
   step; :meth:`StepWatch.on_inner <optcheck.pytorch.step_hooks.StepWatch.on_inner>`);
3. a gradient was released inside the pass: it arrived (``AccumulateGrad``) and
   ``.grad`` was None again when the pass ended.

A pass with any of them is one training step, however many per-parameter steps it
ran, except an accumulation pass: the watched optimizer says it accumulates
(``optimizer_accumulation`` is True: optimi's gradient accumulation into the
optimizer state, where the parameters move only at the last micro-batch), or sign 2
or 3 without sign 1 once sign 1 was seen in an earlier pass of the run (the writes
bump version counters, and none moved). Before the contract is known, only the
smallest and the largest parameter are tracked (two C-level hooks and two version
reads per pass); once a pass is a step (:attr:`BackwardSteps.active`) every
parameter is. The first ``step()`` of the watched optimizer outside backward, with
nothing seen inside one before, settles the ordinary contract: the tracking hooks are
removed (:meth:`BackwardSteps.retire`) and cost nothing from then on.

Known limits (``docs/optimizers.md``): a pass that releases the gradients without
updating (LOMO's ``grad_norm(loss)`` pass before ``fused_backward`` when
``clip_grad_norm`` is set) counts as a step of its own where nothing bumps a
version counter; so does an accumulation pass of a library that neither bumps
version counters nor says ``optimizer_accumulation``.
"""

from __future__ import annotations

import functools
import operator

import torch

from optcheck.pytorch import step_hooks
from optcheck.pytorch.dynamo_safe import EagerHook, compiled_autograd_on

_VERSION = operator.attrgetter("_version")


def _same(hook):
    return hook


def _trackable(p) -> bool:
    return (isinstance(p, torch.Tensor) and p.requires_grad and p.is_leaf and not hasattr(p, "to_local")
            and not isinstance(p, torch.nn.parameter.UninitializedTensorMixin))


def accumulating(optimizer) -> bool:
    """True when ``optimizer`` (or a member of an ``OptimizerSet``) says it accumulates
    gradients into its state instead of stepping (optimi's ``optimizer_accumulation``)."""
    members = getattr(optimizer, "members", None)
    for o in members if isinstance(members, list) else [optimizer]:
        try:
            if getattr(o, "optimizer_accumulation", False) is True:
                return True
        except Exception:  # noqa: BLE001 - a property that raises says nothing
            continue
    return False


class BackwardSteps:
    """Decides, per outermost backward pass, whether it was a training step (module docstring).

    Args:
        optimizer: the watched optimizer (its param-group members are tracked).
        on_active: called once, with no argument, when the first pass is a step (the
            Monitor turns its gradient-flow probe to per-parameter hooks then).
    """

    def __init__(self, optimizer, on_active=None):
        self.optimizer = optimizer
        self.watch = step_hooks.watch(optimizer)  # told when steps are known to be taken in backward
        self.on_active = on_active
        self.active = False  # a pass was a training step: steps are taken in backward
        self.retired = False  # the ordinary contract (step() outside backward): nothing tracked
        self.seen = False  # any sign seen in a pass (then a step() outside backward is no training step)
        self.inner_steps = 0  # per-parameter steps in the pass under way
        self.inner_total = 0
        self.passes = 0  # passes judged a training step
        self._versions_tell = False  # a step-pass moved version counters: the writes bump them
        self._params: list = []
        self._arrived: dict[int, object] = {}  # index -> parameter, gradients accumulated in the pass
        self._handles: list = []
        self._vb: list | None = None
        self._in_pass = False

    # -- tracking -------------------------------------------------------------------
    def _track(self, params: list) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._params = params
        self._arrived.clear()
        # under compiled autograd Dynamo would trace each hook (a graph break apiece): run outside it,
        # traced as nothing (dynamo_safe.py; steps inside a compiled backward are not told apart)
        eager = EagerHook if compiled_autograd_on() else _same
        for i, p in enumerate(params):  # C-level: no Python frame per parameter per pass
            self._handles.append(p.register_post_accumulate_grad_hook(
                eager(functools.partial(operator.setitem, self._arrived, i))))

    def _members(self) -> list:
        seen, out = set(), []
        for g in self.optimizer.param_groups:
            for p in g["params"]:
                if id(p) not in seen and _trackable(p):
                    seen.add(id(p))
                    out.append(p)
        return out

    def _choose(self) -> None:
        """Track every member once active; before, the smallest and the largest."""
        ms = self._members()
        if self.active or len(ms) <= 2:
            want = ms
        else:
            small = min(ms, key=lambda p: p.numel())
            large = max(ms, key=lambda p: p.numel())
            want = [small] if small is large else [small, large]
        if len(want) != len(self._params) or any(a is not b for a, b in zip(want, self._params)):
            self._track(want)

    def adopt(self, optimizer) -> None:
        """The watched optimizer changed (a swap): track its members."""
        self.optimizer = optimizer
        if not self.retired:
            self._params = []  # chosen again at the next pass

    # -- the pass -------------------------------------------------------------------
    def inner(self, optimizer, args, kwargs) -> None:
        """A ``step()`` over the watched parameters began inside a backward pass."""
        self.inner_steps += 1
        self.inner_total += 1

    def before(self) -> None:
        """Before an outermost backward pass."""
        if self.retired:
            return
        if not self._params:
            self._choose()
        self._in_pass = True
        self.inner_steps = 0
        self._arrived.clear()
        self._vb = list(map(_VERSION, self._params))

    def after(self) -> bool:
        """After it: True when the pass was a training step."""
        if self.retired or not self._in_pass:
            return False
        self._in_pass = False
        ps, vb = self._params, self._vb
        self._vb = None
        moved = vb is not None and len(vb) == len(ps) and any(map(operator.ne, map(_VERSION, ps), vb))
        released = any(ps[i].grad is None for i in self._arrived if i < len(ps))
        stepped = self.inner_steps > 0
        if not (moved or released or stepped):
            return False
        if not self.seen:
            self.seen = True
            self.watch.in_backward = True  # a step() outside backward is no training step from now on
        if accumulating(self.optimizer):
            return False
        if moved:
            self._versions_tell = True
        elif self._versions_tell:
            return False  # per-parameter steps that wrote nothing: accumulation
        if not self.active:
            self.active = True
            self._choose()  # every member from now on
            if self.on_active is not None:
                self.on_active()
        self.passes += 1
        return True

    def retire(self) -> None:
        """The watched optimizer stepped outside backward with nothing seen inside one:
        the ordinary contract. Stop tracking (no cost from now on)."""
        if self.active or self.seen or self.retired:
            return
        self.retired = True
        self.remove()

    def remove(self) -> None:
        if self.seen:
            self.watch.in_backward = False
        for h in self._handles:
            h.remove()
        self._handles = []
        self._params = []
