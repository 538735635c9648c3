"""Optimizer step hooks that fire once per ``step()`` the user calls.

``torch.optim.Optimizer`` runs the step hooks in a wrapper it puts around each
optimizer class's ``step`` (``Optimizer.profile_hook_step``, patched onto the class
at its first instance, ``torch/optim/optimizer.py``). An optimizer whose ``step``
calls ``super().step()`` of a class that was also instantiated in the process
(pytorch-optimizer's ``MuonClip`` over ``Muon``) therefore runs the hooks twice per
step, the inner pair nested in the outer: counted as two steps, the second with no
fresh gradient. :func:`register` wraps a pre/post pair so that only the outermost
``step()`` calls them: the pre hook remembers the frame that called it (torch's
wrapper); a pre hook called while that frame is still on the stack, and a post
hook called from another frame, belong to a nested ``step()`` and are passed over.
A ``step()`` that raised leaves its frame behind; the next step sees that frame is
no longer on the stack and starts afresh. Cost: one ``sys._getframe`` per hook call.
"""

from __future__ import annotations

import sys


class _Outermost:
    __slots__ = ("pre", "post", "frame")

    def __init__(self, pre, post):
        self.pre, self.post, self.frame = pre, post, None

    def on_pre(self, optimizer, args, kwargs):
        caller = sys._getframe(1)
        if self.frame is not None:
            f = caller.f_back
            while f is not None:
                if f is self.frame:
                    return None  # a step() nested in the one being watched
                f = f.f_back
        self.frame = caller
        return self.pre(optimizer, args, kwargs) if self.pre is not None else None

    def on_post(self, optimizer, args, kwargs):
        if sys._getframe(1) is not self.frame:
            return None  # a nested step() ending
        self.frame = None
        return self.post(optimizer, args, kwargs) if self.post is not None else None


def register(optimizer, pre=None, post=None) -> list:
    """Register ``pre(optimizer, args, kwargs)`` and ``post(...)`` (either may be None)
    as ``optimizer``'s step pre and post hooks, called for the outermost ``step()``
    only; returns the handles (``remove()`` each)."""
    pair = _Outermost(pre, post)
    return [optimizer.register_step_pre_hook(pair.on_pre), optimizer.register_step_post_hook(pair.on_post)]
