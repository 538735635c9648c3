"""Reference rules OC101–OC109 beyond their VALID/INVALID examples (which
``test_rule_fixtures.py`` runs): what the findings say (refs, predicted key, the
names of disposed members), and the rules on a real GPT + AdamW read by the real probe
after each PyTorch scenario.
"""

from __future__ import annotations

import pytest

from optcheck.engine import RuleEngine, check_stream
from snapfactory import at, clean, member, param, state_of


def codes(findings):
    return sorted({f.code for f in findings})


def run(*snaps):
    return check_stream(list(snaps))


@pytest.mark.parametrize("backend", ["pytorch", "torchsharp"])
def test_clean_stream_is_silent(backend):
    s = clean(backend=backend)
    assert run(s, at(s, 200), at(s, 300)) == []


def test_oc103_orphan_state():
    s = clean()
    s["state"].append(state_of(param("gone.weight", 4242)))
    f = [x for x in run(s) if x.code == "OC103"]
    assert f and f[0].detail["refs"] == [4242]


def test_oc104_ref_churn_needs_a_previous_snapshot():
    a = clean(step=100)
    b = at(a, 200)
    b["params"][0] = param("layer0.weight", 9999, 8888)
    assert codes(run(b)) != [] and "OC104" not in codes(run(b))
    f = [x for x in run(a, b) if x.code == "OC104"]
    assert f and f[0].subjects == ["layer0.weight"] and f[0].detail["old_refs"] == [1000]


def test_oc104_silent_when_optimizer_follows():
    # a resumed job: new model and a new optimizer over it
    a = clean(step=100)
    b = clean(step=200)
    for p in b["params"]:
        p["ref"] += 50
        p["data_ptr"] += 50
    b["groups"][0]["members"] = [member(p) for p in b["params"]]
    b["state"] = [state_of(p) for p in b["params"]]
    assert run(a, b) == []


def test_oc106_duplicate_by_data_pointer_not_ref():
    s = clean(backend="torchsharp")
    tied = param("lm_head.weight", 3333, s["params"][0]["data_ptr"])  # second handle, same tensor
    s["params"].append(tied)
    s["groups"][0]["members"].append(member(tied))
    s["state"].append(state_of(tied))
    f = [x for x in run(s) if x.code == "OC106"]
    assert len(f) == 1 and set(f[0].subjects) == {"layer0.weight", "lm_head.weight"}


def test_oc107_state_dtype_mismatch():
    s = clean()
    for p, m in zip(s["params"], s["groups"][0]["members"]):
        p["dtype"] = m["dtype"] = "float64"
    f = [x for x in run(s) if x.code == "OC107"]
    assert f and "dtype float32 vs float64" in f[0].detail["mismatches"][0]["what"]


def test_oc108_missing_state_only_for_eager_optimizers():
    s = clean(backend="torchsharp")
    s["state"] = s["state"][1:]
    f = [x for x in run(s) if x.code == "OC108"]
    assert f and f[0].detail["predicted_key"] == "1000" and "KeyNotFoundException" in f[0].next_failure
    lazy = clean(backend="pytorch")
    lazy["state"] = lazy["state"][1:]  # PyTorch creates state at the first step with a grad
    assert "OC108" not in codes(run(lazy))


def test_engine_reports_a_persisting_condition_once():
    s = clean()
    s["params"].append(param("extra.gain", 7777))
    eng = RuleEngine()
    assert codes(eng.feed(s)) == ["OC102"]
    assert eng.feed(at(s, 200)) == []
    fixed = clean(step=300)
    assert eng.feed(fixed) == []
    assert codes(eng.feed(at(s, 400))) == ["OC102"]  # came back: reported again


# -- real torch ---------------------------------------------------------------

torch = pytest.importorskip("torch")


def _real(inject: str | None):
    from optcheck.config import ChecksConfig, DataConfig, ModelConfig, RunConfig, SoakConfig
    from optcheck.data import load_corpus, BatchSchedule
    from optcheck.pytorch import probe, scenarios
    from optcheck.pytorch.train import Trainer
    from optcheck.record.snapshot import SCHEMA

    torch.set_num_threads(1)
    cfg = SoakConfig(model=ModelConfig(n_layer=1, n_embd=32, block_size=32), data=DataConfig(batch_size=4),
                     run=RunConfig(steps=10), checks=ChecksConfig(hazards="off"))
    corpus = load_corpus()
    sched = BatchSchedule(corpus.train.size, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed)
    tr = Trainer(cfg, corpus.vocab_size, tie_weights=not (inject and scenarios.needs_untied(inject)))

    def snap(step, phase):
        return {"schema": SCHEMA, "backend": "pytorch", "run": "t", "step": step, "phase": phase,
                "trigger": "cadence", **probe.snapshot_body(tr.model, tr.optimizer, census=False), "events": []}

    for step in (1, 2):
        tr.train_step(step, *sched.batch(corpus.train, step))
    snaps = [snap(2, "post-step")]
    if inject:
        scenarios.apply(inject, tr, 3)
        snaps.append(snap(3, "pre-step"))
    return check_stream(snaps)


