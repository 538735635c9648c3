"""OC107 (``optcheck/rules/references_state.py``, issue 25): a state tensor that *no
longer* matches its parameter is a finding; state meant to differ (factored moments,
preconditioners, projections, 8-bit codes, flattened moments) is not."""

from __future__ import annotations

import copy

from optcheck.engine import check_stream
from snapfactory import at, clean


def oc107(*snaps):
    return [f for f in check_stream(list(snaps)) if f.code == "OC107"]


def with_state(snap, **tensors):
    s = copy.deepcopy(snap)
    for st in s["state"]:
        st["tensors"] = {**st["tensors"], **copy.deepcopy(tensors)}
    return s


DESIGNED = {  # layer0.weight & co. are [4, 4] float32 in the factory's snapshots
    "GG.0": {"shape": [4, 2], "dtype": "float32"},  # a preconditioner of another shape
    "proj": {"shape": [2, 4], "dtype": "float32"},  # a low-rank projection
    "state1": {"shape": [4, 4], "dtype": "uint8"},  # 8-bit codes
    "absmax1": {"shape": [1], "dtype": "float32"},  # per-block scales
    "exp_avg_flat": {"shape": [16], "dtype": "float32"},  # SPAM's flattened moments
    "row": {"shape": [4, 1], "dtype": "float32"},  # a factored moment
}


def test_state_meant_to_differ_is_silent_from_the_first_snapshot_on():
    s = with_state(clean(), **DESIGNED)
    assert oc107(clean(), s, at(s, 200)) == []


def test_without_history_a_same_rank_shape_is_judged_by_shape_alone():
    # optcheck check of a single snapshot: a [4, 2] state of a [4, 4] parameter reads as a resized one
    s = with_state(clean(), **{"GG.0": {"shape": [4, 2], "dtype": "float32"}})
    assert oc107(s) and oc107(clean(), s) == []


def test_state_that_matched_and_no_longer_does_is_a_finding():
    before = with_state(clean(), exp_avg={"shape": [4, 4], "dtype": "float32"}, **DESIGNED)
    after = with_state(at(clean(), 200), exp_avg={"shape": [4, 2], "dtype": "float32"}, **DESIGNED)
    (f,) = oc107(clean(), before, after)
    assert f.step == 200 and {m["state"] for m in f.detail["mismatches"]} == {"exp_avg"}


def test_parameter_converted_after_its_state_was_made():
    # model.half(): the members are float16 now, the state kept the float32 they had when first seen
    half = at(clean(), 200)
    for p in half["params"]:
        p["dtype"] = "float16"
    for m in half["groups"][0]["members"]:
        m["dtype"] = "float16"
    (f,) = oc107(clean(), half)
    assert "dtype float32 vs float16" in f.detail["mismatches"][0]["what"]


def test_state_on_another_device_than_its_parameter():
    s = at(with_state(clean(), exp_avg={"shape": [4, 4], "dtype": "float32", "device": "meta"}), 200)
    (f,) = oc107(clean(), s)
    assert "device meta vs cpu" in f.detail["mismatches"][0]["what"]
    assert oc107(clean(), at(with_state(clean(), exp_avg={"shape": [4, 4], "dtype": "float32"}), 200)) == []
