"""Which ``step()`` calls are the training step: the one place that decides "this is
the outermost ``step()`` of the watched optimizer" (:class:`StepWatch`), for the
Monitor, its probes and the soak's.

Two sources of step hooks are used (``torch/optim/optimizer.py``,
``Optimizer.profile_hook_step``: the wrapper torch patches onto each optimizer class
at its first instance runs the global pre hooks, then the optimizer's own; after the
step its own post hooks, then the global ones):

- the watched optimizer's own hooks (``register_step_pre_hook``; also on
  ``optcheck.pytorch.unwrap.DuckOptimizer``, which torch's global hooks never see);
- with :meth:`StepWatch.follow`, the global hooks
  (``torch.optim.optimizer.register_optimizer_step_pre_hook``), for other optimizers
  over the watched parameters.

Nested steps. A ``step()`` that starts while another watched step is under way is
part of it and passed over: an optimizer whose ``step`` calls ``super().step()`` of a
class also instantiated in the process (pytorch-optimizer's ``MuonClip`` over
``Muon``: torch's wrapper runs the hooks twice, the inner pair nested), SAM's
``step(closure)`` calling its base optimizer, Lookahead's inner step. The pre hook
remembers the frame that called it (torch's wrapper); a pre hook called while that
frame is still on the stack is nested, a post hook called from another frame ends a
nested step. A ``step()`` that raised leaves its frame behind; the next step sees that
frame is no longer on the stack and starts afresh.

Following (:meth:`StepWatch.follow`). Another optimizer's outermost ``step()`` whose
param groups hold a watched parameter is a training step too:

- a two-step optimizer (pytorch-optimizer's SAM, GSAM, ASAM, WSAM: ``second_step()``
  calls ``base_optimizer.step()`` over the same ``param_groups`` list) moves the
  parameters without calling the watched object's ``step()``: its steps are
  followed, the watched optimizer stays;
- an optimizer swapped in mid-run (AdamW, then SGD over ``model.parameters()``,
  its own ``param_groups``) becomes the watched optimizer at its first step:
  ``on_switch(new, old)`` is called before that step's pre hooks, and its hooks are
  registered in place of the old one's. Should the old one step again (two
  optimizers used in turn, not a swap), it is watched again
  (``on_switch(old, new)``) and no switch happens from then on;
- an optimizer whose ``step()`` turns out to call the watched one's (a wrapper that
  is an ``Optimizer`` subclass) is passed over from then on (a switch made at its
  first step is undone).

Steps inside backward (:meth:`StepWatch.on_inner`). A ``step()`` that starts while
the autograd engine runs a backward pass (``torch._C._current_graph_task_id()`` is not
-1: it was called from a gradient hook) is a per-parameter step of an optimizer
stepped in backward (PyTorch's optimizer-in-backward recipe, torchtune's
``optimizer_in_bwd``, optimi's ``gradient_release``: ``step(param=p)`` from a
post-accumulate-grad hook), any number per backward pass. Whether the watched
optimizer's own or another one over the watched parameters, it is no training step
and no swap: the ``inner`` subscribers are told of it, and the backward pass it ran in
is what :mod:`optcheck.pytorch.in_backward` judges. A member of an
:class:`~optcheck.pytorch.optimizer_set.OptimizerSet` stepped outside backward is
passed over (neither a training step nor a swap); so is every ``step()`` outside
backward once the steps are known to be taken inside it (:attr:`StepWatch.in_backward`:
optimi's ``step()`` after a backward that already stepped each parameter is a no-op).

Cost per training step: four Python calls (two hooks of each kind) and one
``sys._getframe`` in each, plus one call per subscriber; a scan of another
optimizer's param groups the first time it steps (cached by ``id``; rescanned when
its groups' sizes change).
"""

from __future__ import annotations

import sys
import weakref
from typing import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from optcheck.pytorch.dynamo_safe import EagerHook, caller_outside

