"""Hazard probes armed on demand (issue 16, docs/hazards.md "Armed on demand"): under
``Monitor(every=100)`` most steps run without module or saved-tensor hooks, and a hazard
planted on such a step is still found at its step; the soak re-runs a failing step armed.
Real loops, real torch, CPU, one thread."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import optcheck  # noqa: E402
from conftest import SMALL, run_clis  # noqa: E402
from optcheck.config import ChecksConfig, DataConfig, ModelConfig, OptimizerConfig, RunConfig, SoakConfig  # noqa: E402
from optcheck.pytorch.train import Trainer  # noqa: E402
from optcheck.record.snapshot import read_jsonl  # noqa: E402
from optcheck.drivers.worker_loop import StepStopped  # noqa: E402

BUG_AT = 37


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


class Net(nn.Module):
    """Two blocks and a head; ``inplace_at`` / ``detach_from`` plant a bug from a step on,
    set by the loop (an attribute read in forward: no structural change)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.mid = nn.Linear(16, 16)
        self.head = nn.Linear(16, 1)
        self.write = False
        self.cut = False

    def forward(self, x):
        h = self.inp(x)
        if self.cut:
            h = h.detach()  # the layers before it get no gradient
        s = torch.sigmoid(self.mid(h))
        if self.write:
            s.mul_(2.0)  # sigmoid saved its output for backward
        return self.head(s)


def loop(tmp_path, steps=60, bug=None, every=100, frozen=False, **kw):
    """Returns (monitor, exception, findings from findings.jsonl). ``frozen``: the optimizer
    also holds a parameter that never requires grad (a param group of its own)."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if frozen:
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(3), requires_grad=False)]})
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    mon = optcheck.Monitor(model, opt, every=every, out=str(tmp_path / "run"), on_finding="ignore", **kw)
    exc = None
    try:
        for step in range(1, steps + 1):
            model.write = bug == "inplace" and step == BUG_AT
            model.cut = bug == "cut" and step >= BUG_AT
            loss = F.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    except StepStopped as e:
        exc = e
    mon.close()
    return mon, exc, list(read_jsonl(tmp_path / "run" / "findings.jsonl"))


def test_a_clean_loop_runs_armed_on_the_first_step_and_after_each_snapshot(tmp_path):
    mon, exc, found = loop(tmp_path, steps=250)
    hz = mon.summary()["hazards"]
    assert exc is None and found == []
    assert hz["mode"] == "auto" and hz["steps"] == 250 and hz["stays_armed"] is None
    assert hz["armed_steps"] == 3 and hz["reasons"] == {"start": 1, "snapshot": 2}  # steps 1, 101, 201
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["hazards"] == hz


def test_inplace_on_an_unarmed_step_is_found_by_pytorchs_check_at_its_step(tmp_path):
    mon, exc, found = loop(tmp_path, bug="inplace")
    assert isinstance(exc, StepStopped) and isinstance(exc.__cause__, RuntimeError)
    assert "modified by an inplace operation" in str(exc.__cause__)
    d = exc.event["detail"]
    assert d["found_by"] == "pytorch" and d["armed"] is False  # PyTorch's own check fired, not the probes
    assert d["tensor"]["grad_fn"] == "Sigmoid" and d["tensor"]["shape"] == [32, 16]  # PyTorch's words
    assert (d["saved_version"], d["version"]) == (0, 1)
    (f,) = [f for f in found if f["code"] == "OC301"]
    assert f["step"] == BUG_AT and str(exc) == f"step {f['step']}: {f['message']}"
    # the write is inside the model's forward: the armed re-run of that forward names the op and the line
    assert d["rerun"] == "forward" and d["written"]["op"] == "mul_" and d["written"]["code"].startswith("s.mul_(2.0)")
    assert f"at {d['written']['where']}: s.mul_(2.0)" in f["message"] and "did not watch" in f["message"]
    assert d["saved_by"]["op"] == "SigmoidBackward0" and d["saved_by"]["module"] == "Net"
    assert mon.summary()["hazards"]["armed_steps"] == 1  # step 1 only: step 37 ran unarmed


@pytest.mark.parametrize("hazards", ["auto", "always"])
def test_a_step_stopped_armed_is_counted_in_the_summary(tmp_path, hazards, monkeypatch):
    """A write caught at step 1 (armed: the first step) stops it before its optimizer step:
    summary.json's hazards count it, armed (issue 46: they read 0 of 0)."""
    monkeypatch.setitem(globals(), "BUG_AT", 1)
    mon, exc, found = loop(tmp_path, steps=3, bug="inplace", hazards=hazards)
    assert isinstance(exc, StepStopped) and exc.event["step"] == 1
    hz = json.loads((tmp_path / "run" / "summary.json").read_text())["hazards"]
    assert (hz["armed_steps"], hz["steps"]) == (1, 1) and sum(hz["reasons"].values()) == 1, hz


