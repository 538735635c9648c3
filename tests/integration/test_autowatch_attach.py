"""``optcheck.autowatch.attach.AutoWatch`` in this process (what ``optcheck run``'s boot hook and
the pytest plugin install): a Monitor per optimizer over the model that ran, notes for what
cannot be watched, nothing raised into the loop, uninstall idempotent."""

from __future__ import annotations

import warnings

import pytest
import torch

from optcheck.autowatch.attach import FIND_TRIES, AutoWatch


def _loop(model, opt, steps=12, replace_at=None):
    torch.manual_seed(0)
    for step in range(1, steps + 1):
        x = torch.randn(8, 4)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == replace_at:
            model[1] = torch.nn.Linear(8, 1)


@pytest.fixture
def watch():
    w = AutoWatch(None, every=4, on_finding="ignore").install()
    yield w
    w.uninstall()


def _net():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))


def test_one_optimizer_one_monitor_over_the_top_module(watch):
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _loop(model, opt, replace_at=6)
    assert len(watch.monitors) == 1
    mon = watch.monitors[0]
    assert mon.model is model and mon.optimizer is opt and mon.step_count == 12  # counted from the first step
    assert [f.step for f in watch.findings() if f.code == "OC101"] == [7]
    summaries = watch.uninstall()
    assert summaries[0]["last_step"] == 12 and mon.closed
    again = watch.uninstall()  # idempotent: a second call neither raises nor opens anything
    assert [x["last_step"] for x in again] == [12] and len(watch.monitors) == 1 and not watch.installed


def test_two_optimizers_two_monitors_and_a_later_one_followed(watch):
    a, b = _net(), _net()
    oa, ob = torch.optim.SGD(a.parameters(), lr=0.01), torch.optim.Adam(b.parameters(), lr=0.01)
    for _ in range(5):
        (a(torch.randn(2, 4)).sum() + b(torch.randn(2, 4)).sum()).backward()
        oa.step()
        ob.step()
        oa.zero_grad()
        ob.zero_grad()
    assert {id(m.model) for m in watch.monitors} == {id(a), id(b)}
    c = _net()
    oc = torch.optim.SGD(c.parameters(), lr=0.01)
    _loop(c, oc, steps=3)
    assert len(watch.monitors) == 3 and watch.monitors[2].model is c
    assert watch.findings() == []


def test_an_optimizer_over_a_watched_model_is_left_to_its_monitor(watch):
    model = _net()
    _loop(model, torch.optim.SGD(model.parameters(), lr=0.01), steps=4)
    _loop(model, torch.optim.SGD(model.parameters(), lr=0.01), steps=4)  # re-created (a second fit())
    assert len(watch.monitors) == 1


def test_no_forward_seen_is_a_note_never_an_exception(watch):
    p = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.SGD([p], lr=0.1)
    for _ in range(FIND_TRIES + 2):
        p.pow(2).sum().backward()
        opt.step()
    assert watch.monitors == []
    assert any("SGD" in n and "not watched" in n for n in watch.notes)


def test_two_top_modules_make_one_model(watch):
    enc, dec = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
    opt = torch.optim.SGD([*enc.parameters(), *dec.parameters()], lr=0.01)
    for _ in range(3):
        dec(enc(torch.randn(2, 4))).sum().backward()
        opt.step()
        opt.zero_grad()
    (mon,) = watch.monitors
    assert isinstance(mon.model, torch.nn.ModuleDict) and set(mon.model.values()) == {enc, dec}
    assert {n for n, _ in mon.model.named_parameters()} == {"linear.weight", "linear.bias", "linear1.weight",
                                                             "linear1.bias"}


def test_a_compiled_model_is_found_and_unwrapped(watch):
    model = _net()
    compiled = torch.compile(model, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*global hooks")  # (catch_warnings drops the install's filter)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(3):
            compiled(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    (mon,) = watch.monitors  # found as the OptimizedModule that ran; the Monitor unwraps it
    assert mon.model is model and mon.step_count == 3


def test_the_forward_hook_is_removed_once_every_optimizer_is_watched_and_comes_back_for_a_new_one(watch):
    from torch.nn.modules.module import _has_any_global_hook  # noqa: PLC2701 - torch's own test of its fast path

    model = _net()
    _loop(model, torch.optim.SGD(model.parameters(), lr=0.01), steps=3)
    assert len(watch.monitors) == 1 and not _has_any_global_hook()  # module calls take torch's fast path
    late = _net()
    _loop(late, torch.optim.Adam(late.parameters(), lr=0.01), steps=4)  # created later: followed all the same
    assert len(watch.monitors) == 2 and watch.monitors[1].model is late and not _has_any_global_hook()
