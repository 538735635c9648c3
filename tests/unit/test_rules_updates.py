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


def _fused(values_move: bool, steps_move: bool, dtype="float32", lr=1e-3):
    """Four snapshots of a fused optimizer: the version counter never moves."""
    snaps = _stream(bump=False)
    for i, s in enumerate(snaps):
        s["groups"][0]["options"]["lr"] = lr
        for p in s["params"]:
            p["dtype"] = dtype
            p["checksum"] = 7 + (i if values_move else 0)
        for st in s["state"]:
            st["step"] = 10 * (i + 1) if steps_move else 10
    return snaps


def test_values_that_move_are_an_update_without_a_version_bump():
    # torch.optim.AdamW(fused=True): _version stays put, the values move
    assert check_stream(_fused(values_move=True, steps_move=False)) == []


def test_a_step_count_that_advances_is_an_update_even_when_the_values_round_back():
    # bf16 weights whose updates are below half an ulp; a learning rate of 0 in a fused kernel
    assert check_stream(_fused(values_move=False, steps_move=True, dtype="bfloat16")) == []


def test_fires_when_values_version_and_step_count_all_stay_put():
    found = check_stream(_fused(values_move=False, steps_move=False))
    assert [(f.code, f.step, f.detail["since_step"], len(f.subjects)) for f in found] == [("OC205", 300, 100, 3)]
    assert "from step 100 to step 300" in found[0].message  # the numbers, not the wording


def test_silent_on_learning_rate_zero_and_on_16_bit_params_without_a_step_count():
    assert check_stream(_fused(values_move=False, steps_move=False, lr=0.0)) == []  # warm-up from 0
    snaps = _fused(values_move=False, steps_move=False, dtype="bfloat16")
    for s in snaps:  # SGD without momentum keeps no state: nothing tells a skipped step from a swallowed one
        s["state"] = []
    assert check_stream(snaps) == []


def test_a_new_parameter_on_a_members_storage_is_not_held_on_pytorch():
    # nn.Parameter(old) shares old's storage but is another leaf: the optimizer does not step it
    snaps = _fused(values_move=False, steps_move=False)
    for s in snaps:
        p = s["params"][0]
        p["ref"] += 50_000  # not a member any more; same data pointer
    found = [f for f in check_stream(snaps) if f.code == "OC205"]
    assert found and "layer0.weight" not in found[0].subjects


def _events_stream(kind, steps_field=True):
    snaps = []
    for i, (count, steps) in enumerate([(1, 1), (9, 9), (19, 19)]):
        s = at(clean(), 2 if i == 0 else 10 * i)
        detail = {"shape": [2]} | ({"steps": steps} if steps_field else {})
        s["events"] = [{"kind": kind, "step": 2, "where": None, "count": count, "detail": detail}]
        for p in s["params"]:
            p["version"] = s["step"]
        snaps.append(s)
    return snaps


def test_oc204_counts_steps_and_says_of_how_many():
    found = check_stream(_events_stream("grad_not_cleared"))
    assert [(f.code, f.step) for f in found] == [("OC204", 2)]  # reported once, at the step it was first seen
    assert (found[0].detail["first_step"], found[0].detail["count"], found[0].detail["steps_checked"]) == (2, 1, 1)
    assert "at step 2" in found[0].message and " 1 of " not in found[0].message  # not "1 of the 1" at once
    old = check_stream(_events_stream("grad_not_cleared", steps_field=False))  # a stream recorded before `steps`
    assert [(f.step, f.detail["steps_checked"]) for f in old] == [(2, None)] and "at step 2" in old[0].message


@pytest.mark.parametrize("count,steps,says", [(9, 19, "at 9 of the 19 optimizer steps checked up to step 20"),
                                              (19, 19, "at every one of the 19 optimizer steps checked up to step 20"),
                                              (9, None, "at 9 optimizer step(s) up to step 20")])
def test_oc204_first_seen_before_the_snapshot_says_how_often_since(count, steps, says):
    """The first snapshot after the event (a monitor with every=20): from which step, how often, of how many."""
    s = at(clean(), 20)
    s["events"] = [{"kind": "grad_not_cleared", "step": 2, "where": None, "count": count,
                    "detail": {} if steps is None else {"steps": steps}}]
    (f,) = check_stream([s])
    assert (f.code, f.step, f.detail["first_step"], f.detail["count"]) == ("OC204", 20, 2, count)
    assert "from step 2" in f.message and says in f.message


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("call_step", [True, False])
def test_real_loop_without_optimizer_step(call_step):
    from optcheck.pytorch import probe
    from optcheck.record.snapshot import SCHEMA

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


def test_oc204_on_a_loop_that_never_clears_counts_every_step(tmp_path):
    """Issue 11 item 8: a loop without zero_grad() at any step; the finding names step 2
    (its check is read on the host at the next snapshot, step 10: no sync per step,
    docs/gpu.md) and every snapshot after it carries the running numbers."""
    import optcheck
    from optcheck.record.snapshot import read_jsonl

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with optcheck.Monitor(model, opt, every=10, out=str(tmp_path / "run"), on_finding="ignore") as mon:
        for _ in range(30):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
    found = [f for f in mon.findings if f.code == "OC204"]
    assert [(f.step, f.detail["first_step"], f.detail["count"], f.detail["steps_checked"]) for f in found] \
        == [(10, 2, 9, 9)]
    assert "from step 2" in found[0].message
    last = list(read_jsonl(tmp_path / "run" / "snapshots.jsonl"))[-1]
    ev = next(e for e in last["events"] if e["kind"] == "grad_not_cleared")
    assert last["step"] == 30 and ev["count"] == 29 and ev["detail"]["steps"] == 29


def test_oc201_count_says_over_which_steps():
    """Issue 11 item 8 for OC201: the reads are counted between two snapshots; the message says which steps."""
    s = at(clean(), 20)
    s["events"] = [{"kind": "nonleaf_grad_access", "step": 11, "where": "train.py:88", "count": 10,
                    "detail": {"code": "g = logits.grad", "last_step": 20}}]
    (f,) = [f for f in check_stream([clean(10), s]) if f.code == "OC201"]
    assert (f.step, f.detail["count"], f.detail["first_step"]) == (20, 10, 11) and "11–20" in f.message
    s["events"][0].update(count=1, detail={})
    (f,) = [f for f in check_stream([clean(10), s]) if f.code == "OC201"]
    assert (f.detail["count"], f.detail["first_step"]) == (1, 11) and "11" in f.message and "–" not in f.message
