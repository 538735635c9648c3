"""``optcheck/pytorch/step_hooks.py``: the one place that decides which ``step()`` is the
training step, on real torch optimizers (nested ``super().step()``, a step that raised, a
wrapper that is an ``Optimizer`` subclass, a swap, two optimizers in turn)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from optcheck.pytorch import step_hooks  # noqa: E402


class Counted:
    def __init__(self, optimizer, follow=False):
        self.pre, self.post, self.switches = [], [], []
        self.handles = step_hooks.register(optimizer, lambda o, a, k: self.pre.append(o),
                                           lambda o, a, k: self.post.append(o))
        if follow:
            self.handles.append(step_hooks.watch(optimizer).follow(lambda new, old: self.switches.append((new, old))))

    def remove(self):
        for h in self.handles:
            h.remove()


def _params():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    for p in lin.parameters():
        p.grad = torch.ones_like(p)
    return list(lin.parameters())


class Base(torch.optim.SGD):
    pass


class Outer(Base):
    """``step`` calls ``super().step()`` of a class also instantiated (pytorch-optimizer's MuonClip)."""

    def step(self, closure=None):
        return super().step(closure)


class Failing(torch.optim.SGD):
    fail = False

    def step(self, closure=None):
        if self.fail:
            raise RuntimeError("boom")
        return super().step(closure)


def test_a_nested_super_step_is_one_step():
    Base(_params(), lr=0.1)  # the base class patched by torch too: its hooks run nested in Outer's
    opt = Outer(_params(), lr=0.1)
    c = Counted(opt)
    for _ in range(3):
        opt.step()
    assert len(c.pre) == len(c.post) == 3
    c.remove()


def test_a_step_that_raised_does_not_swallow_the_next():
    opt = Failing(_params(), lr=0.1)
    c = Counted(opt)
    opt.step()
    opt.fail = True
    with pytest.raises(RuntimeError):
        opt.step()
    opt.fail = False
    opt.step()
    assert len(c.pre) == 3 and len(c.post) == 2  # the raised one has a pre hook only
    c.remove()


class Wrapper(torch.optim.Optimizer):
    """An Optimizer subclass with its own param groups whose step() calls the watched one's."""

    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.param_groups[0]["params"], {"lr": 0.1})

    def step(self, closure=None):
        return self.inner.step(closure)


def test_a_wrapper_calling_the_watched_step_is_not_a_swap():
    inner = torch.optim.SGD(_params(), lr=0.1)
    c = Counted(inner, follow=True)
    w = Wrapper(inner)
    for _ in range(3):
        w.step()
    assert len(c.pre) == len(c.post) == 3
    assert step_hooks.watch(inner).optimizer is inner
    assert c.switches == [(w, inner), (inner, w)]  # switched at its first step, undone within it
    c.remove()


def test_a_swapped_in_optimizer_is_watched_and_the_old_one_is_not_stepped_twice():
    ps = _params()
    old = torch.optim.AdamW(ps, lr=0.1)
    c = Counted(old, follow=True)
    old.step()
    new = torch.optim.SGD(ps, lr=0.1)
    for _ in range(3):
        new.step()
    assert c.switches == [(new, old)]
    assert [o is new for o in c.pre] == [False, True, True, True] and len(c.post) == 4
    assert step_hooks.watch(new).optimizer is new
    c.remove()


def test_two_optimizers_in_turn_switch_back_once_and_no_more():
    ps = _params()
    a, b = torch.optim.SGD(ps, lr=0.1), torch.optim.SGD(ps, lr=0.01)
    c = Counted(a, follow=True)
    for _ in range(4):
        a.step()
        b.step()
    assert c.switches == [(b, a), (a, b)]  # then both are followed as they are
    assert len(c.pre) == len(c.post) == 8
    c.remove()


def test_an_optimizer_over_other_parameters_is_not_followed():
    a, b = torch.optim.SGD(_params(), lr=0.1), torch.optim.SGD(_params(), lr=0.1)
    c = Counted(a, follow=True)
    a.step()
    b.step()
    assert c.pre == [a] and c.switches == []
    c.remove()


def test_removing_every_handle_removes_every_hook():
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    opt = torch.optim.SGD(_params(), lr=0.1)
    before = len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks)
    c = Counted(opt, follow=True)
    c.remove()
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    assert (len(_global_optimizer_pre_hooks), len(_global_optimizer_post_hooks)) == before


def test_wrap_is_what_is_called_in_place_of_each_hook():
    """``register(..., wrap=w)``: ``w(hook)`` is subscribed instead (the Monitor times and guards its
    probes' step hooks that way); once per training step, pre before post, and removed with the handle."""
    opt = torch.optim.SGD(_params(), lr=0.1)
    calls, wrapped = [], []

    def wrap(hook):
        wrapped.append(hook)

        def run(o, a, k):
            calls.append(("in", hook.__name__))
            hook(o, a, k)
        return run

    def pre(o, a, k):
        calls.append(("hook", "pre"))

    def post(o, a, k):
        calls.append(("hook", "post"))

    handles = step_hooks.register(opt, pre, post, wrap=wrap)
    opt.step()
    assert wrapped == [pre, post]
    assert calls == [("in", "pre"), ("hook", "pre"), ("in", "post"), ("hook", "post")]
    for h in handles:
        h.remove()
    opt.step()
    assert len(calls) == 4
    handles = step_hooks.register(opt, None, post, wrap=wrap)
    assert wrapped[-1] is post and len(wrapped) == 3  # (None is not wrapped)
    for h in handles:
        h.remove()
