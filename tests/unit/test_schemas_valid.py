"""Every published schema (``optcheck/schemas/``) is a valid JSON Schema of its own
draft (checked here once, not at run time by every reader), and the cheap structural
check the reader applies after a file's first records (``optcheck.record.check.ShallowCheck``)
never passes what the full schema refuses at the top level, nor refuses a valid record."""

from __future__ import annotations

import jsonschema
import pytest

from optcheck.record.check import shallow_check
from optcheck.record.snapshot import SCHEMA_FILES, SchemaError, read_jsonl, schema_document, validate_record
from snapfactory import clean


@pytest.mark.parametrize("kind", sorted(SCHEMA_FILES))
def test_schema_is_valid_for_its_draft(kind):
    schema = schema_document(kind)
    jsonschema.validators.validator_for(schema).check_schema(schema)


def test_shallow_check_passes_valid_records_and_refuses_top_level_faults():
    from pathlib import Path

    run = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "clean"
    snap = clean(step=10)
    check = shallow_check("snapshot")
    assert check(snap) and all(check(s) for s in read_jsonl(run / "snapshots.jsonl"))
    metrics = shallow_check("metrics")
    assert all(metrics(m) for m in read_jsonl(run / "metrics.jsonl"))
    bad = [{**snap, "step": "3"}, {**snap, "step": True}, {**snap, "step": -1}, {**snap, "params": {}},
           {**snap, "phase": "sideways"}, {k: v for k, v in snap.items() if k != "groups"},
           {**snap, "params": [{**snap["params"][0], "name": 5}]}, {**snap, "params": [7]}]
    for rec in bad:
        assert not check(rec)
        with pytest.raises(SchemaError):
            validate_record(rec, "snapshot")
    for rec in ({"step": 1.5}, {"step": None}, {"loss": 1}, {"step": 1, "loss": [1]}, {"step": False}):
        assert not metrics(rec)
        with pytest.raises(SchemaError):
            validate_record(rec, "metrics")
