"""Training recipes that fooled the Monitor (issue 25): optimizers that consume ``.grad``
inside ``step()`` (heavyball), two-step SAM (``first_step()`` / ``second_step()``), fp16
AMP whose GradScaler skips overflowing steps, and an optimizer swapped mid-run. Real
loops with the real libraries; each class has a clean run that must stay silent and a
planted bug that must still be found at its step."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import optcheck

torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 3)
        self.aux = nn.Linear(32, 3) if unused else None  # in the optimizer, never used in forward

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _data(seed=0, n=64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def _codes(mon, severity=None):
    return [(f.code, f.step) for f in mon.findings if severity is None or f.severity == severity]


def _monitor(model, opt, every=10):
    return optcheck.Monitor(model, opt, every=every, on_finding="ignore")


# -- heavyball: .grad consumed and set to None inside step() (OC202) -----------------------
heavyball = pytest.importorskip("heavyball")


def _heavyball_loop(name, unused=False, steps=30):
    torch.manual_seed(0)
    model = Net(unused=unused)
    opt = getattr(heavyball, name)(model.parameters(), lr=1e-3)
    x, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mon = _monitor(model, opt, every=5)
        for _ in range(steps):
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        mon.close()
    return mon, model


@pytest.mark.parametrize("name", ["AdamW", "SOAP", "Muon"])
def test_heavyball_clean_loop_is_silent(name):
    mon, model = _heavyball_loop(name)
    assert model.fc1.weight.grad is None  # what made OC202 fire: nothing to see after step()
    assert _codes(mon) == [], mon.findings


def test_heavyball_parameter_the_forward_never_uses_is_starved():
    mon, _ = _heavyball_loop("AdamW", unused=True)
    starved = [f for f in mon.findings if f.code == "OC202"]
    assert starved and starved[0].step == 15 and set(starved[0].subjects) == {"aux.weight", "aux.bias"}, mon.findings


# -- SAM: first_step()/second_step(), two backward passes per update (OC206, OC10x) ---------
pytorch_optimizer = pytest.importorskip("pytorch_optimizer")


def _sam_loop(opt_name, swap_at=None, steps=40, every=10, **kw):
    torch.manual_seed(0)
    model = Net()
    opt = getattr(pytorch_optimizer, opt_name)(model.parameters(), base_optimizer=torch.optim.SGD, lr=0.05, **kw)
    x, y = _data()
    mon = _monitor(model, opt, every=every)
    for step in range(1, steps + 1):
        if step == swap_at:  # the planted bug: a layer replaced after the optimizer was built
            model.fc2 = nn.Linear(32, 3)
        F.cross_entropy(model(x), y).backward()
        opt.first_step(zero_grad=True)
        F.cross_entropy(model(x), y).backward()
        opt.second_step(zero_grad=True)
    mon.close()
    return mon


@pytest.mark.parametrize("name,kw", [("SAM", {}), ("SAM", {"adaptive": True}), ("FriendlySAM", {})],
                         ids=["SAM", "ASAM", "FriendlySAM"])
def test_two_step_sam_clean_loop_is_silent_and_counts_its_updates(name, kw):
    mon = _sam_loop(name, **kw)
    assert _codes(mon) == [], mon.findings
    assert mon.step_count == 40


def test_two_step_sam_replaced_layer_is_found_at_its_step():
    mon = _sam_loop("SAM", swap_at=21)
    found = {c: s for c, s in _codes(mon)}
    assert found.get("OC102") == 21 or found.get("OC101") == 21, mon.findings
    assert "OC206" not in found


@pytest.mark.parametrize("swap_at", [None, 21], ids=["clean", "layer-replaced"])
def test_heavyball_sam_wrapper_closure_steps(swap_at):
    torch.manual_seed(0)
    model = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = heavyball.SAMWrapper(model.parameters(), wrapped_optimizer=heavyball.AdamW(model.parameters(), lr=1e-3))
    x, y = _data()
    mon = _monitor(model, opt)
    for step in range(1, 41):
        if step == swap_at:
            model.fc2 = nn.Linear(32, 3)

        def closure():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss

        opt.step(closure)
        opt.zero_grad()
    mon.close()
    assert mon.step_count == 40
    if swap_at is None:
        assert _codes(mon) == [], mon.findings
    else:
        assert {c for c, s in _codes(mon) if s == swap_at} >= {"OC101", "OC102"}, mon.findings


# -- fp16 AMP: GradScaler skips the overflowing steps (OC501) -------------------------------
def _amp_loop(scaler_on, steps=30, init_scale=2.0 ** 24):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, enabled=scaler_on)
    x, y = _data(n=128)
    mon = _monitor(model, opt, every=10)
    skipped = 0
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scale = scaler.get_scale() if scaler_on else 1.0
        scaler.scale(loss * (1.0 if scaler_on else 2.0 ** 24)).backward()  # without a scaler: an overflow planted
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        skipped += scaler_on and scaler.get_scale() < scale
    mon.close()
    return mon, skipped, model


def test_fp16_amp_steps_gradscaler_skips_are_not_nan_written():
    mon, skipped, model = _amp_loop(True)
    assert skipped >= 1  # the recipe overflowed at its first steps, by design
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert [c for c, _ in _codes(mon) if c == "OC501"] == [], mon.findings


def test_fp16_overflow_stepped_without_a_scaler_is_nan_written():
    mon, _, model = _amp_loop(False)
    nonfinite = [f for f in mon.findings if f.code == "OC501"]
    # the gradients' overflow is the first: dated at step 1 (read at the next metrics batch, so the
    # findings may be listed in another order: docs/gpu.md)
    assert any(f.step == 1 and f.detail.get("what") == "grad" for f in nonfinite), mon.findings
    assert min(f.step for f in nonfinite) == 1


# -- an optimizer swapped mid-run (OC206, OC209) ----------------------------------------------
def _swap_loop(swap_at=21, steps=40, step_after_swap=True, new_head=False, replace_after=None):
    """AdamW, then at ``swap_at`` a new SGD over ``model.parameters()`` (with ``new_head``: the
    fine-tuning recipe, the head replaced first); the planted bugs: no step after the swap
    (``step_after_swap=False``), a layer replaced at ``replace_after`` without rebuilding the
    optimizer. Returns (the closed Monitor, the optimizer at the end)."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = _data()
    mon = _monitor(model, opt, every=10)
    for step in range(1, steps + 1):
        if step == swap_at:
            if new_head:
                model.fc2 = nn.Linear(32, 3)  # a new head, then the new optimizer over the whole model
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if step == replace_after:
            model.fc1 = nn.Linear(8, 32)  # the bug: the new optimizer still holds the old fc1
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if step < swap_at or step_after_swap:
            opt.step()
    mon.close()
    return mon, opt


