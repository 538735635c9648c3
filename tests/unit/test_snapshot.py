"""Snapshot schema 1: validation, JSON round trip, torn streams."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optcheck.record.snapshot import SchemaError, dumps, loads, read_jsonl, to_float, validate
from optcheck.record.check import read_snapshots
from snapfactory import clean, param


def test_clean_snapshot_round_trips():
    s = clean()
    assert loads(dumps(s)) == s


@settings(max_examples=60, deadline=None)
@given(
    names=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=6, unique=True),
    refs=st.lists(st.integers(min_value=1, max_value=2**63 - 1), min_size=6, max_size=6, unique=True),
    loss=st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    step=st.integers(min_value=0, max_value=10**9),
)
def test_round_trip_property(names, refs, loss, step):
    s = clean(step=step)
    s["params"] = [param(n, r) for n, r in zip(names, refs)]
    s["loss"] = loss
    back = loads(dumps(s))
    assert back == s


def test_non_finite_floats_stay_strict_json():
    s = clean()
    s["loss"] = math.nan
    s["params"][0]["grad_norm"] = math.inf
    line = dumps(s)
    json.loads(line)  # strict JSON: no NaN literal
    back = loads(line)
    assert math.isnan(to_float(back["loss"])) and to_float(back["params"][0]["grad_norm"]) == math.inf


@pytest.mark.parametrize("field,value,needle", [
    ("schema", "other/2", "^schema: 'optcheck.snapshot/1' was expected"),
    ("backend", "jax", "^backend: 'jax' is not one of"),
    ("step", -1, "^step: -1 is less than the minimum"),
    ("phase", "mid", "^phase: 'mid' is not one of"),
])
def test_validate_names_the_bad_field(field, value, needle):
    s = clean()
    s[field] = value
    with pytest.raises(SchemaError, match=needle):
        validate(s)


def test_validate_missing_fields():
    s = clean()
    del s["params"][0]["ref"]
    with pytest.raises(SchemaError, match=r"^params\[0\]: 'ref' is a required property"):
        validate(s)
    with pytest.raises(SchemaError, match="'groups' is a required property"):
        validate({k: v for k, v in clean().items() if k != "groups"})


def test_torn_last_line_is_skipped_not_fatal(tmp_path):
    p = tmp_path / "snapshots.jsonl"
    good = [dumps(clean(step=i)) for i in (1, 2)]
    p.write_text("\n".join(good) + "\n" + good[0][: len(good[0]) // 2])
    defects = []
    snaps = read_snapshots(p, defects)
    assert [s["step"] for s in snaps] == [1, 2]
    assert defects and defects[0].line == 3


def test_garbage_in_the_middle_is_an_error(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text(dumps(clean()) + "\n{not json\n" + dumps(clean()) + "\n")
    with pytest.raises(ValueError, match=":2: not a JSON line"):
        list(read_jsonl(p))
