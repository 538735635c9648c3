"""The ``torch.optim.Optimizer`` and ``nn.Module`` inside the wrappers users hold.

Training frameworks hand the user a wrapper, not the optimizer itself; each keeps
the real one in ``.optimizer`` and forwards ``step()`` to it, so hooks registered
on the inner optimizer see every step the wrapper really takes:

- accelerate's ``AcceleratedOptimizer`` (``accelerate/optimizer.py``; what a
  Hugging Face ``Trainer`` and ``accelerator.prepare`` return). Under gradient
  accumulation its ``step()`` skips the inner step until gradients are synced, so
  steps are counted as the optimizer really takes them.
- Lightning's ``LightningOptimizer`` (``lightning/pytorch/core/optimizer.py``;
  ``self.optimizers()`` in a LightningModule) and Fabric's ``_FabricOptimizer``.
- anything else holding an optimizer under ``.optimizer``, ``.base_optimizer``,
  ``.base``, ``.wrapped_optimizer`` or ``.optim`` (:data:`INNER`): pytorch-optimizer's
  ``Lookahead``/``TRAC``/``OrthoGrad`` and ``SAM``/``GSAM``/``WSAM``, schedule-free's
  ``ScheduleFreeWrapper``, heavyball's ``SAMWrapper`` (``docs/optimizers.md``);
- an object that is no ``torch.optim.Optimizer`` but has ``param_groups``, ``state``
  and ``step`` (duck typing, as ``torch.optim.lr_scheduler`` accepts): watched through
  :class:`DuckOptimizer`;
- a dict or list of optimizers (PyTorch's optimizer-in-backward recipe: one per
  parameter), or torchtune's ``OptimizerInBackwardWrapper`` (``optim_map``): followed as
  one logical optimizer, :class:`optcheck.pytorch.optimizer_set.OptimizerSet`.

Models: ``DistributedDataParallel`` and ``DataParallel`` keep the user's module in
``.module`` (``torch/nn/parallel/distributed.py``), and so does DeepSpeed's
``DeepSpeedEngine``; parameter names are then the user's own, without the ``module.``
prefix. A DeepSpeed ZeRO stage 1/2 optimizer is watched as its model parameters
(:class:`ZeroOptimizer`, ``optcheck/pytorch/zero.py``).
"""

from __future__ import annotations

import torch

from optcheck.pytorch.guard import raised_by_signal_handler
from optcheck.pytorch import zero
from optcheck.pytorch.optimizer_set import optimizer_set

_MAX_DEPTH = 8  # wrappers of wrappers (e.g. Lightning around accelerate) are a few deep at most
#: where wrappers keep the optimizer they drive: accelerate/Lightning/pytorch-optimizer's Lookahead
#: (``optimizer``), SAM-style two-step optimizers (``base_optimizer``), schedule-free's
#: ``ScheduleFreeWrapper`` (``base``), heavyball's ``SAMWrapper`` (``wrapped_optimizer``), ``optim``
INNER = ("optimizer", "base_optimizer", "base", "wrapped_optimizer", "optim")
#: what an optimizer that is not a ``torch.optim.Optimizer`` must have (as ``torch.optim.lr_scheduler`` asks)
DUCK = ("param_groups", "state", "step")


def _get(obj: object, name: str) -> object:
    try:
        return getattr(obj, name, None)
    except Exception as caught:  # noqa: BLE001 - a property that raises: nothing there
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        return None


def _hooked(obj: object) -> bool:
    """A ``torch.optim.Optimizer`` whose ``__init__`` ran (it has the step-hook dicts)."""
    return isinstance(obj, torch.optim.Optimizer) and hasattr(obj, "_optimizer_step_pre_hooks")


def _duck(obj: object) -> bool:
    return all(_get(obj, a) is not None for a in DUCK) and callable(_get(obj, "step")) \
        and isinstance(_get(obj, "param_groups"), (list, tuple))


def _inner(obj: object) -> object | None:
    """The optimizer ``obj`` wraps under one of :data:`INNER`, or None."""
    for name in INNER:
        v = _get(obj, name)
        if v is not None and v is not obj and not isinstance(v, type) and \
                (_hooked(v) or _duck(v) or any(_get(v, a) is not None for a in INNER)):
            return v
    return None


def unwrap_optimizer(optimizer: object) -> torch.optim.Optimizer:
    """The optimizer that really steps: follow :data:`INNER` attributes inward (a
    wrapper's ``step()`` calls its inner one's, so the inner optimizer's step hooks see
    every update: a SAM ``first_step``/``second_step`` pair is one step of its
    ``base_optimizer``); at the end a ``torch.optim.Optimizer``, or an object with
    ``param_groups``, ``state`` and ``step`` (duck typing), which gets step hooks
    through :class:`DuckOptimizer`.

    A dict or list of optimizers, or an object holding one in ``optim_map``, is an
    :class:`~optcheck.pytorch.optimizer_set.OptimizerSet`.

    Raises:
        TypeError: none of these (the message names the chain of types given and what was
            looked for).
    """
    many = optimizer_set(optimizer)
    if many is not None:
        return many
    seen, obj = [], optimizer
    for _ in range(_MAX_DEPTH):
        seen.append(type(obj).__qualname__)
        if zero.is_zero(obj):  # DeepSpeed ZeRO 1/2: its inner optimizer holds flat partitions, not parameters
            return ZeroOptimizer.of(obj)
        # AcceleratedOptimizer subclasses Optimizer without running its __init__ (no hook
        # dicts): go on inward while there is an inner optimizer, then require a real one
        inner = _inner(obj)
        if inner is None:
            break
        obj = inner
    if _hooked(obj):
        return obj
    if _duck(obj):
        return DuckOptimizer.of(obj)
    raise TypeError(
        f"optcheck.Monitor: optimizer must be a torch.optim.Optimizer, an object holding one in "
        f"{', '.join('.' + a for a in INNER)}, one with {', '.join(DUCK)}, or a dict or list of optimizers "
        f"(one per parameter, stepped in backward); got {' -> '.join(seen)}")


