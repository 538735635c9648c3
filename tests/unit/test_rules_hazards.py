"""Rules OC201, OC202, OC203 (gradients), OC301 (autograd), OC501 (values) on
hand-made snapshots: each fires on its condition and is silent on a clean stream."""

from __future__ import annotations

import json

from snapfactory import clean

from optcheck.engine import RuleEngine, check_stream
from optcheck.rules import RuleConfig
from optcheck.record.snapshot import dumps


def ev(kind, step, where=None, count=1, **detail):
    return {"kind": kind, "step": step, "where": where, "count": count, "detail": detail}


MINE = ("OC201", "OC202", "OC203", "OC301", "OC501")


def codes(findings):
    """Codes of the hazard rules among ``findings`` (other families are tested elsewhere)."""
    return [f.code for f in findings if f.code in MINE]


def stream(n=5, every=100):
    return [clean(step=every * (i + 1)) for i in range(n)]


def test_clean_stream_is_silent_for_every_hazard_rule():
    found = check_stream(stream())
    assert codes(found) == []


def test_oc201_names_the_line_and_count_and_reports_it_once():
    snaps = stream(3)
    for s in snaps[1:]:
        s["events"] = [ev("nonleaf_grad_access", s["step"] - 99, "train.py:88", 99, code="g = logits.grad")]
    eng = RuleEngine()
    new = [eng.feed(s) for s in snaps]
    assert codes(new[0]) == [] and codes(new[2]) == []
    (f,) = [f for f in new[1] if f.code in MINE]
    assert (f.code, f.step, f.detail["count"], f.detail["first_step"]) == ("OC201", 200, 99, 101)
    assert f.subjects == ["train.py:88"] and f.severity == "warning"
    assert "train.py:88" in f.message and "99" in f.message and "g = logits.grad" in f.message


def test_oc202_fires_after_k_post_step_snapshots_without_gradient():
    snaps = stream(4)
    for s in snaps[1:]:
        s["params"][1]["grad"], s["params"][1]["grad_norm"] = "none", None
    eng = RuleEngine(RuleConfig(grad_starved_snapshots=3))
    new = [codes(eng.feed(s)) for s in snaps]
    assert new[:3] == [[], [], []] and "OC202" in new[3]
    f = [f for f in eng.findings if f.code == "OC202"][0]
    assert (f.step, f.subjects, f.detail["snapshots"]) == (400, ["layer1.weight"], [200, 300, 400])


def test_oc202_ignores_frozen_and_pre_step_snapshots():
    snaps = stream(4)
    for s in snaps:
        s["params"][0]["grad"], s["params"][0]["requires_grad"] = "none", False  # frozen: fine
        s["phase"] = "pre-step"
    assert "OC202" not in codes(check_stream(snaps, RuleConfig(grad_starved_snapshots=2)))


def test_oc203_full_and_partial():
    s = clean(step=500)
    s["events"] = [ev("graph_cut", 500, "gpt.py:136", cut="full", n_params_without_grad=28,
                      params_without_grad=["wte.weight", "wpe.weight"],
                      first_module={"module": "wte", "why": "autograd was not recording", "grad_enabled": False},
                      pytorch_error="element 0 of tensors does not require grad and does not have a grad_fn")]
    (f,) = [f for f in check_stream([s]) if f.code == "OC203"]
    assert (f.step, f.detail["cut"], f.detail["module"], f.detail["n_params_without_grad"]) == (500, "full", "wte", 28)
    assert f.subjects == ["wte.weight", "wpe.weight"] and f.detail["grad_enabled"] is False
    assert "gpt.py:136" in f.message and "26" in f.message                 # the line; how many more than named
    assert "element 0 of tensors does not require grad" in f.next_failure  # PyTorch's own error, predicted
    s["events"] = [ev("graph_cut", 500, "gpt.py:87", cut="partial", n_params_without_grad=2,
                      params_without_grad=["h.0.ln_1.weight", "h.0.ln_1.bias"],
                      first_module={"module": "h.0.ln_1", "why": "ran under no_grad", "grad_enabled": True})]
    (f,) = [f for f in check_stream([s]) if f.code == "OC203"]
    assert (f.detail["cut"], f.detail["module"]) == ("partial", "h.0.ln_1")
    assert f.subjects == ["h.0.ln_1.weight", "h.0.ln_1.bias"]
    assert "gpt.py:87" in f.message and "h.0.ln_1" in f.message