def test_always_arms_every_step_and_names_the_write_site(tmp_path):
    mon, exc, found = loop(tmp_path, bug="inplace", hazards="always")
    assert isinstance(exc, StepStopped) and exc.event["detail"].get("found_by") is None
    (f,) = [f for f in found if f["code"] == "OC301"]
    assert f["step"] == BUG_AT and "s.mul_(2.0)" in f["message"]
    hz = mon.summary()["hazards"]
    assert hz["mode"] == "always" and hz["armed_steps"] == hz["steps"] == BUG_AT  # the stopped step too (issue 46)


@pytest.mark.parametrize("frozen", [False, True], ids=["one-map-shared", "own-maps"])
def test_a_partial_cut_from_an_unarmed_step_on_is_named_at_its_first_step(tmp_path, frozen):
    """Which parameters got a gradient in each backward pass: read once per pass by the
    gradient-flow probe and shared with the hazard probes when both watch the same parameters
    (issue 34); with a frozen member in the optimizer the gradient-flow probe watches fewer,
    and the hazard probes map the gradients themselves. The cut is named at the same step."""
    mon, exc, found = loop(tmp_path, bug="cut", frozen=frozen)
    members = tuple(id(p) for g in mon.optimizer.param_groups for p in g["params"])
    assert (mon.grad_clear.ids == members) is not frozen
    assert exc is None
    cuts = [f for f in found if f["code"] == "OC203"]
    assert cuts and cuts[0]["step"] == BUG_AT, found
    f = cuts[0]
    assert f["detail"]["module"] == "mid" and f["detail"]["named_at_step"] == BUG_AT + 1
    assert set(f["subjects"]) == {"inp.weight", "inp.bias"} and "test_hazards_arming.py:" in f["message"]
    hz = mon.summary()["hazards"]
    assert hz["reasons"].get("gradient-arrival") == 1  # armed once for the new gradless set, not per step
    events = [e for snap in read_jsonl(tmp_path / "run" / "snapshots.jsonl") for e in snap.get("events", [])
              if e["kind"] == "graph_cut"]
    # the armed step 38 named it (a hazard snapshot at once); the unarmed steps 39-60 merged into one event
    assert [(e["step"], e["count"], e["detail"].get("last_step")) for e in events] == [(37, 1, None), (39, 22, 60)]


@pytest.mark.parametrize("hazards,found", [(True, False), ("always", True)])
def test_a_one_off_cut_is_what_auto_misses_and_always_finds(tmp_path, hazards, found):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with optcheck.Monitor(model, opt, every=100, on_finding="ignore", hazards=hazards) as mon:
        for step in range(1, 50):
            model.cut = step == BUG_AT  # gradless on one step only: fine again on the armed step after it
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert [(f.code, f.step) for f in mon.findings] == ([("OC203", BUG_AT)] if found else [])


def test_clean_loop_without_the_bug_is_silent_and_arms_no_more(tmp_path):
    mon, exc, found = loop(tmp_path, steps=60)
    assert exc is None and found == [] and mon.summary()["hazards"]["armed_steps"] == 1


class AuxNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)
        self.aux = nn.Linear(32, 3)

    def forward(self, x, aux=False):
        h = self.body(x)
        return self.aux(h) if aux else self.head(h)


def test_an_auxiliary_head_trained_on_some_steps_rearms_once_per_gradless_set(tmp_path):
    torch.manual_seed(0)
    model = AuxNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 10), torch.randint(0, 3, (64,))
    with optcheck.Monitor(model, opt, every=100, on_finding="ignore") as mon:
        for step in range(1, 41):
            loss = F.cross_entropy(model(x), y)
            if step % 4 == 0:
                loss = loss + 0.5 * F.cross_entropy(model(x, aux=True), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    hz = mon.summary()["hazards"]
    assert mon.findings == []
    # step 5 lost aux's gradients -> step 6 armed, confirmed clean; steps 9, 13, ... arm nothing
    assert hz["reasons"] == {"start": 1, "gradient-arrival": 1} and hz["armed_steps"] == 2


class CkptBlock(nn.Module):
    def __init__(self, d, net):
        super().__init__()
        self.qk = nn.Linear(d, d)
        self.net = [net]  # a plain list: not a sub-module

    def forward(self, x):
        T = x.size(1)
        keep = self.net[0].mask[:T, :T]
        att = F.softmax(self.qk(x) @ x.transpose(-2, -1), -1) * keep
        if self.net[0].write:
            keep.masked_fill_(keep == 0, 0.0)  # idempotent, but a write: the version moves
        return x + att @ x


class CkptNet(nn.Module):
    """Blocks under a non-reentrant checkpoint; with ``write`` set, a cached mask saved for
    backward is refreshed in place after use (PyTorch is silent in the recompute)."""

    def __init__(self, d=16, T=8):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(T, T)), persistent=False)
        self.blocks = nn.ModuleList([CkptBlock(d, self) for _ in range(2)])
        self.head = nn.Linear(d, 1)
        self.write = False

    def forward(self, x):
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
        return self.head(x).mean()


