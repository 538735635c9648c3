"""optcheck.torchsharp_bridge.convert: the .NET probe's JSON body -> a snapshot body, and
member names from earlier snapshots. (The body's content is the probe's: tests/unit/
test_bridge_json.py checks the writer, tests/integration/test_bridge_worker.py the live body.)"""

from __future__ import annotations

import json
import math

import pytest

from optcheck.torchsharp_bridge.convert import BODY_FIELDS, body_from_json, name_members


def body(**over) -> dict:
    b = {
        "params": [{"name": "wte.weight", "ref": 100, "data_ptr": 1000, "shape": [256, 16], "dtype": "float32",
                    "is_leaf": True, "requires_grad": True, "device": "cpu", "grad": "set", "grad_norm": 0.5,
                    "value_norm": 3.0, "checksum": -7, "version": None},
                   {"name": "ln_f.weight", "ref": 200, "data_ptr": 2000, "shape": [16], "dtype": "float32",
                    "is_leaf": True, "requires_grad": True, "device": "cpu", "grad": "none", "grad_norm": None,
                    "value_norm": 4.0, "checksum": 9, "version": None}],
        "groups": [{"index": 0, "options": {"lr": 0.01, "betas": [0.9, 0.95]},
                    "members": [{"name": "wte.weight", "ref": 100, "data_ptr": 1000, "shape": [256, 16],
                                 "dtype": "float32", "is_leaf": True, "requires_grad": True}]},
                   {"index": 1, "options": {"lr": 0.01, "betas": [0.9, 0.95]},
                    "members": [{"name": None, "ref": 999, "data_ptr": 9990, "shape": [16], "dtype": "float32",
                                 "is_leaf": True, "requires_grad": True}]}],
        "state": [], "optimizer": {"type": "AdamW", "state_init": "eager"}, "memory": {}, "notes": [],
        "prestep_findings": [],
    }
    b.update(over)
    return b


def test_body_reads_non_finite_numbers_as_floats():
    text = json.dumps(body()).replace('"grad_norm": 0.5', '"grad_norm": NaN').replace('"value_norm": 3.0',
                                                                                        '"value_norm": Infinity')
    b = body_from_json(text)
    assert math.isnan(b["params"][0]["grad_norm"]) and b["params"][0]["value_norm"] == math.inf
    assert tuple(b) == BODY_FIELDS


def test_body_reads_the_non_finite_strings_as_floats():
    """The probe writes NaN/Inf as "nan"/"inf"/"-inf" (docs/run-directory.md): back to floats in the
    numeric members, a parameter named "nan" left a string."""
    b = body()
    b["params"][0].update(grad_norm="nan", value_norm="-inf", name="nan")
    b["groups"][1]["options"].update(lr="inf", betas=["nan", 0.95])
    b = body_from_json(json.dumps(b, allow_nan=False))
    p = b["params"][0]
    assert math.isnan(p["grad_norm"]) and p["value_norm"] == -math.inf and p["name"] == "nan"
    opts = b["groups"][1]["options"]
    assert opts["lr"] == math.inf and math.isnan(opts["betas"][0]) and opts["betas"][1] == 0.95


@pytest.mark.parametrize("text, match", [
    ("{", r"the \.NET probe wrote bad JSON \(Expecting property name"),
    ("[]", r"wrote a JSON list, not an object"),
    (json.dumps({k: v for k, v in body().items() if k not in ("state", "notes")}), r"lacks state, notes"),
    (json.dumps(body(params={})), r"params is a dict, not a list"),
])
def test_a_bad_body_is_named(text, match):
    with pytest.raises(ValueError, match=match):
        body_from_json(text)


def test_members_named_from_earlier_snapshots():
    known = {999: "ln_f.bias"}
    b = name_members(body(), known)
    assert b["groups"][1]["members"][0]["name"] == "ln_f.bias"
    assert known[100] == "wte.weight" and known[200] == "ln_f.weight"


def test_members_named_by_data_pointer_before_history():
    b = body()
    b["groups"][1]["members"][0].update(ref=555, data_ptr=2000)   # a new handle on ln_f.weight's data
    assert name_members(b, {555: "old.name"})["groups"][1]["members"][0]["name"] == "ln_f.weight"