def test_optimizer_swapped_mid_run_is_followed_not_reported_as_no_step():
    mon, _ = _swap_loop()
    assert _codes(mon) == [("OC209", 21)], mon.findings
    f = mon.findings[0]
    assert f.severity == "info" and "AdamW" in f.message and "SGD" in f.message
    assert mon.step_count == 40


def test_no_step_after_the_swap_is_still_no_optimizer_step():
    mon, _ = _swap_loop(swap_at=5, steps=60, step_after_swap=False)
    assert "OC206" in [c for c, _ in _codes(mon)], mon.findings


# -- a module registered mid-run writes in place on a saved tensor (OC301, issue item 4) -------
@pytest.mark.parametrize("swap_at", [8, 30])
def test_a_module_swapped_in_mid_run_names_its_write_site_at_its_first_step(swap_at):
    from test_monitor_hazards_wild import Gate, Net as GateNet, run_net

    def swap(model, step):
        if step == swap_at:
            model.blocks[0].ff[1] = Gate()  # ff[1] = MyGate(), between two unarmed steps

    mon, exc = run_net(GateNet(), steps=40, at_step=swap, every=50)
    (f,) = [f for f in mon.findings if f.code == "OC301"]
    assert exc is not None and f.step == swap_at
    assert f.detail["written"]["where"] not in (None, "unknown") and "y.mul_(2.0)" in f.message, f.message
    assert f.detail["written"]["module"] == "blocks.0.ff.1"


# -- nanoGPT's order: Monitor on the plain model, then torch.compile (Dynamo guards on hooks) --
def _compiled_after_monitor(monitor, steps=12):
    from torch._dynamo.utils import counters
    from test_monitor_hazards_wild import Small

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mon = _monitor(model, opt, every=4) if monitor else None  # after the optimizer, before torch.compile
    cmodel = torch.compile(model, backend="aot_eager")  # inductor: a C++ build per graph, minutes here
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    for _ in range(steps):
        loss = F.cross_entropy(cmodel(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if mon is not None:
        mon.close()
    return mon, {k: dict(v) for k, v in counters.items()}


def test_monitor_made_before_torch_compile_adds_no_recompile():
    _, plain = _compiled_after_monitor(False)
    mon, watched = _compiled_after_monitor(True)
    assert _codes(mon) == [] and watched.get("graph_break", {}) == {}
    assert watched["stats"]["unique_graphs"] == plain["stats"]["unique_graphs"] == 1, watched
    assert watched.get("recompiles", {}) == plain.get("recompiles", {})


# -- the swapped-in optimizer is the watched one from its first step (OC101/OC102 read its groups) ---
def test_a_swap_with_a_new_head_is_silent_and_the_new_optimizer_is_read():
    mon, opt = _swap_loop(new_head=True)
    assert _codes(mon) == [("OC209", 21)], mon.findings  # not OC101/OC102: the old AdamW's stale head
    assert mon.optimizer is opt
    summary = mon.summary()
    assert summary["last_step"] == 40
    # the snapshots read SGD's state (momentum_buffer), not AdamW's (exp_avg)
    snap = mon.seq.probe.snapshot_body()
    keys = {k for s in snap["state"] for k in s["tensors"]}
    assert "momentum_buffer" in keys and "exp_avg" not in keys, keys


def test_a_layer_replaced_after_the_swap_is_found_against_the_new_optimizer():
    mon, _ = _swap_loop(new_head=True, replace_after=31)
    codes = _codes(mon)
    assert [c for c in codes if c[1] < 31] == [("OC209", 21)], mon.findings
    assert {c for c, s in codes if s == 31} >= {"OC101", "OC102"}, mon.findings
