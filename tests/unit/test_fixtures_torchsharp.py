"""The reference rules on real TorchSharp records (``tests/fixtures/torchsharp``): the
0.99.6 records, converted to schema 1 by the same code as a live TorchSharp worker, and
optcheck's own run directories recorded on TorchSharp 0.107.0 (``0.107.0-runs/``,
whose README says what each run did)."""

from __future__ import annotations

import re

import pytest

from optcheck.engine import check_stream
from optcheck.record.snapshot import SCHEMA, validate
from optcheck.torchsharp_bridge.fixtures import fixture_dir, load_all


def test_the_fixtures_are_in_the_repository():
    d = fixture_dir()
    assert d is not None and d.name == "torchsharp" and d.parent.name == "fixtures"
    assert len(list(d.glob("torchsharp-0.99.6-*.jsonl"))) == 5
    assert (d / "README.md").is_file() and (d / "0.107.0-runs" / "README.md").is_file()


@pytest.fixture(scope="module")
def runs():
    return load_all()


def test_all_five_fixtures_convert_to_schema_1(runs):
    assert set(runs) == {"clean", "to-float64", "head-weight-assign", "eager-to-float64", "tied"}
    for name, run in runs.items():
        assert run.snapshots, name
        for snap in run.snapshots:
            validate(snap)
            assert snap["schema"] == SCHEMA and snap["backend"] == "torchsharp"
            assert snap["optimizer"] == {"type": "AdamW", "state_init": "eager"}
            assert len(snap["params"]) == 29
            assert [len(g["members"]) for g in snap["groups"]] == [11, 18]
            assert snap["groups"][0]["options"]["betas"] == [0.9, 0.95]
            assert snap["groups"][0]["options"]["weight_decay"] == 0.1
            assert snap["groups"][1]["options"]["weight_decay"] == 0
            assert all(p["dtype"] in ("float32", "float64") for p in snap["params"])
            assert snap["memory"]["rss_bytes"] > 0 and snap["memory"]["live_tensors"] > 0


def test_the_fault_snapshot_is_pre_step(runs):
    run = runs["to-float64"]
    fault_step = run.faults[0]["step"]
    pre = [s for s in run.snapshots if s["phase"] == "pre-step"]
    assert [s["step"] for s in pre] == [fault_step]
    assert pre[0]["trigger"] == "check" and pre[0]["loss"] is None


def test_clean_is_silent(runs):
    assert check_stream(runs["clean"].snapshots) == []


@pytest.mark.parametrize("scenario", ["to-float64", "head-weight-assign"])
def test_missing_state_predicts_the_exact_key_of_the_exception(runs, scenario):
    run = runs[scenario]
    exc = run.exceptions[0]
    assert exc["type"] == "System.Collections.Generic.KeyNotFoundException"
    key = re.search(r"'(\d+)'", exc["message"]).group(1)
    found = [f for f in check_stream(run.snapshots) if f.code == "OC108"]
    assert len(found) == 1
    f = found[0]
    assert f.step == exc["step"] and f.phase == "pre-step"       # flagged before the step that throws
    assert f.detail["predicted_key"] == key
    assert f.detail["predicted_exception"] == exc["type"]
    assert key in f.message


def test_head_weight_assign_names_only_the_head(runs):
    found = check_stream(runs["head-weight-assign"].snapshots)
    assert {f.code for f in found} == {"OC103", "OC104", "OC108"}
    for f in found:
        assert f.subjects == ["lm_head.weight"], f


def test_eager_flags_exactly_the_two_plain_fields(runs):
    """29 handles changed, 27 still share the model's data: only ln_f.weight/bias are lost."""
    run = runs["eager-to-float64"]
    found = check_stream(run.snapshots)
    assert found, "the lost ln_f parameters must be flagged"
    assert {s for f in found for s in f.subjects} == {"ln_f.weight", "ln_f.bias"}
    assert {f.code for f in found} >= {"OC101", "OC102"}
    assert all(f.step == 20 and f.phase == "pre-step" for f in found)
    assert not any(f.code == "OC108" for f in found)   # nothing throws in the eager case
    # the trap: the handles of all 29 changed
    before, after = run.snapshots[1], run.snapshots[2]
    assert sum(a["ref"] != b["ref"] for a, b in zip(before["params"], after["params"])) == 29


def test_tied_is_a_duplicate_by_data_pointer(runs):
    found = check_stream(runs["tied"].snapshots)
    assert [f.code for f in found] == ["OC106"]
    assert set(found[0].subjects) == {"wte.weight", "lm_head.weight"}
    snap = runs["tied"].snapshots[0]
    refs = {p["name"]: p["ref"] for p in snap["params"]}
    assert refs["wte.weight"] != refs["lm_head.weight"]            # two handles ...
    ptrs = {p["name"]: p["data_ptr"] for p in snap["params"]}
    assert ptrs["wte.weight"] == ptrs["lm_head.weight"]            # ... one tensor


# --- optcheck's own run directories on TorchSharp 0.107.0 (0.107.0-runs/README.md) ---------

import json  # noqa: E402

from optcheck.commands.check import check_file  # noqa: E402
from optcheck.findings import lead_time  # noqa: E402
from optcheck.torchsharp_bridge.fixtures import run_dirs_0107  # noqa: E402

