"""OC101, OC102 and OC108 on TorchSharp come from the worker's own pre-step check (ProbeCore.PreStepProblems,
dotnet/Probe/ProbeCore.cs), carried in the snapshot's ``prestep_findings``; snapshots without
it (PyTorch, recorded fixtures, runs written before) still get the rule's own derivation."""

from __future__ import annotations

import copy

from snapfactory import clean

from optcheck.engine import check_stream


def ts(prestep=None) -> dict:
    s = clean(step=500, backend="torchsharp")
    s["phase"] = "pre-step"
    if prestep is not None:
        s["prestep_findings"] = prestep
    return s


def oc108(snap: dict) -> list:
    return [f for f in check_stream([snap]) if f.code == "OC108"]


def test_the_csharp_check_decides_oc108_fire():
    s = ts()
    ref = s["params"][1]["ref"]
    s["prestep_findings"] = [{"code": "OC108", "line": f"1 optimizer member(s) have no state, ... key {ref}",
                              "names": ["layer1.weight"], "refs": [ref],
                              "predicted_exception": "System.Collections.Generic.KeyNotFoundException",
                              "predicted_key": str(ref)}]
    # the state still lists every member: only the C# check says one is missing, and that decides
    (f,) = oc108(s)
    assert f.subjects == ["layer1.weight"] and f.detail["predicted_key"] == str(ref) and f.detail["refs"] == [ref]
    assert f.message == (f"1 optimizer member(s) have no state; next step() throws KeyNotFoundException for key "
                         f"{ref}: layer1.weight")
    assert f.detail["predicted_exception"] == "System.Collections.Generic.KeyNotFoundException"


def test_the_csharp_check_decides_oc108_silent():
    s = ts(prestep=[{"code": "OC103", "line": "1 optimizer-state key(s) of no member: 7", "names": ["7"],
                     "refs": [7]}])
    s["state"] = s["state"][:1]   # the Python derivation would fire here; the C# check found no OC108
    assert oc108(s) == []


def test_without_the_csharp_check_the_rule_derives_it():
    s = ts()
    s["state"] = s["state"][:1]
    (f,) = oc108(s)
    assert f.subjects == ["layer1.weight", "layer2.weight"]
    assert f.detail["predicted_key"] == str(s["params"][1]["ref"])
    assert oc108(ts()) == []                                # consistent: silent
    old = copy.deepcopy(s)
    old["prestep_check"] = []                               # the line list older runs recorded: not a decision
    assert [x.subjects for x in oc108(old)] == [f.subjects]


def test_the_schema_holds_prestep_findings():
    import pytest

    from optcheck.record.snapshot import SchemaError, validate

    ok = ts(prestep=[{"code": "OC109", "line": "1 optimizer member(s) are disposed tensors", "names": [], "refs": [],
                      "predicted_exception": "System.InvalidOperationException"}])
    validate(ok)
    bad = ts(prestep=[{"code": "OC999", "line": "?", "names": [], "refs": []}])
    with pytest.raises(SchemaError, match="prestep_findings"):
        validate(bad)


def codes(snap: dict, code: str) -> list:
    return [f for f in check_stream([snap]) if f.code == code]


def test_the_csharp_check_decides_oc101_and_oc102_fire():
    """The snapshot's members and parameters agree; only the C# check says layer1.weight's member
    is stale and layer2.weight untracked, and that decides; the rules name them as they would."""
    s = ts()
    m_ref, p_ref = s["groups"][0]["members"][1]["ref"], s["params"][2]["ref"]
    s["prestep_findings"] = [
        {"code": "OC101", "line": "1 optimizer member(s) are not the model's tensors ...", "names": ["layer1.weight"],
         "refs": [m_ref]},
        {"code": "OC102", "line": "1 trainable model parameter(s) in no param group ...", "names": ["layer2.weight"],
         "refs": [p_ref]}]
    (f101,) = codes(s, "OC101")
    assert f101.subjects == ["layer1.weight"] and f101.detail["refs"] == [m_ref] and f101.detail["groups"] == [0]
    (f102,) = codes(s, "OC102")
    assert f102.subjects == ["layer2.weight"] and f102.detail["refs"] == [p_ref]
    assert f102.message == "1 trainable parameter(s) in no param group, never updated: layer2.weight"


def test_the_csharp_check_decides_oc101_and_oc102_silent():
    s = ts(prestep=[])
    s["params"][1] = {**s["params"][1], "ref": 4242, "data_ptr": 4343}   # derived: OC101 and OC102 would fire
    assert codes(s, "OC101") == [] and codes(s, "OC102") == []
    del s["prestep_findings"]                                           # no C# check: derived
    assert [f.subjects for f in codes(s, "OC101")] == [["layer1.weight"]]
    assert [f.subjects for f in codes(s, "OC102")] == [["layer1.weight"]]
