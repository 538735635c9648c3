"""optcheck.Monitor on a training loop not written for optcheck (plain_loop.py):
silent when clean, each planted bug named."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")

from optcheck.record.snapshot import read_jsonl  # noqa: E402
from optcheck.drivers.worker_loop import StepStopped  # noqa: E402
from plain_loop import train  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def run(tmp_path, bug, steps=60, every=10):
    out = tmp_path / (bug or "clean")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses, mon = train(bug, steps=steps, monitor_kwargs={"every": every, "out": str(out)})
    shown = [str(w.message) for w in caught if "optcheck:" in str(w.message)]
    found = list(read_jsonl(out / "findings.jsonl"))
    return losses, mon, found, shown, out


def test_clean_loop_has_no_findings_and_writes_a_run(tmp_path):
    losses, mon, found, shown, out = run(tmp_path, None)
    assert found == [] and shown == [] and mon.exit_code == 0
    assert losses[-1] < losses[0] - 0.5
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "clean" and summary["last_step"] == 60 and summary["snapshots"] >= 7
    assert len(list(read_jsonl(out / "metrics.jsonl"))) == 60


def test_without_monitor_the_loop_is_unchanged(tmp_path):
    plain, _ = train(None, steps=20)
    watched, _, _, _, _ = run(tmp_path, None, steps=20)
    assert plain == pytest.approx(watched, abs=1e-6)


@pytest.mark.parametrize("bug,codes,subject", [
    ("param-replaced", {"OC101", "OC102", "OC104"}, "norm.weight"),
    ("partial-optimizer", {"OC102"}, "tok.weight"),
    ("no-zero-grad", {"OC204"}, None),
    ("nonleaf-grad-read", {"OC201"}, None),
    ("lr-explodes", {"OC501"}, None),
    ("unused-layer", {"OC202"}, "aux.weight"),
    ("no-optimizer-step", {"OC206"}, None),
    ("detach-middle", {"OC203"}, "pos.weight"),
    ("zero-grad-before-step", {"OC207"}, None),
    ("double-step", {"OC208"}, None),
])
def test_planted_bug_is_named(tmp_path, bug, codes, subject):
    _, mon, found, shown, _ = run(tmp_path, bug)
    got = {f["code"] for f in found}
    assert codes <= got, found
    assert mon.exit_code == 1 and shown
    if subject:
        assert any(subject in f["subjects"] for f in found if f["code"] in codes)


@pytest.mark.parametrize("bug,code", [("loss-no-grad", "OC203"), ("inplace-saved", "OC301")])
def test_hazard_stops_the_step_and_is_recorded_first(tmp_path, bug, code):
    out = tmp_path / bug
    with pytest.raises(StepStopped):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            train(bug, steps=30, monitor_kwargs={"every": 10, "out": str(out)})
    found = list(read_jsonl(out / "findings.jsonl"))
    assert code in {f["code"] for f in found}
    assert all(f["step"] == 11 for f in found if f["code"] == code)


def test_state_dict_keeps_cadence(tmp_path):
    import optcheck

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = optcheck.Monitor(model, opt, every=5, out=str(tmp_path / "a"))
    for _ in range(7):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    state = mon.state_dict()
    mon.close()
    mon2 = optcheck.Monitor(model, opt, every=5, out=str(tmp_path / "a"), append=True, state=state)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    mon2.close()
    steps = [s["step"] for s in read_jsonl(tmp_path / "a" / "snapshots.jsonl")]
    assert 5 in steps and 10 in steps and steps == sorted(steps)


@pytest.mark.parametrize("kwargs, words", [
    ({"every": "10"}, "every must be a whole number >= 1, got '10'"),
    ({"every": True}, "every must be a whole number >= 1"),
    ({"state": {"x": 1}}, "state must be a Monitor.state_dict()"),
    ({"state": {"step": -1}}, "state must be a Monitor.state_dict()"),
    ({"state": {"step": 3, "every": 0}}, "state['every'] must be a whole number >= 1"),
    ({"state": {"step": 3, "loss_first": "low"}}, "state['loss_first'] must be a number or None"),
])
def test_a_bad_argument_is_one_valueerror_line_and_the_folder_stays_free(tmp_path, kwargs, words):
    import optcheck

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError) as exc:
        optcheck.Monitor(model, opt, out=str(tmp_path / "a"), **kwargs)
    assert words in str(exc.value) and "\n" not in str(exc.value)
    optcheck.Monitor(model, opt, out=str(tmp_path / "a")).close()  # the corrected retry is not refused


@pytest.mark.parametrize("hazards", ["auto", "always", False])
def test_a_graph_kept_with_retain_graph_is_let_go_when_the_user_lets_go_of_it(tmp_path, hazards):
    """A graph kept by ``backward(retain_graph=True)`` is freed as soon as the user drops the loss,
    mid-step, armed or not: the Monitor keeps each step's loss detached, and the armed probes'
    pack records hold a detached alias of what an op saved (tanh saves its own output: the tensor
    itself would tie the graph into a loop the cycle collector cannot see, and it leaked, one
    graph per armed step, on a card its activations)."""
    import weakref

    import torch

    import optcheck

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    freed = []
    with optcheck.Monitor(model, opt, every=5, out=str(tmp_path / "run"), on_finding="ignore", hazards=hazards):
        for _ in range(6):
            h = torch.tanh(model(torch.randn(4, 8)))  # tanh saves its output h for backward
            ref = weakref.ref(h)
            loss = (h * 2).sum()
            del h
            opt.zero_grad()
            loss.backward(retain_graph=True)
            del loss  # the graph (and h in it) has no holder left but a Monitor that kept it
            freed.append(ref() is None)
            opt.step()
    assert all(freed), freed


@pytest.mark.parametrize("hazards", ["auto", False])
def test_a_nan_loss_made_inside_the_users_step_is_found_at_its_step_and_recorded(tmp_path, hazards):
    """The loss and the clip total each go to the ledger once and are read by two checks (the NaN
    check, the step's recorded loss; OC501 and OC207): a NaN made in the user's own step, after
    the forward and before backward, is found at that step and recorded as that step's loss."""
    import math

    import torch

    import optcheck

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with optcheck.Monitor(model, opt, every=5, out=str(tmp_path / "run"), on_finding="ignore",
                          hazards=hazards) as mon:
        for step in range(1, 11):
            loss = torch.nn.functional.mse_loss(model(x), y)
            if step == 7:
                loss = loss * torch.log(torch.tensor(-1.0))  # the user's own bug: NaN, mid-step
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    found = [f for f in mon.findings if f.code == "OC501"]
    assert found and min(f.step for f in found) == 7, [(f.code, f.step, f.detail) for f in mon.findings]
    if hazards:  # the hazard probes check the loss itself; off, the gradients' check names the step
        assert any(f.step == 7 and f.detail.get("what") == "loss" for f in found), found
    from optcheck.record.snapshot import to_float

    losses = {r["step"]: to_float(r["loss"]) for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r}
    assert math.isnan(losses[7]) and all(math.isfinite(losses[s]) for s in range(1, 7)), losses


@pytest.mark.parametrize("clipped,named", [("all", False), ("trainable", False), ("first-layer", True)])
def test_a_nan_gradient_with_a_frozen_member_is_found_from_the_clip_total_or_the_gradients(tmp_path, clipped, named):
    """OC501 before the step: a clip total over every param-group member (one of them frozen
    mid-run), or over those that require grad, stands for every trainable gradient (the finding
    names no parameter: the total was the only read); a clip over one layer does not, and the
    gradients are read one by one (the finding names the parameter). The NaN is written by the
    user's own code between backward and the clip, at step 6."""
    import torch

    import optcheck

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with optcheck.Monitor(model, opt, every=5, out=str(tmp_path / "run"), on_finding="ignore") as mon:
        for step in range(1, 11):
            if step == 3:
                model[0].bias.requires_grad_(False)  # frozen, still a param-group member
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if step == 6:
                with torch.no_grad():
                    model[2].weight.grad[0, 0] = float("nan")  # the user's own bug, mid-step
            params = {"all": list(model.parameters()),
                      "trainable": [p for p in model.parameters() if p.requires_grad],
                      "first-layer": [model[0].weight]}[clipped]
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
    found = [f for f in mon.findings if f.code == "OC501" and f.detail.get("what") == "grad"]
    assert found and min(f.step for f in found) == 6, [(f.code, f.step, f.detail) for f in mon.findings]
    first = min(found, key=lambda f: f.step)
    assert ("2.weight" in first.detail["params"]) is named, first.detail
    if not named:
        assert first.detail["params"] == [], first.detail