def test_a_non_reentrant_checkpoint_keeps_the_probes_armed_and_finds_a_later_silent_write():
    torch.manual_seed(0)
    model = CkptNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8, 16)
    exc = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with optcheck.Monitor(model, opt, every=100, on_finding="ignore") as mon:
                for step in range(1, 31):
                    model.write = step >= 20
                    loss = model(x).pow(2)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
        except StepStopped as e:
            exc = e
    assert exc is not None
    (f,) = [f for f in mon.findings if f.code == "OC301"]
    assert f.step == 20 and f.detail["phase"] == "backward (recompute)" and "silently" in f.next_failure
    hz = mon.summary()["hazards"]
    assert hz["stays_armed"] == "checkpoint (non-reentrant)" and hz["armed_steps"] == hz["steps"] == 20  # 20 stopped


# --------------------------------------------------------------------------- the soak's replay
def soak_trainer(mode="auto"):
    cfg = SoakConfig(model=ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=32),
                     optimizer=OptimizerConfig(warmup_steps=1), data=DataConfig(batch_size=4), run=RunConfig(steps=20),
                     checks=ChecksConfig(hazards=mode))
    return Trainer(cfg, vocab_size=256)


def one_off_inplace(trainer, logits, loss):
    if trainer.step_now == 5:
        s = torch.sigmoid(logits)
        s.mul_(2.0)  # a one-off in-place write to sigmoid's saved output
        loss = loss + 0.0 * s.mean()
    return loss


def train(tr, steps, hook=None):
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (4, 32)), rng.integers(0, 256, (4, 32))
    if hook is not None:
        tr.extra_forward.append(hook)
    for step in range(1, steps + 1):
        tr.step_now = step
        tr.train_step(step, x, y)


def test_the_soak_replays_an_unarmed_step_and_names_the_write_site():
    tr = soak_trainer()
    with pytest.raises(StepStopped) as exc:
        train(tr, 8, one_off_inplace)
    d = exc.value.event["detail"]
    assert exc.value.event["step"] == 5 and d["replayed"] and d["written"]["code"].startswith("s.mul_(2.0)")
    assert exc.value.event["where"].startswith("test_hazards_arming.py:")
    assert "is at version 1; expected version 0 instead." in d["pytorch_error"]  # what PyTorch said at step 5
    # step 5 did not step, but it was stopped: counted (issue 46), armed by the replay that named the write
    assert tr.hazards.stats()["reasons"] == {"start": 1, "replay": 1}


def test_the_soak_replays_a_one_off_cut_at_its_step():
    tr = soak_trainer()
    handle = tr.model.ln_f.register_forward_hook(
        lambda m, a, out: out.detach() if tr.step_now == 6 else None)  # a one-off cut, no structural change
    train(tr, 8)
    handle.remove()
    (ev,) = [e for e in tr.hazards.drain() if e["kind"] == "graph_cut"]
    assert ev["step"] == 6 and ev["detail"]["first_module"]["module"] == "ln_f" and ev["count"] == 1
    assert "named_at_step" not in ev["detail"]
    assert tr.hazards.stats()["reasons"] == {"replay": 1, "start": 1}


def test_soak_summary_reports_the_armed_steps(tmp_path):
    done = run_clis({mode: ["soak", "-q", "--steps", "40", "--every", "20", "--hazards", mode,
                            "--out", str(tmp_path / mode), *SMALL] for mode in ("auto", "always")})
    auto = json.loads((tmp_path / "auto" / "summary.json").read_text())
    always = json.loads((tmp_path / "always" / "summary.json").read_text())
    assert done["auto"][0] == done["always"][0] == 0
    assert auto["hazards"] == {"mode": "auto", "armed_steps": 2, "steps": 40, "reasons": {"start": 1, "snapshot": 1},
                               "stays_armed": None}  # steps 1 and 21 (after the snapshot at step 20)
    assert always["hazards"] == {"mode": "always", "armed_steps": 40, "steps": 40, "reasons": {"always": 40},
                                 "stays_armed": None}


def test_soak_rejects_an_unknown_hazard_mode(tmp_path):
    done = run_clis({"bad": ["soak", "--steps", "5", "--hazards", "sometimes", "--out", str(tmp_path / "x")]})
    code, out, err = done["bad"]
    assert code == 2 and "sometimes" in err and "Traceback" not in err and not (tmp_path / "x").exists()


