"""A ``summary.json`` field is declared in one place (issue 26): each field of
:class:`optcheck.record.summary.Summary` carries its JSON Schema fragment, and the
published schema's version-2 part (``optcheck schema summary``) is built from them.
A field added to the dataclass is required and typed by the schema with no other
file changed; the frame on disk holds no per-field list of its own."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

import jsonschema
import pytest
from click.testing import CliRunner

import optcheck.record.summary as summary_mod
from optcheck.cli import cli
from optcheck.record.snapshot import SCHEMA_DIR, schema_document, schema_validator
from optcheck.record.summary import Summary, json_type, summary_field


def _validator(schema: dict):
    return jsonschema.validators.validator_for(schema)(schema)


def test_every_field_is_typed_by_the_schema_and_a_default_summary_validates():
    schema = schema_document("summary")
    props, required = schema["then"]["properties"], set(schema["then"]["required"])
    names = {f.name for f in fields(Summary)}
    assert set(props) == names - {"backend"}  # backend is typed by the frame, as version 1 has it
    assert required == names - {"backend", "hazards"}
    s = Summary(run="r", backend="pytorch", source="soak").to_dict()
    _validator(schema).validate(s)
    for name, bad in (("last_step", "12"), ("status", "fine"), ("cost", {}), ("inject", [3])):
        with pytest.raises(jsonschema.ValidationError):
            _validator(schema).validate({**s, name: bad})
    with pytest.raises(jsonschema.ValidationError):
        _validator(schema).validate({k: v for k, v in s.items() if k != "signals"})


def test_a_field_added_to_the_dataclass_alone_is_required_and_typed(monkeypatch):
    @dataclass
    class Grown(Summary):
        tokens_seen: int = summary_field(json_type("integer", minimum=0), 0)

    monkeypatch.setattr(summary_mod, "Summary", Grown)
    schema = schema_document("summary")
    assert schema["then"]["properties"]["tokens_seen"] == {"type": "integer", "minimum": 0}
    assert "tokens_seen" in schema["then"]["required"]
    s = Grown(run="r", backend="pytorch", source="monitor").to_dict()
    _validator(schema).validate(s)
    with pytest.raises(jsonschema.ValidationError, match="tokens_seen"):
        _validator(schema).validate({k: v for k, v in s.items() if k != "tokens_seen"})
    with pytest.raises(jsonschema.ValidationError):
        _validator(schema).validate({**s, "tokens_seen": -1})


def test_the_frame_on_disk_lists_no_field_of_version_2():
    frame = json.loads((SCHEMA_DIR / "summary-1.json").read_text())
    assert set(frame["then"]) == {"$comment"}
    assert "required" not in frame and "summary_version" not in frame["properties"]


def test_the_readers_validator_uses_the_built_schema():
    v = schema_validator("summary")
    s = Summary(run="r", backend="pytorch", source="soak").to_dict()
    assert not list(v.iter_errors(s))
    assert list(v.iter_errors({**s, "snapshots": -3}))


@pytest.mark.parametrize("kind", ["summary", "snapshot", "finding", "metrics"])
def test_optcheck_schema_prints_the_published_schema(kind):
    r = CliRunner().invoke(cli, ["schema", kind])
    assert r.exit_code == 0, r.output
    printed = json.loads(r.output)
    assert printed == schema_document(kind)
    jsonschema.validators.validator_for(printed).check_schema(printed)


def test_docs_summary_md_has_a_row_for_every_field():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "summary.md").read_text()
    missing = [f.name for f in fields(Summary) if f"`{f.name}`" not in doc]
    assert not missing, f"docs/summary.md names no {missing}"
