"""Steps taken inside backward (issue 34), piece by piece on real torch: a ``step()``
from a gradient hook is a per-parameter step, never a training step nor a swap
(``optcheck/pytorch/step_hooks.py``); :class:`BackwardSteps` tells a pass that moved
the parameters from one that did not (``optcheck/pytorch/in_backward.py``); a dict,
list or ``optim_map`` of optimizers is one :class:`OptimizerSet`
(``optcheck/pytorch/optimizer_set.py``); the state reader skips a param group and a
parameter kept in the state (optimi's ``state[p]["group"]``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from optcheck.pytorch import state_read, step_hooks  # noqa: E402
from optcheck.pytorch.in_backward import BackwardSteps  # noqa: E402
from optcheck.pytorch.optimizer_set import OptimizerSet  # noqa: E402
from optcheck.pytorch.unwrap import unwrap_optimizer  # noqa: E402


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _backward(model, steps=None):
    """One backward pass told to ``steps`` (as the Monitor's backward wrapper does)."""
    if steps is not None:
        steps.before()
    model(torch.randn(3, 4)).sum().backward()
    return steps.after() if steps is not None else None


def _in_backward_recipe(model, fused=False, zero_grad=True):
    opts = {p: torch.optim.AdamW([p], lr=0.1, fused=fused) for p in model.parameters()}

    def hook(p):
        opts[p].step()
        if zero_grad:
            opts[p].zero_grad()

    handles = [p.register_post_accumulate_grad_hook(hook) for p in model.parameters()]
    return opts, handles


def test_a_step_from_a_gradient_hook_is_an_inner_step_not_a_training_step_nor_a_swap():
    model = _mlp()
    watched = torch.optim.SGD(model.parameters(), lr=0.1)
    starts, inner, switches = [], [], []
    w = step_hooks.watch(watched)
    hs = [w.subscribe(lambda o, a, k: starts.append(o), None), w.on_inner(lambda o, a, k: inner.append(o)),
          w.follow(lambda new, old: switches.append(new))]
    opts, handles = _in_backward_recipe(model)  # other optimizers over the watched parameters, in backward
    _backward(model)
    assert starts == [] and switches == [] and len(inner) == 4 and set(map(id, inner)) == set(map(id, opts.values()))
    watched.step()  # the watched optimizer outside backward: the training step
    assert starts == [watched]
    w.in_backward = True  # once steps are known to be taken in backward, a step() outside it is passed over
    watched.step()
    assert starts == [watched]
    for h in hs + handles:
        h.remove()


def test_the_watched_optimizer_stepped_per_parameter_in_backward_is_inner():
    # optimi's contract: the watched optimizer's own step(param=p) from a post-accumulate-grad hook
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    starts, inner = [], []
    w = step_hooks.watch(opt)
    hs = [w.subscribe(lambda o, a, k: starts.append(o), None), w.on_inner(lambda o, a, k: inner.append(o))]
    handles = [p.register_post_accumulate_grad_hook(lambda p: opt.step()) for p in model.parameters()]
    _backward(model)
    assert starts == [] and inner == [opt] * 4
    for h in hs + handles:
        h.remove()


@pytest.mark.parametrize("fused", [False, True], ids=["for-loop", "fused"])
def test_a_pass_that_steps_in_backward_is_one_training_step(fused):
    model = _mlp()
    opts, handles = _in_backward_recipe(model, fused=fused)
    steps = BackwardSteps(OptimizerSet(opts))
    w = step_hooks.watch(steps.optimizer)
    sub = w.on_inner(steps.inner)
    assert [_backward(model, steps) for _ in range(3)] == [True, True, True]
    assert steps.active and steps.inner_total == 12 and len(steps._params) == 4  # every member tracked once active
    for h in handles + [sub]:
        h.remove()
    assert _backward(model, steps) is False  # hooks gone: nothing moves, nothing released
    steps.remove()


def test_a_plain_backward_is_no_step_and_the_first_step_outside_retires_the_tracking():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = BackwardSteps(opt)
    assert _backward(model, steps) is False and len(steps._params) == 2  # two sentinels only
    assert len(steps._handles) == 2
    steps.retire()
    assert steps.retired and steps._handles == [] and _backward(model, steps) is False


def test_accumulation_passes_are_no_step():
    # optimi-style accumulation: the per-parameter steps run, the gradients are released, nothing is written
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.optimizer_accumulation = False
    moments = {p: torch.zeros_like(p) for p in model.parameters()}

    def hook(p):
        moments[p].add_(p.grad)
        if not opt.optimizer_accumulation:
            with torch.no_grad():
                p.add_(moments[p], alpha=-0.1)
            moments[p].zero_()
        p.grad = None

    handles = [p.register_post_accumulate_grad_hook(hook) for p in model.parameters()]
    steps = BackwardSteps(opt)
    got = []
    for micro in range(8):
        opt.optimizer_accumulation = micro % 4 != 3
        got.append(_backward(model, steps))
    assert got == [False, False, False, True] * 2
    # the same without the flag: the first window counts (nothing tells yet), then the version counters do
    del opt.optimizer_accumulation
    acc = {"on": True}
    opt.__class__ = type("NoFlag", (torch.optim.SGD,), {})

    def hook2(p):
        moments[p].add_(p.grad)
        if not acc["on"]:
            with torch.no_grad():
                p.add_(moments[p], alpha=-0.1)
        p.grad = None

    for h in handles:
        h.remove()
    handles = [p.register_post_accumulate_grad_hook(hook2) for p in model.parameters()]
    steps2 = BackwardSteps(opt)
    got = []
    for micro in range(8):
        acc["on"] = micro % 4 != 3
        got.append(_backward(model, steps2))
    assert got == [True, True, True, True, False, False, False, True]
    for h in handles:
        h.remove()


def test_dicts_lists_and_optim_maps_of_optimizers_are_one_optimizer_set():
    model = _mlp()
    opts = {p: torch.optim.AdamW([p], lr=0.1) for p in model.parameters()}
    by_name = {n: opts[p] for n, p in model.named_parameters()}
    holder = type("OptimizerInBackwardWrapper", (), {"optim_map": by_name})()
    for given in (opts, by_name, list(opts.values()), holder):
        s = unwrap_optimizer(given)
        assert isinstance(s, OptimizerSet) and len(s.members) == 4
        assert [p for g in s.param_groups for p in g["params"]] == list(model.parameters())
    s = unwrap_optimizer(opts)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    s.step()
    assert set(s.state) == set(model.parameters()) and all("exp_avg" in v for v in s.state.values())
    assert s.holds(opts[model[0].weight]) and not s.holds(torch.optim.SGD(model.parameters(), lr=1))
    missing = torch.nn.Parameter(torch.zeros(1))
    assert missing not in s.state and all(missing not in o.state for o in s.members)  # a look-up creates nothing
    with pytest.raises(TypeError):
        unwrap_optimizer({"a": 1})


def test_state_that_refers_back_to_the_optimizer_is_no_state():
    # optimi keeps each parameter's param group in its state; a parameter, a dict of numbers, a
    # closure and a scalar there are no state tensors either
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        opt.state[p] = {"group": opt.param_groups[0], "param": p, "exp_avg": torch.zeros_like(p),
                        "hyper": {"beta": 0.9}, "fn": lambda: 0, "n": 3, "step": torch.tensor(2.0),
                        "copy": {"params": [torch.zeros(2)], "lr": 0.1}}
    view = state_read.read(opt)
    assert {t.path for ps in view.params for t in ps.tensors} == {"exp_avg", "step"}
    assert view.skipped == [] and all(ps.step is not None for ps in view.params)