def test_oc301_names_saving_op_writer_and_predicted_error():
    s = clean(step=500)
    s["phase"], s["trigger"] = "pre-step", "hazard"
    s["events"] = [ev("inplace_on_saved", 500, "model.py:36", tensor={"type": "torch.FloatTensor", "shape": [8, 16]},
                      saved_version=1, version=2, phase="forward", stopped=True,
                      saved_by={"op": "BmmBackward0", "module": "h.0.attn", "where": "model.py:39"},
                      written={"module": "h.0.attn", "where": "model.py:36", "code": "k = cache.index_copy_(2, pos, k)"},
                      pytorch_error="one of the variables needed ... is at version 2; expected version 1 instead.")]
    (f,) = [f for f in check_stream([s]) if f.code == "OC301"]
    assert (f.step, f.phase, f.subjects, f.detail["stopped"]) == (500, "pre-step", ["h.0.attn"], True)
    assert f.detail["saved_by"]["op"] == "BmmBackward0" and f.detail["written"]["where"] == "model.py:36"
    # the message names the saving op and line, the writing line and statement, and the versions
    for fact in ("BmmBackward0", "model.py:39", "model.py:36", "k = cache.index_copy_(2, pos, k)", "1 -> 2"):
        assert fact in f.message, fact
    assert "expected version 1 instead" in f.next_failure  # PyTorch's own error, predicted
    # predicted at the write: said to be the versions the write left (a later write changes them)
    assert f.next_failure.endswith("PyTorch names the first written tensor backward() unpacks]")
    s["events"][0]["detail"]["found_by"] = "pytorch"  # PyTorch's own message (auto's re-run): quoted as it is
    (f,) = [f for f in check_stream([s]) if f.code == "OC301"]
    assert f.next_failure.endswith("expected version 1 instead.")


def test_oc501_from_events_and_from_a_recorded_stream():
    s = clean(step=300)
    s["events"] = [ev("nonfinite", 297, what="grad", params=["layer0.weight"])]
    (f,) = [f for f in check_stream([s]) if f.code == "OC501"]
    # dated at the step of its cause (a device check read at the next snapshot, docs/gpu.md)
    assert (f.step, f.detail["what"], f.detail["first_step"], f.subjects) == (297, "grad", 297, ["layer0.weight"])
    assert f.detail["read_at_step"] == 300
    assert "297" in f.message and "layer0.weight" in f.message
    # a recorded stream (NaN written as "nan" by dumps) without events
    s = clean(step=300)
    s["loss"] = float("nan")
    s = json.loads(dumps(s))
    assert s["loss"] == "nan"
    (f,) = [f for f in check_stream([s]) if f.code == "OC501"]
    assert f.detail["what"] == "loss"


def _inplace_event(written):
    return ev("inplace_on_saved", 201, written.get("where") or "model.py:40",
              tensor={"type": "torch.FloatTensor", "shape": [4, 16]}, saved_version=0, version=1,
              saved_by={"op": "SigmoidBackward0", "module": "ff.1", "where": "model.py:40",
                        "code": "y = torch.sigmoid(x)"},
              written=written, phase="forward", stopped=True)


def test_oc301_names_the_write_not_the_save_and_matches_describe_inplace():
    from optcheck.rules.autograd import describe_inplace

    snaps = stream(3)
    e = _inplace_event({"module": "ff.1", "where": "model.py:41", "code": "y.mul_(2.0)"})
    snaps[1]["events"] = [e]
    (f,) = [f for f in check_stream(snaps) if f.code in MINE]
    assert f.message == describe_inplace(e)  # the probes' StepStopped and the finding say the same
    assert f.detail["written"]["where"] == "model.py:41" and "model.py:41" in f.message and "y.mul_(2.0)" in f.message


def test_oc301_with_an_unknown_write_site_says_so_and_never_names_the_save_line_as_the_write():
    snaps = stream(3)
    snaps[1]["events"] = [_inplace_event({"module": "ff", "detected_at": "post-hook",
                                          "between": "the return of ff.0 and the return of ff"})]
    (f,) = [f for f in check_stream(snaps) if f.code in MINE]
    assert "not seen" in f.message and "the return of ff.0 and the return of ff" in f.message  # the window it was in
    assert f.message.count("model.py:40") == 1 and "(model.py:40)" in f.message  # the save site, once, as the save site


def test_oc301_under_a_non_reentrant_checkpoint_says_backward_will_not_raise():
    snaps = stream(3)
    e = _inplace_event({"module": "blk", "where": "model.py:41", "code": "keep.masked_fill_(m, 0)"})
    e["detail"].update(phase="backward (recompute)", checkpoint="non-reentrant", pytorch_error=None)
    snaps[1]["events"] = [e]
    (f,) = [f for f in check_stream(snaps) if f.code in MINE]
    assert f.detail["phase"] == "backward (recompute)" and "recompute" in f.message
    assert "raises" not in f.next_failure  # a non-reentrant recompute checks no version counter: no error comes