def test_real_gpt_clean_is_silent():
    assert _real(None) == []


@pytest.mark.parametrize("scenario,expected", [
    ("param-rebind", {"OC101", "OC102", "OC104"}),
    ("tie-after-optimizer", {"OC101"}),
    ("param-replaced", {"OC101", "OC102", "OC104"}),
    ("module-to-after-optimizer", {"OC107"}),
    ("param-registered-late", {"OC102"}),
])
def test_real_gpt_scenarios_are_named(scenario, expected):
    found = _real(scenario)
    assert set(codes(found)) == expected
    if scenario == "param-replaced":
        assert all("h.0.mlp.c_fc.weight" in f.subjects for f in found)
    if scenario == "param-registered-late":
        assert found[0].subjects == ["ln_f.gain"]


# --- OC109 disposed-param: a disposed member is its own state --------------------------------

DISPOSED = {"ref": 0, "data_ptr": 0, "name": None, "shape": [], "dtype": "disposed", "is_leaf": False,
            "requires_grad": False}


def _disposed_after_to_dtype():
    """TorchSharp 0.107 after ``model.to(float64)`` with an eager parameter list: the model
    has new tensors, the optimizer holds the disposed old ones (as the probe records them)."""
    before = clean(step=900, backend="torchsharp")
    after = at(before, 1000)
    after["phase"] = "pre-step"
    after["params"] = [param(p["name"], p["ref"] + 7, p["data_ptr"] + 7, dtype="float64") for p in after["params"]]
    after["groups"][0]["members"] = [dict(DISPOSED) for _ in after["params"]]
    return before, after


def test_oc109_names_disposed_members_by_their_last_names():
    before, after = _disposed_after_to_dtype()
    found = run(before, after)
    oc109 = [f for f in found if f.code == "OC109"]
    assert len(oc109) == 1 and oc109[0].step == 1000
    assert oc109[0].subjects == ["layer0.weight", "layer1.weight", "layer2.weight"]
    assert oc109[0].detail["predicted_exception"] == "System.InvalidOperationException"
    assert "empty handle" in oc109[0].next_failure
    # handle 0 feeds neither the leaf, the duplicate, the stale nor the missing-state rule,
    # and the state the disposed members still own is not orphaned
    assert not {"OC101", "OC103", "OC105", "OC106", "OC108"} & {f.code for f in found}
    assert {f.code for f in found} == {"OC102", "OC104", "OC109"}
    assert not any("<ref" in s for f in found for s in f.subjects)


def test_oc109_without_an_earlier_snapshot_names_the_position():
    _, after = _disposed_after_to_dtype()
    oc109 = [f for f in run(after) if f.code == "OC109"]
    assert oc109[0].subjects == ["group 0 member 0", "group 0 member 1", "group 0 member 2"]


def test_oc109_one_disposed_member_among_live_ones():
    s = clean(backend="torchsharp")
    s2 = at(s, 200)
    s2["groups"][0]["members"][1] = dict(DISPOSED)
    s2["params"][1] = param("layer1.weight", 4242, 4343)
    found = run(s, s2)
    assert [f.subjects for f in found if f.code == "OC109"] == [["layer1.weight"]]


def test_oc103_still_flags_a_real_orphan_beside_a_disposed_member():
    before, after = _disposed_after_to_dtype()
    after["state"].append(state_of(param("gone.weight", 9999)))
    orphans = [f for f in run(before, after) if f.code == "OC103"]
    assert len(orphans) == 1 and orphans[0].detail["refs"] == [9999]


@pytest.mark.parametrize("backend", ["pytorch", "torchsharp"])
def test_oc109_silent_on_a_clean_stream(backend):
    s = clean(backend=backend)
    assert not [f for f in run(s, at(s, 200)) if f.code == "OC109"]


def test_oc107_factored_statistics_are_not_a_shape_mismatch():
    # torch.optim.Adafactor keeps row_var (m, 1) and col_var (1, n) for an (m, n) weight
    s = clean()
    for st in s["state"]:
        st["tensors"] = {"step": {"shape": [], "dtype": "float32"}, "row_var": {"shape": [4, 1], "dtype": "float32"},
                         "col_var": {"shape": [1, 4], "dtype": "float32"}}
    assert run(s) == []
    s["state"][0]["tensors"]["exp_avg"] = {"shape": [6, 4], "dtype": "float32"}  # a resized parameter still is
    (f,) = [x for x in run(s) if x.code == "OC107"]
    assert f.subjects == ["layer0.weight"] and f.detail["mismatches"] == [
        {"name": "layer0.weight", "state": "exp_avg", "what": "shape [6, 4] vs [4, 4]"}]
