"""optcheck.torchsharp_bridge.convert: the .NET probe's flat arrays -> a schema-1 body."""

from __future__ import annotations

import math

import pytest

from optcheck.torchsharp_bridge.convert import body_from_arrays, group_options, name_members


def arrays(**over):
    a = {
        "ParamNames": ["wte.weight", "ln_f.weight"], "ParamHandles": [100, 200], "ParamDataPtrs": [1000, 2000],
        "ParamFlags": [7, 3], "ParamGradNorms": [0.5, math.nan], "ParamRanks": [2, 1], "ParamShapes": [256, 16, 16],
        "ParamDTypes": ["Float32", "float32"], "ParamDevices": ["cpu", "cpu"],
        "GroupSizes": [1, 1], "GroupOptionCounts": [3, 3],
        "GroupOptionNames": ["lr", "beta1", "beta2", "lr", "beta1", "beta2"],
        "GroupOptionValues": [0.01, 0.9, 0.95, 0.01, 0.9, 0.95],
        "MemberNames": ["wte.weight", None], "MemberHandles": [100, 999], "MemberDataPtrs": [1000, 9990],
        "MemberFlags": [3, 3], "MemberRanks": [2, 1], "MemberShapes": [256, 16, 16], "MemberDTypes": ["float32"] * 2,
        "StateReadable": True, "StateKeys": [100, 999], "StateSteps": [5, -1], "StateTensorCounts": [2, 0],
        "StateTensorNames": ["exp_avg", "exp_avg_sq"], "StateTensorRanks": [2, 2],
        "StateTensorShapes": [256, 16, 256, 16], "StateTensorDTypes": ["float32", "float32"],
        "OptimizerType": "AdamW", "LiveTensors": 12, "PeakTensors": -1, "ManagedBytes": 4096, "RssBytes": 1 << 20,
        "Notes": [], "ProbeSeconds": 1e-5,
    }
    a.update(over)
    return a


def test_params_groups_state_memory():
    body = body_from_arrays(arrays())
    p0, p1 = body["params"]
    assert p0 == {"name": "wte.weight", "ref": 100, "data_ptr": 1000, "shape": [256, 16], "dtype": "float32",
                  "device": "cpu", "is_leaf": True, "requires_grad": True, "grad": "set", "grad_norm": 0.5,
                  "version": None}
    assert p1["grad"] == "none" and p1["grad_norm"] is None and p1["shape"] == [16]
    g0 = body["groups"][0]
    assert g0["options"] == {"lr": 0.01, "betas": [0.9, 0.95]}
    assert g0["members"][0]["ref"] == 100 and g0["members"][0]["shape"] == [256, 16]
    assert body["groups"][1]["members"][0]["name"] is None
    assert body["state"][0] == {"ref": 100, "step": 5, "tensors": {"exp_avg": {"shape": [256, 16], "dtype": "float32"},
                                                                   "exp_avg_sq": {"shape": [256, 16], "dtype": "float32"}}}
    assert body["state"][1] == {"ref": 999, "step": None, "tensors": {}}
    assert body["optimizer"] == {"type": "AdamW", "state_init": "eager"}
    assert body["memory"] == {"rss_bytes": 1 << 20, "live_tensors": 12, "managed_bytes": 4096,
                              "state_bytes": 2 * 256 * 16 * 4}


def test_unreadable_state_is_null_with_the_reason():
    body = body_from_arrays(arrays(StateReadable=False, StateKeys=[], StateSteps=[], StateTensorCounts=[],
                                   Notes=["optimizer state not readable: no field '_state' on X"]))
    assert body["state"] is None
    assert body["notes"] == ["optimizer state not readable: no field '_state' on X"]
    assert "state_bytes" not in body["memory"]


def test_arrays_that_disagree_are_named():
    with pytest.raises(ValueError, match="ParamFlags"):
        body_from_arrays(arrays(ParamFlags=[7]))


def test_members_named_from_earlier_snapshots():
    known = {999: "ln_f.bias"}
    body = name_members(body_from_arrays(arrays()), known)
    assert body["groups"][1]["members"][0]["name"] == "ln_f.bias"
    assert known[100] == "wte.weight" and known[200] == "ln_f.weight"


def test_group_options_keep_other_names():
    assert group_options(["lr", "eps", "weight_decay"], [1e-3, 1e-8, 0.1]) == {"lr": 1e-3, "eps": 1e-8,
                                                                              "weight_decay": 0.1}
