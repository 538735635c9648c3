"""OC204 grad-not-cleared: the probe on real torch loops, clean and buggy."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from optcheck.engine import check_stream  # noqa: E402
from optcheck.pytorch import probe  # noqa: E402
from optcheck.pytorch.grad_clear import GradClearProbe  # noqa: E402
from optcheck.run.snapshot import SCHEMA  # noqa: E402


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
