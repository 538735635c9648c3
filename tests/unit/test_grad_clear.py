"""OC204 grad-not-cleared: the probe on real torch loops, clean and buggy."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from optcheck.engine import check_stream  # noqa: E402
from optcheck.pytorch import probe  # noqa: E402
from optcheck.pytorch.grad_clear import GradClearProbe  # noqa: E402
from optcheck.record.snapshot import SCHEMA  # noqa: E402


def _loop(style: str, steps: int = 12):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gp = GradClearProbe(opt)
    snaps = []
    for step in range(1, steps + 1):
        if style in ("zero-before", "closure"):
            opt.zero_grad()
        micro = 4 if style == "accumulate" else 1
        if style == "closure":  # LBFGS-style: backward runs inside step()
            x = torch.randn(4, 8)

            def closure():
                opt.zero_grad()
                loss = model(x).pow(2).mean()
                loss.backward()
                return loss

            opt.step(closure)
        else:
            for _ in range(micro):
                model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
        if step % 4 == 0:  # right after step(), as the soak and the Monitor take them
            snaps.append({"schema": SCHEMA, "backend": "pytorch", "run": "t", "step": step, "phase": "post-step",
                          "trigger": "cadence", **probe.snapshot_body(model, opt, census=False),
                          "events": gp.drain()})
        if style in ("zero-after", "accumulate"):
            opt.zero_grad(set_to_none=False)
    return check_stream(snaps)


@pytest.mark.parametrize("style", ["zero-before", "zero-after", "accumulate", "closure"])
def test_clean_loops_are_silent(style):
    assert _loop(style) == []


def test_missing_zero_grad_is_named_once():
    found = _loop("none")
    assert [f.code for f in found] == ["OC204"]
    assert found[0].detail["first_step"] == 2


def _codes(model, opt, gp, body) -> list[str]:
    """Run ``body(step)`` for 6 steps with a snapshot after each; the codes found."""
    snaps = []
    for step in range(1, 7):
        body(step)
        snaps.append({"schema": SCHEMA, "backend": "pytorch", "run": "t", "step": step, "phase": "post-step",
                      "trigger": "cadence", **probe.snapshot_body(model, opt, census=False), "events": gp.drain()})
    return [f.code for f in check_stream(snaps)]


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return model, opt, GradClearProbe(opt)


def test_gradients_assigned_from_autograd_grad_are_fresh():
    """``torch.autograd.grad`` never runs AccumulateGrad (no post-accumulate hook fires); a
    ``.grad`` replaced by hand with new tensors is still a fresh gradient: no OC208."""
    model, opt, gp = _mlp()

    def body(step):
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        for p, g in zip(model.parameters(), torch.autograd.grad(loss, list(model.parameters()))):
            p.grad = g
        opt.step()

    assert _codes(model, opt, gp, body) == []


def test_step_without_backward_is_stale_even_after_clipping():
    """OC208 rests on the smallest ``.grad`` being the same tensor as after the last step
    (not on its version counter): clipping in between does not hide a skipped backward()."""
    model, opt, gp = _mlp()

    def body(step):
        if step != 3:  # backward() skipped at step 3: step 2's gradients applied again
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        opt.step()

    assert _codes(model, opt, gp, body) == ["OC208"]


def test_zero_grad_between_backward_and_step_is_named():
    model, opt, gp = _mlp()

    def body(step):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.zero_grad(set_to_none=step % 2 == 0)  # both kinds of clearing, before step()
        opt.step()

    codes = _codes(model, opt, gp, body)
    assert codes[0] == "OC207" and "OC208" not in codes  # (OC202 follows: nothing moved)


def test_backward_without_step_keeps_a_bounded_record():
    """Thousands of backward() calls with no optimizer step (gradients computed for
    analysis) hold one entry per parameter, not one per call."""
    model, opt, gp = _mlp()
    for _ in range(200):
        model(torch.randn(4, 8)).pow(2).mean().backward()
    assert len(gp._fresh) == len(list(model.parameters()))
    gp.remove()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    assert gp.drain() == []  # removed: no hook runs


# -- per_backward=True (the Monitor): arrival from .grad around each pass, no hook per parameter --
def _told(gp, loss) -> None:
    """A backward pass the probe is told of, as the Monitor's backward wrapper does."""
    gp.before_backward()
    loss.backward()
    gp.after_backward()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_per_backward_arrival_names_what_got_a_gradient(set_to_none):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    unused = torch.nn.Linear(8, 1)  # in the optimizer, never in the loss
    opt = torch.optim.SGD([*model.parameters(), *unused.parameters()], lr=0.01)
    gp = GradClearProbe(opt, per_backward=True)
    n = sum(len(g["params"]) for g in opt.param_groups)
    hooked = GradClearProbe(opt)
    assert len(hooked._handles) - len(gp._handles) == n  # no hook per parameter
    hooked.remove()
    for _ in range(3):
        opt.zero_grad(set_to_none=set_to_none)
        _told(gp, model(torch.randn(4, 8)).pow(2).mean())
        opt.step()
    watched, arrived = gp.arrival()
    assert watched == {id(p) for g in opt.param_groups for p in g["params"]}
    assert arrived == {id(p) for p in model.parameters()}  # not unused's: OC202 can name it
    assert gp.drain() == []


