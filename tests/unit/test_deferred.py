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


def test_the_ledger_holds_none_of_the_tensors_it_was_handed():
    """Issue 34: a value per step held until the next read pinned its few bytes among the step's
    large temporaries (30-60 page faults a step more than the plain loop): the values are copied
    into the ledger's own buffers and the tensors let go at once."""
    import weakref

    ledger = DeviceLedger()
    seen = []
    loss = torch.tensor(2.5, requires_grad=True) * 2
    flag = torch.tensor([1.0, float("nan"), 3.0]).isfinite()
    refs = [weakref.ref(loss), weakref.ref(flag)]
    kept = ledger.keep(loss)
    ledger.add(flag, seen.append)
    del loss, flag
    assert [r() for r in refs] == [None, None]
    with HostReadCounter() as reads:
        assert ledger.read([kept]) == [[5.0]]
    assert seen == [[1.0, 0.0, 1.0]]
    assert [r.op for r in reads.select(by="optcheck")] == ["tolist"]  # still one transfer for the device


def test_the_buffers_are_reused_after_a_read_and_span_many_values():
    ledger = DeviceLedger()
    seen = []
    for rnd in range(3):
        for i in range(deferred.CHUNK + 7):  # more than one buffer; a 3-value one never straddles two
            ledger.add(torch.tensor(float(i + rnd)), seen.append)
            if i % 50 == 0:
                ledger.add(torch.tensor([i, i + 1, i + 2], dtype=torch.int64), seen.append)
        ledger.read()
    assert len(seen) == 3 * (deferred.CHUNK + 7 + 6)
    assert seen[-1] == [float(deferred.CHUNK + 6 + 2)] and [50.0, 51.0, 52.0] in seen
    assert len(ledger._bufs[torch.device("cpu")]) == 2  # made in the first round, reused in the others


def test_kept_values_outlive_a_read_without_them():
    """A read that is not handed every kept value (the soak's resume reads the probes' checks
    with its losses still pending) leaves those values where they are."""
    ledger = DeviceLedger()
    kept = [ledger.keep(torch.tensor(float(i))) for i in range(3)]
    ledger.add(torch.tensor(9.0), lambda v: None)
    ledger.read()
    more = ledger.keep(torch.tensor(4.0))
    assert ledger.read(kept + [more]) == [[0.0], [1.0], [2.0], [4.0]]


class _Sub(torch.Tensor):
    """A tensor subclass (as DTensor is one): held, not copied."""


@pytest.mark.parametrize("value", [torch.tensor([1 + 2j]), torch.ones(deferred.CHUNK + 1),
                                   torch.tensor([1.0, 2.0]).as_subclass(_Sub), torch.empty(0)])
def test_what_the_buffers_cannot_take_is_held_and_read_as_before(value):
    ledger = DeviceLedger()
    seen = []
    ledger.add(value, seen.append)
    ledger.add(torch.tensor(7.0), seen.append)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (complex to real drops the imaginary part: host_values' own behaviour)
        ledger.read()
    assert seen[1] == [7.0] and len(seen[0]) == value.numel()


def test_values_off_the_cpu_are_held_not_copied():
    """A device tensor's memory is its allocator's, not the C heap's, and a copy would be a
    kernel launch per value: held as before (``meta`` stands in for a device here)."""
    ledger = DeviceLedger()
    t = torch.empty((), device="meta")
    assert ledger.keep(t) is t and ledger._pos == {}
    assert type(ledger.keep(torch.tensor(1.0))) is deferred.Kept


def test_the_same_tensor_handed_over_twice_is_copied_once_and_read_by_both():
    """Issue 34: the loss (the hazard probes' NaN check, the Monitor's loss) and a clip total
    (OC501, OC207) are each handed over twice a step: one copy serves both."""
    ledger = DeviceLedger()
    seen = []
    loss = torch.tensor(2.5, requires_grad=True) * 2
    ledger.add(loss, lambda v: seen.append(("nan check", v)))
    kept = ledger.keep(loss)
    assert ledger._pos[torch.device("cpu")] == 1  # one value written, not two
    assert ledger.read([kept]) == [[5.0]] and seen == [("nan check", [5.0])]


def test_a_step_hands_over_the_loss_then_a_clip_total_twice_then_the_loss_again_two_copies():
    """The order a Monitor's step hands them over in: the hazard probes' loss check before
    backward, OC207 and OC501 on the clip total at the step pre-hook, the loss kept at step end."""
    ledger = DeviceLedger()
    seen = []
    loss = torch.tensor(2.5, requires_grad=True) * 2
    total = torch.tensor(0.75)
    ledger.add(loss, lambda v: seen.append(("loss finite", v)))
    ledger.add(total, lambda v: seen.append(("oc207", v)))
    ledger.add(total, lambda v: seen.append(("oc501", v)))
    kept = ledger.keep(loss)
    assert ledger._pos[torch.device("cpu")] == 2
    assert ledger.read([kept]) == [[5.0]]
    assert seen == [("loss finite", [5.0]), ("oc207", [0.75]), ("oc501", [0.75])]


def test_a_tensor_written_in_between_is_copied_again():
    ledger = DeviceLedger()
    seen = []
    total = torch.tensor(3.0)
    ledger.add(total, seen.append)
    total.mul_(2)  # its version counter moves: the copy made before is not its value now
    ledger.add(total, seen.append)
    other = torch.tensor(3.0)  # an equal value in another tensor: a copy of its own
    ledger.add(other, seen.append)
    assert ledger._pos[torch.device("cpu")] == 3
    ledger.read()
    assert seen == [[3.0], [6.0], [3.0]]


def test_after_the_buffers_rewind_the_same_tensor_is_copied_again():
    ledger = DeviceLedger()
    seen = []
    t = torch.tensor(1.0)
    ledger.add(t, seen.append)
    ledger.read()  # rewinds: the slot t went to is written over next
    ledger.add(torch.tensor(9.0), seen.append)
    ledger.add(t, seen.append)
    ledger.read()
    assert seen == [[1.0], [9.0], [1.0]]


def test_a_tensor_without_a_version_counter_is_copied_each_time_and_nothing_raises():
    """An inference tensor (made under ``torch.inference_mode()``: a clip total or a loss taken
    there) has no version counter to compare: reading it raised into the user's loop."""
    with torch.inference_mode():
        t = torch.tensor(2.0)
    ledger = DeviceLedger()
    seen = []
    ledger.add(t, seen.append)
    ledger.add(t, seen.append)
    assert ledger._pos[torch.device("cpu")] == 2
    ledger.read()
    assert seen == [[2.0], [2.0]]
