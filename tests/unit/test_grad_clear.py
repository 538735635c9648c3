"""OC204 grad-not-cleared: the probe on real torch loops, clean and buggy."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from optcheck.engine import check_stream  # noqa: E402
from optcheck.pytorch import probe  # noqa: E402
from optcheck.pytorch.grad_clear import GradClearProbe  # noqa: E402
from optcheck.snapshot import SCHEMA  # noqa: E402


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
