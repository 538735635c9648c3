"""``optcheck.pytorch.deferred``: device values read later, in one transfer, in order."""

from __future__ import annotations

import logging

import pytest
import torch

from optcheck.pytorch import deferred
from optcheck.pytorch.deferred import DeviceLedger, host_values
from optcheck.pytorch.hostreads import HostReadCounter


def test_host_values_keeps_order_shapes_and_dtypes_in_one_read():
    ts = [torch.tensor(1.5), torch.tensor([True, False]), torch.tensor([2.0, float("nan")], dtype=torch.bfloat16),
          torch.tensor([], dtype=torch.float32), torch.tensor([[3, 4]], dtype=torch.int64)]
    with HostReadCounter() as reads:
        got = host_values(ts)
    assert got[0] == [1.5] and got[1] == [1.0, 0.0] and got[2][0] == 2.0 and got[2][1] != got[2][1]
    assert got[3] == [] and got[4] == [3.0, 4.0]
    assert [r.op for r in reads.select(by="optcheck")] == ["tolist"]  # one transfer for the device


def test_the_ledger_reads_extra_values_and_calls_back_in_order():
    ledger = DeviceLedger()
    seen = []
    ledger.add(torch.tensor(float("inf")), lambda v: seen.append(("loss", v)))
    ledger.add(torch.tensor([1.0, 2.0]), lambda v: seen.append(("norms", v)))
    assert len(ledger) == 2 and seen == []  # nothing read yet
    extra = ledger.read([torch.tensor(7.0), torch.tensor([8.0])])
    assert extra == [[7.0], [8.0]] and seen == [("loss", [float("inf")]), ("norms", [1.0, 2.0])]
    assert len(ledger) == 0 and ledger.read() == []


def test_a_callback_that_raises_is_logged_and_the_others_still_run(caplog):
    ledger = DeviceLedger()
    seen = []
    ledger.add(torch.tensor(1.0), lambda v: 1 / 0)
    ledger.add(torch.tensor(2.0), seen.append)
    with caplog.at_level(logging.ERROR, logger="optcheck"):
        ledger.read()
    assert seen == [[2.0]] and "could not be read" in caplog.text


def test_the_ledger_reads_itself_when_too_much_is_pending(monkeypatch):
    monkeypatch.setattr(deferred, "MAX_PENDING", 3)
    ledger = DeviceLedger()
    seen = []
    for i in range(3):
        ledger.add(torch.tensor(float(i)), seen.append)
    assert seen == [[0.0], [1.0], [2.0]] and len(ledger) == 0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1.0])
def test_the_hazard_probes_loss_check_reads_nothing_until_drained(value):
    from optcheck.pytorch.hazards import HazardProbes

    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probes = HazardProbes(model, opt)
    with HostReadCounter() as reads:
        with probes.step_context(1):
            loss = model(torch.ones(2, 3)).sum() * value
            probes.check_loss(loss, 1)
            loss.backward()
        probes.after_backward(1)
        opt.step()
    assert reads.count(by="optcheck") == 0 and not probes.has_events()
    events = probes.drain()
    kinds = {e["detail"]["what"]: e["step"] for e in events if e["kind"] == "nonfinite"}
    assert (kinds.get("loss"), kinds.get("grad")) == ((1, 1) if value != 1.0 else (None, None))
    probes.remove()
