"""OC205 stalled-param: fires when the optimizer never moves parameters that have gradients."""

from __future__ import annotations

import pytest

from optcheck.engine import check_stream
from snapfactory import at, clean


def _stream(bump: bool, n: int = 4):
    snaps = []
    for i in range(n):
        s = at(clean(), 100 * (i + 1))
        for p in s["params"]:
            p["version"] = 1 + (i if bump else 0)
        snaps.append(s)
    return snaps


def test_fires_when_versions_stay_put():
    found = [f for f in check_stream(_stream(bump=False)) if f.code == "OC205"]
    assert len(found) == 1 and found[0].step == 300 and found[0].detail["since_step"] == 100
    assert set(found[0].subjects) == {"layer0.weight", "layer1.weight", "layer2.weight"}


def test_silent_when_params_are_updated():
    assert check_stream(_stream(bump=True)) == []


def test_silent_without_gradients_or_versions():
    snaps = _stream(bump=False)
    for s in snaps:
        for p in s["params"]:
            p["grad"] = "none"
    assert [f for f in check_stream(snaps) if f.code == "OC205"] == []
    snaps = _stream(bump=False)
    for s in snaps:  # TorchSharp snapshots carry no version counter
        for p in s["params"]:
            p["version"] = None
    assert check_stream(snaps) == []


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("call_step", [True, False])
def test_real_loop_without_optimizer_step(call_step):
    from optcheck.pytorch import probe
    from optcheck.snapshot import SCHEMA

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    snaps = []
    for step in range(1, 31):
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        if call_step:
            opt.step()
        if step % 10 == 0:
            snaps.append({"schema": SCHEMA, "backend": "pytorch", "run": "t", "step": step, "phase": "post-step",
                          "trigger": "cadence", **probe.snapshot_body(model, opt, census=False), "events": []})
    codes = {f.code for f in check_stream(snaps)}
    assert codes == (set() if call_step else {"OC205"})