Hook = Callable  # f(optimizer, args, kwargs) -> None

#: id(optimizer) -> its StepWatch (one per watched optimizer, shared by every subscriber)
_WATCHES: "weakref.WeakValueDictionary[int, StepWatch]" = weakref.WeakValueDictionary()


_graph_task_id = torch._C._current_graph_task_id


def in_backward() -> bool:
    """True while the autograd engine runs a backward pass on this thread (in a hook)."""
    return _graph_task_id() != -1


def _on_stack(frame, caller) -> bool:
    """True when ``frame`` is ``caller`` or one of its callers."""
    f = caller
    while f is not None:
        if f is frame:
            return True
        f = f.f_back
    return False


class _Subscription:
    __slots__ = ("watch", "pair")

    def __init__(self, watch: "StepWatch", pair: tuple):
        self.watch, self.pair = watch, pair

    def remove(self) -> None:
        self.watch._unsubscribe(self.pair)


class _Following:
    """What :meth:`StepWatch.follow` returns: ``remove()`` stops this follower's
    following (the global hooks go with the last follower); ``stepping`` as the watch's."""

    __slots__ = ("watch", "on_switch")

    def __init__(self, watch: "StepWatch", on_switch: Callable):
        self.watch, self.on_switch = watch, on_switch

    @property
    def stepping(self) -> bool:
        return self.watch._stepping is not None  # (the watch's stepping, one frame less: read every backward)

    def remove(self) -> None:
        self.watch._unfollow(self.on_switch)


