"""The reference rules on the real TorchSharp 0.99.6 records (shared/fixtures/torchsharp),
converted to schema 1 by the same code as a live TorchSharp worker."""

from __future__ import annotations

import re

import pytest

from optcheck.engine import check_stream
from optcheck.snapshot import SCHEMA, validate
from optcheck.torchsharp_bridge.fixtures import fixture_dir, load_all

pytestmark = pytest.mark.skipif(fixture_dir() is None, reason="shared/fixtures/torchsharp not present")


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
