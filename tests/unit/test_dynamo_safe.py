"""optcheck/pytorch/dynamo_safe.py without compiling anything (the compiled forms are
tests/integration/test_monitor_compile_forms.py): what it must not mistake for a compiled region."""

from __future__ import annotations

import copy
import pickle
import sys

import torch

from optcheck.pytorch.dynamo_safe import EagerHook, HiddenSteps, saved_by_compiled_graph


def test_hand_update_without_step_is_no_hidden_step():
    """Parameters written in place between two backward passes with no ``step()`` and no compiled
    step in play (a hand-written SGD): not a hidden step (OC206 still finds such a loop)."""
    lin = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    hidden = HiddenSteps(opt)
    for _ in range(3):
        lin(torch.randn(2, 3)).sum().backward()
        assert hidden.after_backward(sys._getframe()) is False
        with torch.no_grad():
            for p in lin.parameters():
                p -= 0.1 * p.grad
        assert hidden.stepped() is False
    assert hidden.count == 0 and not hidden.known


def test_post_hook_alone_is_a_hidden_step():
    """A post hook run without its pre hook (``unpaired`` grew: Dynamo traced the pre hook as
    nothing and ran the post hook eagerly past a graph break) is a hidden step, even when no
    parameter moved; then the pre-step stand-ins run after each backward."""
    lin = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    unpaired = [0]
    hidden = HiddenSteps(opt, lambda: unpaired[0])
    assert hidden.after_backward(sys._getframe()) is False
    unpaired[0] += 1
    assert hidden.stepped() is True and hidden.known and hidden.count == 1
    assert hidden.after_backward(sys._getframe()) is True  # stand-ins from now on
    hidden.hook_ran()  # an eager step() ran its hooks: nothing hidden
    assert hidden.stepped() is False


def test_eager_hook_runs_eagerly_and_leaves_no_trace_in_copies():
    calls = []
    hook = EagerHook(lambda *a: calls.append(a))
    hook(1, 2)
    assert calls == [(1, 2)]
    assert copy.deepcopy(hook) is hook
    assert pickle.loads(pickle.dumps(hook))(1, 2) is None and calls == [(1, 2)]  # unpickles inert


def test_custom_function_saves_are_not_a_compiled_graphs():
    """A user's own ``autograd.Function`` saves through ``Function.apply`` too: not a compiled graph."""
    seen = []

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    def pack(t):
        seen.append(saved_by_compiled_graph(sys._getframe(1)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        Square.apply(torch.randn(3, requires_grad=True)).sum().backward()
    assert seen and not any(seen)