def test_per_backward_finds_the_double_step_and_the_cleared_gradients():
    model, opt, _ = _mlp()
    gp = GradClearProbe(opt, per_backward=True)

    def body(step):
        opt.zero_grad()
        _told(gp, model(torch.randn(4, 8)).pow(2).mean())
        if step == 3:
            opt.zero_grad(set_to_none=False)  # OC207: cleared between backward() and step()
        opt.step()
        if step == 5:
            opt.step()  # OC208: the same gradients applied twice

    assert set(_codes(model, opt, gp, body)) >= {"OC207", "OC208"}


def test_per_backward_a_pass_it_was_not_told_of_leaves_arrival_unknown():
    """A backward that bypasses the Monitor's wrapper: no OC208 and no grad_arrived (not a guess)."""
    model, opt, _ = _mlp()
    gp = GradClearProbe(opt, per_backward=True)

    def body(step):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()  # not told
        opt.step()

    assert _codes(model, opt, gp, body) == []
    assert gp.arrival() == (set(), set())


def test_a_pass_with_no_watched_parameter_is_told_as_unknown_not_an_error():
    """Every member unwatchable (FSDP2's DTensor parameters; here lazy parameters not yet
    materialised): before/after a backward pass and a step say nothing and raise nothing.
    Before, after_backward raised AttributeError ('_small_i') inside the Monitor's guard,
    so the rest of its after-backward work (FSDP2's cross-rank exchange) never ran."""
    lazy = torch.nn.LazyLinear(4)
    opt = torch.optim.SGD(lazy.parameters(), lr=0.1)
    gp = GradClearProbe(opt, per_backward=True)
    other = torch.nn.Linear(3, 1)
    gp.before_backward()
    other(torch.randn(2, 3)).sum().backward()
    assert gp.after_backward() is None
    gp.clipped({id(p) for p in other.parameters()}, torch.tensor(1.0))
    opt.step()
    assert gp.drain() == [] and gp.arrival() == (set(), set())
    gp.remove()


def test_the_clip_total_covers_the_parameters_it_was_taken_over_not_a_stale_answer():
    """ClipNorm keeps the id set and the last ``covers`` answer while the same parameters come
    (issue 34: no id set rebuilt per step); a parameter replaced since is not covered."""
    from optcheck.pytorch.monitor_hooks import ClipNorm

    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    clip = ClipNorm()
    clip.record([a, b], torch.tensor(1.0))
    assert clip.covers([a, b]) and clip.covers([a, b]) and clip.covers([a])
    new = torch.nn.Parameter(torch.ones(3))
    assert not clip.covers([a, new])  # the layer replaced after the clip: its gradient is not in the total
    clip.record([a, new], torch.tensor(2.0))
    assert clip.covers([a, new]) and not clip.covers([a, b])
    clip.clear()
    assert not clip.covers([a, new])  # a backward pass since: the total is stale
    clip.record([a, new], torch.tensor(float("nan")).expand(2))  # not one value: no total
    assert not clip.covers([a, new])