#: What the README of 0.107.0-runs says each run found, and the step: for the runs whose
#: findings the README takes as right, the codes exactly; for eager-param-list the codes
#: once a disposed member is its own state (OC109; the README's 8 findings held artefacts
#: of handle 0: OC101 on "<ref 0>", OC105, OC106, OC108 for key 0, and OC103 calling the
#: disposed members' state orphaned).
EXPECTED_0107 = {
    "clean-1000": set(),
    "lifecycle-3000": set(),
    "module-to-after-optimizer-1000": {"OC103", "OC104", "OC108"},
    "param-replaced-1000": {"OC103", "OC104", "OC108"},
    "param-registered-late-1000": {"OC108"},
    "eager-param-list-1000": {"OC102", "OC104", "OC107", "OC109"},
}
#: Memory runs: the README's step of the first memory finding, which an earlier finding may beat.
MEMORY_0107 = {"state-leak-500": (500, 1400), "no-dispose-scope-500": (500, 2100)}


@pytest.fixture(scope="module")
def runs_0107():
    dirs = run_dirs_0107()
    assert set(dirs) == set(EXPECTED_0107) | set(MEMORY_0107)
    out = {}
    for name, d in dirs.items():
        findings, defects, n = check_file(d)
        assert not defects and n >= 11, name
        out[name] = (d, findings, json.loads((d / "summary.json").read_text()))
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED_0107))
def test_0107_run_gives_the_findings_its_readme_expects(runs_0107, name):
    d, findings, summary = runs_0107[name]
    assert summary["versions"]["torchsharp"] == "0.107.0"
    assert {f.code for f in findings} == EXPECTED_0107[name]
    injected = [e["step"] for e in summary["config"].get("inject") or []] or \
        [int(s.split("@")[1]) for s in summary.get("inject") or []]
    for f in findings:
        assert [f.step] == injected and f.phase == "pre-step", f    # at the planted step, before it runs
        assert not any(s.startswith("<ref") for s in f.subjects), f


@pytest.mark.parametrize("name", ["module-to-after-optimizer-1000", "param-replaced-1000",
                                  "param-registered-late-1000"])
def test_0107_findings_are_those_the_run_recorded_and_predict_the_thrown_key(runs_0107, name):
    d, findings, summary = runs_0107[name]
    recorded = [json.loads(line) for line in (d / "findings.jsonl").read_text().splitlines() if line.strip()]
    assert [(f.code, f.step, f.subjects) for f in findings] == [(r["code"], r["step"], r["subjects"])
                                                                for r in recorded]
    crash = summary["crash"]
    oc108 = next(f for f in findings if f.code == "OC108")
    assert crash["exc_type"] == oc108.detail["predicted_exception"] == "System.Collections.Generic.KeyNotFoundException"
    assert f"'{oc108.detail['predicted_key']}'" in crash["message"]
    assert lead_time([f.to_dict() for f in findings], crash)["predicted"] is True


def test_0107_eager_param_list_names_the_disposed_members_and_the_exception(runs_0107):
    d, findings, summary = runs_0107["eager-param-list-1000"]
    by = {f.code: f for f in findings}
    oc109 = by["OC109"]
    # named by the name each member had at step 900, the last snapshot where it was alive
    assert len(oc109.subjects) == 26 and len(set(oc109.subjects)) == 26
    assert set(oc109.subjects) == set(by["OC104"].subjects) == set(by["OC102"].subjects)
    assert oc109.subjects[0] == "h.0.attn.c_attn.weight" and "ln_f.bias" in oc109.subjects
    assert "wte.weight" not in oc109.subjects                        # wte/wpe were not disposed
    # the exception it predicts is the one the run threw, at zero_grad()
    crash = summary["crash"]
    assert crash["exc_type"] == oc109.detail["predicted_exception"] == "System.InvalidOperationException"
    assert "zero_grad" in crash["where"] and "empty handle" in crash["message"]
    assert "InvalidOperationException" in oc109.message and "zero_grad()" in oc109.message
    assert "InvalidOperationException" in by["OC104"].next_failure        # not KeyNotFoundException
    lt = lead_time([f.to_dict() for f in findings], crash)
    assert lt["finding"] == "OC109 disposed-param" and lt["predicted"] is True
    # what the run itself recorded before (the artefacts of handle 0) is gone
    recorded = {json.loads(line)["code"] for line in (d / "findings.jsonl").read_text().splitlines()}
    assert recorded - {f.code for f in findings} == {"OC101", "OC103", "OC105", "OC106", "OC108"}
    assert len(findings) == 4 and len(recorded) == 8
    # the state OC103 called orphaned is the disposed members' own: their handles at step 900
    assert sorted(oc109.detail["former_refs"]) == sorted(
        json.loads(line)["detail"]["refs"] for line in (d / "findings.jsonl").read_text().splitlines()
        if json.loads(line)["code"] == "OC103")[0]


@pytest.mark.parametrize("name", sorted(MEMORY_0107))
def test_0107_memory_run_is_flagged_after_the_plant_and_no_later_than_recorded(runs_0107, name):
    d, findings, summary = runs_0107[name]
    planted, by_readme = MEMORY_0107[name]
    mem = [f for f in findings if f.code.startswith("OC4")]
    assert mem, name
    assert planted < mem[0].step <= by_readme
    assert not [f for f in findings if not f.code.startswith("OC4")]
