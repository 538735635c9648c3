"""``torch.autograd.backward([l1, l2], grad_tensors)`` is watched like ``loss.backward()``
(issue 17): the Monitor's backward wrapper checks every tensor of the sequence, so a
non-finite or graph-cut loss among them is found at its step, and the step's loss is
Σ gᵢ·lᵢ. A clean two-loss loop stays silent. Small, CPU, one thread."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import optcheck  # noqa: E402
from optcheck.drivers.worker_loop import StepStopped  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def two_loss_loop(bug=None, bug_at=5, steps=12, out=None):
    """Two heads of one model, one ``torch.autograd.backward([l1, l2], grad_tensors=[1, 0.5])``
    per step, a snapshot only every 100 steps (so only the backward wrapper can see step
    ``bug_at``). ``bug``: "nan" makes l2 NaN, "cut" detaches l2, at step ``bug_at``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 8)
    losses, stopped = [], None
    mon = optcheck.Monitor(model, opt, every=100, on_finding="ignore", out=out, ignore_config=False)
    try:
        for step in range(1, steps + 1):
            y = model(x)
            l1, l2 = y[:, 0].pow(2).mean(), y[:, 1].abs().mean()
            if step == bug_at and bug == "nan":
                l2 = l2 * float("nan")
            if step == bug_at and bug == "cut":
                l2 = l2.detach()
            losses.append(float((l1 + 0.5 * l2).detach()))
            opt.zero_grad()
            torch.autograd.backward([l1, l2], grad_tensors=[torch.tensor(1.0), torch.tensor(0.5)])
            opt.step()
    except StepStopped as e:
        stopped = e
    mon.close()
    return mon, losses, stopped


def test_a_nan_loss_in_the_sequence_is_found_at_its_step():
    mon, _, _ = two_loss_loop("nan", bug_at=5)
    first = mon.findings[0]
    assert (first.code, first.step, first.subjects) == ("OC501", 5, ["loss"])
    # the loss and gradient checks are dated at step 5; the NaN parameters they caused are seen
    # by the closing snapshot's own look at them (docs/gpu.md: read at the next snapshot)
    assert {f.step for f in mon.findings if f.detail["what"] in ("loss", "grad")} == {5}
    assert all(f.step > 5 for f in mon.findings if f.detail["what"] == "param")


def test_a_cut_loss_in_the_sequence_stops_the_step_with_its_finding():
    mon, _, stopped = two_loss_loop("cut", bug_at=7)
    assert stopped is not None and "no grad_fn" in str(stopped)
    assert [(f.code, f.step) for f in mon.findings] == [("OC203", 7)]


def test_a_clean_two_loss_loop_is_silent_and_records_the_weighted_loss(tmp_path):
    mon, losses, stopped = two_loss_loop(out=tmp_path / "run")
    assert stopped is None and mon.findings == [] and mon.exit_code == 0
    recorded = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert recorded == pytest.approx(losses, rel=1e-6)  # l1 + 0.5 * l2 at every step