class StepWatch:
    """The outermost ``step()`` calls of one watched optimizer (module docstring);
    subscribers' ``pre(optimizer, args, kwargs)`` / ``post(...)`` are called once per
    training step, in the order they subscribed. Get one with :func:`watch`."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._pre: list[Hook] = []
        self._post: list[Hook] = []
        self._pairs: list[tuple] = []
        self._own: list = []  # the watched optimizer's own hook handles
        self._global: list = []  # the global hook handles while following
        self._stepping = None  # the optimizer whose outermost step() is under way
        self._frame = None  # the frame that called its pre hooks (torch's step wrapper)
        self._known: dict[int, tuple] = {}  # id(optimizer) -> (group sizes, steps watched parameters)
        self._wrappers: set[int] = set()  # ids of optimizers whose step() calls the watched one's
        self._retired: set[int] = set()  # ids of optimizers switched away from
        self._switched_from = None  # the optimizer switched away from at the step under way
        self._may_switch = True
        self._followers: list[Callable] = []  # on_switch(new, old) of each follower (a Monitor each)
        self._inner: list[Hook] = []  # told of each step() inside a backward pass
        #: the training steps are taken inside backward (optcheck/pytorch/in_backward.py): a step() outside
        #: backward (optimi's, after a backward that already stepped each parameter) is passed over
        self.in_backward = False
        #: post hooks run eagerly whose pre hooks did not: a step() compiled by Dynamo past a graph break
        #: (optcheck/pytorch/dynamo_safe.py HiddenSteps reads it)
        self.unpaired = 0
        self._hook_own()

    # -- subscribers -------------------------------------------------------------
    def subscribe(self, pre: Hook | None, post: Hook | None) -> _Subscription:
        pair = (pre, post)
        self._pairs.append(pair)
        self._rebuild()
        return _Subscription(self, pair)

    def _unsubscribe(self, pair: tuple) -> None:
        if pair[0] == "inner":
            if pair[1] in self._inner:
                self._inner.remove(pair[1])
            self._unhook_global_if_idle()
            return
        if pair in self._pairs:
            self._pairs.remove(pair)
            self._rebuild()
        if not self._pairs and not self._followers and not self._inner:
            self.close()

    def _rebuild(self) -> None:
        self._pre = [p for p, _ in self._pairs if p is not None]
        self._post = [q for _, q in self._pairs if q is not None]

    @property
    def stepping(self) -> bool:
        """True inside the training step (its outermost ``step()`` call)."""
        return self._stepping is not None

    def on_inner(self, hook: Hook) -> _Subscription:
        """``hook(optimizer, args, kwargs)`` for each ``step()`` over the watched parameters
        that starts inside a backward pass (module docstring); the global step hooks are
        installed for it. Returns a handle whose ``remove()`` stops it."""
        self._inner.append(hook)
        self._hook_global()
        return _Subscription(self, ("inner", hook))

    # -- following -----------------------------------------------------------------
    def follow(self, on_switch: Callable) -> _Following:
        """Follow other optimizers over the watched parameters (module docstring);
        ``on_switch(new, old)`` is called when the watched optimizer changes. Returns a
        handle whose ``remove()`` stops it (following ends with the last follower)."""
        self._followers.append(on_switch)
        self._hook_global()
        return _Following(self, on_switch)

    def _hook_global(self) -> None:
        if not self._global:
            self._global = [register_optimizer_step_pre_hook(EagerHook(self._global_pre)),
                            register_optimizer_step_post_hook(EagerHook(self._global_post))]

    def _unhook_global_if_idle(self) -> None:
        if self._followers or self._inner:
            return
        for h in self._global:
            h.remove()
        self._global = []
        if not self._pairs:
            self.close()

    def _unfollow(self, on_switch: Callable) -> None:
        if on_switch in self._followers:
            self._followers.remove(on_switch)
        self._unhook_global_if_idle()

    def close(self) -> None:
        for h in self._own + self._global:
            h.remove()
        self._own, self._global = [], []
        if _WATCHES.get(id(self.optimizer)) is self:
            del _WATCHES[id(self.optimizer)]

    def _hook_own(self) -> None:
        for h in self._own:
            h.remove()
        opt = self.optimizer
        # run eagerly outside Dynamo, traced as nothing inside a compiled step (optcheck/pytorch/dynamo_safe.py)
        self._own = [opt.register_step_pre_hook(EagerHook(self._own_pre)),
                     opt.register_step_post_hook(EagerHook(self._own_post))]

    def _moves_watched(self, opt) -> bool:
        groups = getattr(opt, "param_groups", None) or []
        sizes = tuple(len(g.get("params", ())) for g in groups)
        known = self._known.get(id(opt))
        if known is None or known[0] != sizes:
            watched = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
            known = self._known[id(opt)] = (sizes, any(id(p) in watched for g in groups for p in g["params"]))
        return known[1]

    def _member(self, opt) -> bool:
        """``opt`` is a member of the watched :class:`OptimizerSet` (stepped outside backward: passed over)."""
        holds = getattr(self.optimizer, "holds", None)
        return holds is not None and holds(opt)

    def _switch(self, new) -> None:
        old = self.optimizer
        if _WATCHES.get(id(old)) is self:
            del _WATCHES[id(old)]
        self.optimizer = new
        _WATCHES[id(new)] = self
        self._known.clear()
        self._retired.discard(id(new))
        self._retired.add(id(old))
        self._hook_own()
        for on_switch in list(self._followers):
            on_switch(new, old)

    # -- the hooks -------------------------------------------------------------------
    def _nested(self, opt, caller) -> bool:
        """A pre hook from ``caller``: part of the step under way (True), or not (the
        frame of a step that raised is forgotten)."""
        if self._frame is None:
            return False
        if caller is self._frame or _on_stack(self._frame, caller):
            if opt is self._switched_from:  # the swapped-in "optimizer" calls the old one's step: a wrapper
                self._wrappers.add(id(self._stepping))
                self._may_switch_back(opt)
            elif opt is self.optimizer and self._stepping is not opt:
                self._wrappers.add(id(self._stepping))
            return True
        self._stepping = self._frame = self._switched_from = None  # that step raised
        return False

    def _may_switch_back(self, old) -> None:
        self._switched_from = None
        self._retired.discard(id(old))
        self._switch(old)
        self._retired.discard(id(self._stepping))

    def _start(self, opt, caller, args, kwargs) -> None:
        self._stepping, self._frame = opt, caller
        for h in self._pre:
            h(opt, args, kwargs)

    def _end(self, opt, args, kwargs) -> None:
        self._stepping = self._frame = self._switched_from = None
        for h in self._post:
            h(opt, args, kwargs)

    def hidden_pre(self) -> None:
        """Stand-in for the pre hooks of a ``step()`` about to run where they cannot (inside a
        compiled region, ``optcheck/pytorch/dynamo_safe.py``): each subscriber's, now."""
        for h in self._pre:
            h(self.optimizer, (), {})

    def hidden_post(self) -> None:
        """Stand-in for the post hooks of a ``step()`` that ran where they could not."""
        for h in self._post:
            h(self.optimizer, (), {})

    def _inner_step(self, opt, args, kwargs) -> None:
        for h in self._inner:
            h(opt, args, kwargs)

    def _own_pre(self, opt, args, kwargs) -> None:
        caller = caller_outside(sys._getframe(1))
        if self._frame is not None and self._nested(opt, caller):
            return
        if _graph_task_id() != -1:  # from a gradient hook: a per-parameter step in backward
            if not self._global:  # (else the global hook, run before this one, told them)
                self._inner_step(opt, args, kwargs)
            return
        if not self.in_backward:
            self._start(opt, caller, args, kwargs)

    def _own_post(self, opt, args, kwargs) -> None:
        caller = caller_outside(sys._getframe(1))
        if caller is self._frame:
            if caller is None and _graph_task_id() == -1:  # no pre hook ran: it was traced (a compiled step)
                self.unpaired += 1
            else:
                self._end(opt, args, kwargs)

    def _global_pre(self, opt, args, kwargs) -> None:
        caller = caller_outside(sys._getframe(1))
        if opt is not self.optimizer and self._nested(opt, caller):
            return
        if _graph_task_id() != -1:  # from a gradient hook: a per-parameter step in backward
            if opt is self.optimizer or (id(opt) not in self._wrappers and self._moves_watched(opt)):
                self._inner_step(opt, args, kwargs)
            return
        if opt is self.optimizer:
            return  # (its own hooks, after these, decide)
        if id(opt) in self._wrappers or not self._moves_watched(opt) or self._member(opt):
            return
        if not self._followers or self.in_backward:
            return
        if self._may_switch and opt.param_groups is not self.optimizer.param_groups:  # not SAM's base: a swap
            if id(opt) in self._retired:  # two optimizers in turn: watch this one again, switch no more
                self._may_switch = False
                self._switch(opt)
            else:
                self._switched_from = self.optimizer
                self._switch(opt)
        self._start(opt, caller, args, kwargs)

    def _global_post(self, opt, args, kwargs) -> None:
        if caller_outside(sys._getframe(1)) is self._frame and opt is self._stepping:
            self._end(opt, args, kwargs)


def watch(optimizer) -> StepWatch:
    """The :class:`StepWatch` of ``optimizer`` (made at the first call; shared)."""
    w = _WATCHES.get(id(optimizer))
    if w is None or w.optimizer is not optimizer:
        w = _WATCHES[id(optimizer)] = StepWatch(optimizer)
    return w


def register(optimizer, pre=None, post=None, wrap: Callable | None = None) -> list:
    """Register ``pre(optimizer, args, kwargs)`` and ``post(...)`` (either may be None),
    called once per training step of ``optimizer`` (the outermost ``step()``; the
    optimizer it is switched to when followed); returns the handles (``remove()`` each).
    ``wrap(hook)``: what is subscribed in place of each of them (``optcheck.Monitor``
    times a probe's step hooks as its own and turns an error in one into a note)."""
    if wrap is not None:
        pre, post = (None if h is None else wrap(h) for h in (pre, post))
    return [watch(optimizer).subscribe(pre, post)]