class _Handle:
    """What ``register_step_pre_hook`` returns on a :class:`DuckOptimizer`: ``remove()``
    drops the hook, and with the last one gone puts the object's ``step`` back."""

    def __init__(self, owner: "DuckOptimizer", hooks: dict, key: int):
        self.owner, self.hooks, self.key = owner, hooks, key

    def remove(self) -> None:
        self.hooks.pop(self.key, None)
        self.owner._restore_if_idle()


class DuckOptimizer:
    """Step hooks for an optimizer that is not a ``torch.optim.Optimizer`` but has
    ``param_groups``, ``state`` and ``step`` (a hand-written class, a wrapper that
    forwards them): ``step`` is replaced on the instance (not the class) by one that
    calls the hooks around the original, and put back when the last hook is removed.
    ``param_groups`` and ``state`` are the object's own. Its type is named after the
    wrapped class (what snapshots record as the optimizer's type)."""

    @classmethod
    def of(cls, obj: object) -> "DuckOptimizer":
        named = type(type(obj).__name__, (cls,), {"__module__": type(obj).__module__})
        return named(obj)

    def __init__(self, obj: object):
        self.wrapped = obj
        self._pre: dict = {}
        self._post: dict = {}
        self._next = 0
        self._orig = None

    @property
    def param_groups(self) -> list:
        return self.wrapped.param_groups

    @property
    def state(self):
        return self.wrapped.state

    def step(self, *args, **kwargs):
        return self.wrapped.step(*args, **kwargs)

    def zero_grad(self, *args, **kwargs):
        return self.wrapped.zero_grad(*args, **kwargs)

    def _register(self, hooks: dict, hook) -> _Handle:
        if self._orig is None:
            orig = self.wrapped.step
            self._bound = self._hooked_step  # the one bound method set on the instance (put back by identity)
            try:
                self.wrapped.step = self._bound
            except (AttributeError, TypeError):  # __slots__, a read-only step
                raise TypeError(f"optcheck.Monitor: {type(self.wrapped).__qualname__}.step cannot be wrapped on "
                                f"the instance (no step hooks); pass a torch.optim.Optimizer") from None
            self._orig = orig
        self._next += 1
        hooks[self._next] = hook
        return _Handle(self, hooks, self._next)

    def register_step_pre_hook(self, hook) -> _Handle:
        """``hook(optimizer, args, kwargs)`` before each ``step()`` (as ``torch.optim``)."""
        return self._register(self._pre, hook)

    def register_step_post_hook(self, hook) -> _Handle:
        """``hook(optimizer, args, kwargs)`` after each ``step()`` (as ``torch.optim``)."""
        return self._register(self._post, hook)

    def _hooked_step(self, *args, **kwargs):
        for h in list(self._pre.values()):
            h(self, args, kwargs)
        out = self._orig(*args, **kwargs)
        for h in list(self._post.values()):
            h(self, args, kwargs)
        return out

    def _restore_if_idle(self) -> None:
        if self._orig is not None and not self._pre and not self._post:
            if getattr(self.wrapped, "__dict__", {}).get("step") is self._bound:
                del self.wrapped.step  # the class's step again
            self._orig = None


class ZeroOptimizer(DuckOptimizer):
    """DeepSpeed ZeRO stage 1/2 as the model's parameters (``optcheck/pytorch/zero.py``): ``param_groups`` one
    dict per group, ``params`` the group's model parameters (ZeRO's own ``bit16_groups[i]``
    list), the other keys the inner group's, refreshed at each read; ``state`` empty (no
    per-parameter state exists); step hooks around the ZeRO optimizer's ``step()``."""

    def __init__(self, obj: object):
        super().__init__(obj)
        self._groups: list[dict] = []
        self.hidden = zero.hidden(obj)  # what the run's not_checked says

    @property
    def param_groups(self) -> list:
        inner, bits = self.wrapped.optimizer.param_groups, zero.model_groups(self.wrapped)
        while len(self._groups) < len(inner):
            self._groups.append({})
        del self._groups[len(inner):]
        for d, g, members in zip(self._groups, inner, bits):
            d.update((k, v) for k, v in g.items() if k != "params")
            d["params"] = members
        return self._groups

    @property
    def state(self) -> dict:
        return {}


def unwrap_model(model: object) -> torch.nn.Module:
    """The user's module inside ``DistributedDataParallel`` / ``DataParallel``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"optcheck.Monitor: model must be a torch.nn.Module, got {type(model).__qualname__}")
    parallel = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    while isinstance(model, parallel) or _deepspeed_engine(model):
        model = model.module
    return model


def _deepspeed_engine(model: object) -> bool:
    """DeepSpeed's ``DeepSpeedEngine`` (``deepspeed/runtime/engine.py``), which keeps the user's
    model as ``.module`` (deepspeed itself is not imported)."""
    return type(model).__name__ == "DeepSpeedEngine" and type(model).__module__.startswith("deepspeed.") \
        and isinstance(getattr(model, "module", None), torch.nn.Module)