def test_monitor_rejects_an_unknown_hazard_mode():
    model = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="hazards must be"):
        optcheck.Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), hazards="sometimes")


def test_without_zero_grad_the_soak_does_not_replay_and_pytorchs_check_still_stops_the_step():
    tr = soak_trainer()
    tr.zero_grad = False  # the no-zero-grad scenario: clearing .grad for a replay would change the step
    with pytest.raises(StepStopped) as exc:
        train(tr, 8, one_off_inplace)
    d = exc.value.event["detail"]
    assert exc.value.event["step"] == 5 and d["found_by"] == "pytorch" and "replayed" not in d
    # the forward re-run (no gradient touched) saw no write inside the model: the hook writes after it
    assert d["rerun"] == "forward: no write seen" and "outside it" in str(exc.value)
    assert "modified by an inplace operation" in str(exc.value.__cause__)


def nan_loss_at_4(trainer, logits, loss):
    return loss * float("nan") if trainer.step_now == 4 else loss


def test_a_nan_gradient_in_the_soak_is_named_from_the_clipped_norm():
    tr = soak_trainer()
    assert tr.hazards.grad_check_every == 0  # no second pass over the gradients: clip_grad_norm_'s norm
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (4, 32)), rng.integers(0, 256, (4, 32))
    tr.extra_forward.append(nan_loss_at_4)
    events = {}
    for step in range(1, 6):
        tr.step_now = step
        tr.train_step(step, x, y)
        events[step] = {(e["kind"], e["detail"]["what"]) for e in tr.hazards.drain()}
    assert ("nonfinite", "grad") in events[4] and ("nonfinite", "loss") in events[4]
    assert not events[3]


def test_monitor_load_state_dict_and_a_replaced_forward_arm_the_next_step(tmp_path):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with optcheck.Monitor(model, opt, every=100, on_finding="ignore") as mon:
        for step in range(1, 41):
            if step == 10:
                mon.load_state_dict(mon.state_dict())  # a resume: the next step is armed
            if step == 20:
                inner = model.mid.forward
                model.mid.forward = lambda h: inner(h) * 1.0  # a wrapper on the instance: a changed structure
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    hz = mon.summary()["hazards"]
    assert mon.findings == [] and hz["reasons"] == {"start": 1, "resume": 1, "structure": 1}, hz


class TwoHeads(nn.Module):
    """Two heads of the same shape: the loop picks which one a step trains."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.a, self.b = nn.Linear(16, 1), nn.Linear(16, 1)
        self.use = "a"

    def forward(self, x):
        return getattr(self, self.use)(torch.tanh(self.body(x)))


@pytest.mark.parametrize("micro", [1, 2])
def test_arrival_moving_to_as_many_other_parameters_arms_the_next_step(micro):
    """Head ``a`` trains for 7 steps, then head ``b`` (as many parameters, other ones): the
    step after the switch is armed for the gradient arrival once. The one-pass arrival list
    is compared by value with the last step's (same length, other indices) and, with two
    micro-batches a step, as a set."""
    torch.manual_seed(0)
    model = TwoHeads()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with optcheck.Monitor(model, opt, every=100, on_finding="ignore") as mon:
        for step in range(1, 20):
            model.use = "a" if step < 8 else "b"
            opt.zero_grad()
            for _ in range(micro):
                F.mse_loss(model(x), y).backward()
            opt.step()
    hz = mon.summary()["hazards"]
    assert mon.findings == []
    assert hz["reasons"] == {"start": 1, "gradient-arrival": 1} and hz["armed_steps"] == 2, hz


class _CutUnderNoGrad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        with torch.no_grad():  # the cast-under-no_grad of seed 002, on a Linear
            return self.lin(x)


@pytest.mark.parametrize("cut_steps, first", [((0, 1), 1), ((), None)])
def test_a_graph_cut_that_comes_back_is_one_oc203(tmp_path, cut_steps, first):
    """Issue 48 point 7: a partial cut at steps 1–2 and again at 31–32 (gradients in between) was two OC203
    (step 1, and step 40 with first_step 31); one cut at one module is one finding, at its first step. The
    same loop without the cut: none."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), _CutUnderNoGrad(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with optcheck.Monitor(model, opt, every=10, out=str(tmp_path / "run")):
            for step in range(60):
                x = torch.randn(4, 8)
                if step % 30 in cut_steps:
                    y = model(x)
                else:
                    y = model[2](torch.relu(model[1].lin(model[0](x))))
                loss = y.pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    cuts = [f for f in read_jsonl(tmp_path / "run" / "findings.jsonl") if f["code"] == "OC203"]
    if first is None:
        assert cuts == []
    else:
        assert [(f["step"], f["detail"]["module"], f["detail"]["cut"]) for f in cuts] == [(first, "1.lin", "partial")]
