"""Many optimizers followed as one logical optimizer: PyTorch's "optimizer in
backward" recipe and torchtune's ``optimizer_in_bwd``.

PyTorch's tutorial "How to save memory by fusing the optimizer step into the
backward pass" (``intermediate_source/optimizer_step_in_backward_tutorial.py``)
builds one optimizer per parameter and steps each from the parameter's
post-accumulate-grad hook::

    optimizer_dict = {p: torch.optim.Adam([p], foreach=False) for p in model.parameters()}

    def optimizer_hook(parameter) -> None:
        optimizer_dict[parameter].step()
        optimizer_dict[parameter].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(optimizer_hook)

torchtune's ``optimizer_in_bwd: True`` does the same
(``torchtune/training/memory.py``: ``register_optim_in_bwd_hooks(model, optim_dict)``)
and keeps the optimizers for checkpoints in an ``OptimizerInBackwardWrapper`` whose
``optim_map`` maps each parameter's *name* to its optimizer.

``optcheck.Monitor(model, optimizer_dict)`` (or the wrapper, or a list of the
optimizers) watches them through :class:`OptimizerSet`: its param groups are every
member's, in order (the members' own group dicts, so a learning rate a scheduler
sets is seen), its state every member's (``optimizer.state`` is keyed by the
parameter, so the members' keys are disjoint). The members' ``step()`` calls come
from inside backward: the training step is that backward pass
(``optcheck/pytorch/in_backward.py``), not any one member's step.
"""

from __future__ import annotations

import torch


class _NoHandle:
    """What the set's ``register_step_*_hook`` returns: its members' steps are seen
    through PyTorch's global step hooks (``optcheck/pytorch/step_hooks.py``)."""

    def remove(self) -> None:
        return None


def _is_optimizer(obj: object) -> bool:
    return isinstance(obj, torch.optim.Optimizer) and hasattr(obj, "param_groups")


class OptimizerSet:
    """One logical optimizer over ``members`` (module docstring).

    Args:
        source: a dict whose values are optimizers (``{param: optimizer}``, or
            ``{name: optimizer}``), or a list/tuple of optimizers. A dict is read live:
            an optimizer the user puts in it later is a member from then on.

    Attributes:
        param_groups: every member's param groups, in member order (a new list at
            each read; the group dicts are the members' own).
        state: every member's ``state`` entries in one dict (a new dict at each read).
    """

    def __init__(self, source):
        self.source = source

    @property
    def members(self) -> list:
        """The member optimizers, each once (a dict may map several parameters to one)."""
        values = self.source.values() if isinstance(self.source, dict) else self.source
        seen: dict[int, object] = {}
        for o in values:
            seen.setdefault(id(o), o)
        return list(seen.values())

    def holds(self, optimizer: object) -> bool:
        """True when ``optimizer`` is one of the members."""
        return any(o is optimizer for o in self.members)

    @property
    def param_groups(self) -> list:
        return [g for o in self.members for g in o.param_groups]

    @property
    def state(self) -> dict:
        # a plain dict, not a ChainMap over the members' defaultdicts: a look-up of a
        # missing key must not create an entry in a member's state
        return {k: v for o in self.members for k, v in o.state.items()}

    @property
    def defaults(self) -> dict:
        ms = self.members
        return dict(ms[0].defaults) if ms else {}

    def step(self, closure=None):
        """Step every member (a loop that steps the set itself, outside backward)."""
        loss = None
        for o in self.members:
            out = o.step(closure) if closure is not None else o.step()
            loss = out if loss is None else loss
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.members:
            o.zero_grad(set_to_none=set_to_none)

    def register_step_pre_hook(self, hook) -> _NoHandle:
        return _NoHandle()

    def register_step_post_hook(self, hook) -> _NoHandle:
        return _NoHandle()

    def __repr__(self) -> str:
        ms = self.members
        kinds = sorted({type(o).__name__ for o in ms})
        return f"OptimizerSet({len(ms)} optimizers: {', '.join(kinds)})"


def optimizer_set(obj: object) -> OptimizerSet | None:
    """An :class:`OptimizerSet` when ``obj`` is a dict or list/tuple of optimizers (at
    least one, every value an optimizer) or holds one in ``optim_map`` (torchtune's
    ``OptimizerInBackwardWrapper``); else None."""
    inner = getattr(obj, "optim_map", None) if not isinstance(obj, (dict, list, tuple)) else None
    if isinstance(inner, dict):
        obj = inner
    values = list(obj.values()) if isinstance(obj, dict) else list(obj) if isinstance(obj, (list, tuple)) else None
    if not values or not all(_is_optimizer(v) for v in values):
        return None
    return OptimizerSet(obj)
