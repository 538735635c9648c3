"""Checking record files cheaply: the reader's policy for long files
(``optcheck/report/reader.py``). Torch-free.

The first :data:`FULL_CHECK_LINES` records of a file are validated against the
published schema (``optcheck/schemas/``); later ones by :class:`ShallowCheck`, a
structural check derived from the same schema, and fully again when it fails
(so the error still names the field). :func:`read_jsonl_records` parses a few
MB of lines with one ``json.loads`` call. Together they make ``compare`` of a
20,000-step run about 20x faster (``benchmarks/bench_compare.py``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

from optcheck.record.snapshot import (LineParser, SchemaError, StreamDefect, field_path, inline_refs, schema_document,
                                      validate, validate_record)

_PY_TYPES = {"integer": (int,), "number": (int, float), "string": (str,), "object": (dict,), "array": (list,),
             "boolean": (bool,), "null": (type(None),)}


class ShallowCheck:
    """A cheap structural check derived from a published schema: the top-level
    required fields are present, and every top-level field (and the required
    fields of the objects in a top-level array) has one of its types or enum
    values (exact type tests: a bool is no integer). What it passes the full
    schema may still refuse deeper down; what it refuses, the full schema refuses
    too (the caller then validates fully, for the precise message). About 30x
    cheaper than ``jsonschema`` on a snapshot.
    """

    def __init__(self, kind: str):
        raw = schema_document(kind)
        schema = inline_refs(raw, raw.get("$defs", {}))
        self.required = tuple(schema.get("required", ()))
        props = schema.get("properties", {})
        self.fields = {k: spec for k, v in props.items() if (spec := self._spec(v)) is not None}
        self.items = {}
        for k, v in props.items():
            it = v.get("items") if isinstance(v, dict) else None
            if isinstance(it, dict) and it.get("type") == "object":
                req = tuple(it.get("required", ()))
                self.items[k] = (req, {f: spec for f in req
                                       if (spec := self._spec(it.get("properties", {}).get(f))) is not None})

    @staticmethod
    def _spec(node):
        """``(types, values, minimum)`` of one property schema: exact Python types
        allowed, literal values allowed besides (enum, const), a numeric minimum; None
        when it cannot be told cheaply (the full check at the start covers it)."""
        if not isinstance(node, dict):
            return None
        if "const" in node:
            return (frozenset(), (node["const"],), None)
        if "enum" in node:
            return (frozenset(), tuple(node["enum"]), None)
        branches = node.get("anyOf") or node.get("oneOf")
        if branches:
            specs = [ShallowCheck._spec(b) for b in branches]
            if any(sp is None for sp in specs):
                return None
            mins = {sp[2] for sp in specs}
            return (frozenset().union(*(sp[0] for sp in specs)), tuple(x for sp in specs for x in sp[1]),
                    mins.pop() if len(mins) == 1 else None)
        t = node.get("type")
        if t is None:
            return None
        names = [t] if isinstance(t, str) else list(t)
        return (frozenset(x for n in names for x in _PY_TYPES.get(n, ())), (), node.get("minimum"))

    @staticmethod
    def _ok(v, spec) -> bool:
        types, values, minimum = spec
        if type(v) in types:
            return minimum is None or type(v) not in _NUMERIC or v >= minimum
        return bool(values) and type(v) in _SCALAR and v in values

    def __call__(self, obj) -> bool:
        if type(obj) is not dict:
            return False
        for k in self.required:
            if k not in obj:
                return False
        fields = self.fields
        for k, v in obj.items():  # inlined _ok: this runs once per line of a million-line file
            spec = fields.get(k)
            if spec is None:
                continue
            types, values, minimum = spec
            if type(v) in types:
                if minimum is not None and type(v) in _NUMERIC and v < minimum:
                    return False
            elif not (values and type(v) in _SCALAR and v in values):
                return False
        if self.items:
            ok = self._ok
            for k, (req, specs) in self.items.items():
                for item in obj.get(k) or ():
                    if type(item) is not dict:
                        return False
                    for f in req:
                        if f not in item:
                            return False
                        spec = specs.get(f)
                        if spec is not None and not ok(item[f], spec):
                            return False
        return True


    def first_bad(self, records: list) -> int | None:
        """Index of the first record of ``records`` this check refuses, None when all
        pass. Field by field over the whole list (a few set comprehensions instead of
        a call per record: what makes a million metrics lines cheap); the records are
        looked at one by one only where that finds something."""
        def scan():
            return next((i for i, o in enumerate(records) if not self(o)), None)

        if any(type(o) is not dict for o in records):
            return scan()
        for k in self.required:
            if not all(k in o for o in records):
                return scan()
        for k, (types, values, minimum) in self.fields.items():
            seen = {type(o[k]) for o in records if k in o}
            odd = seen - types
            if odd:
                if not values or odd - _SCALAR or not {o[k] for o in records if k in o and type(o[k]) in odd} \
                        <= set(values):
                    return scan()
            if minimum is not None and seen & _NUMERIC and \
                    min(o[k] for o in records if k in o and type(o[k]) in _NUMERIC) < minimum:
                return scan()
        if self.items:
            return scan()
        return None


_NUMERIC = frozenset((int, float))
_SCALAR = frozenset((str, int, float, type(None)))
_SHALLOW: dict[str, ShallowCheck] = {}


def shallow_check(kind: str) -> ShallowCheck:
    """The :class:`ShallowCheck` of record ``kind`` (built once)."""
    if kind not in _SHALLOW:
        _SHALLOW[kind] = ShallowCheck(kind)
    return _SHALLOW[kind]


#: Records of each file checked against the full schema before the cheap check takes over.
FULL_CHECK_LINES = 4


def checked(path, n: int, obj, kind: str, full_lines: int | None, count: int):
    """``obj`` (line ``n``, the ``count``-th record) checked: fully for the first
    ``full_lines`` records (all when None), then by :class:`ShallowCheck`, and fully
    again when that fails (for the message)."""
    try:
        if full_lines is None or count < full_lines or not shallow_check(kind)(obj):
            return validate(obj) if kind == "snapshot" else validate_record(obj, kind)
        return obj
    except SchemaError as e:
        raise SchemaError(f"{path}:{n}: {e}") from None




def read_jsonl_records(path: str | os.PathLike, defects: list[StreamDefect] | None = None,
                       chunk_bytes: int = 4 << 20) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of every JSON line of a record file (:func:`read_jsonl_chunks`)."""
    for chunk in read_jsonl_chunks(path, defects, chunk_bytes):
        yield from chunk


def read_checked(path: str | os.PathLike, kind: str, defects: list[StreamDefect] | None,
                 full_lines: int | None) -> list:
    """Every record of a record file of ``kind``, checked: the first ``full_lines``
    (all when None) against the published schema, the rest by :class:`ShallowCheck`
    a chunk at a time, and a record it refuses against the schema again (which
    raises naming the field).

    Raises:
        FileNotFoundError.
        SchemaError: ``"<path>:<line>: <field>: <what is wrong>"``.
    """
    check = shallow_check(kind)
    out: list = []
    for chunk in read_jsonl_chunks(path, defects):
        if kind == "snapshot":
            for n, v in chunk:
                if not isinstance(v, dict):
                    raise SchemaError(f"{path}:{n}: snapshot is a {type(v).__name__}, not a JSON object")
        i = 0
        while i < len(chunk) and (full_lines is None or len(out) < full_lines):
            out.append(checked(path, *chunk[i], kind, None, 0))
            i += 1
        rest = chunk[i:]
        while rest:
            values = [v for _, v in rest]
            bad = check.first_bad(values)
            if bad is None:
                out.extend(values)
                break
            out.extend(values[:bad])
            out.append(checked(path, *rest[bad], kind, None, 0))  # raises with the field, unless it is fine
            rest = rest[bad + 1:]
    return out


def read_jsonl_chunks(path: str | os.PathLike, defects: list[StreamDefect] | None = None,
                      chunk_bytes: int = 4 << 20) -> Iterator[list[tuple[int, Any]]]:
    """Lists of ``(line number, value)`` of the JSON lines of a record file, with the rules
    of :func:`read_jsonl` for bad lines, read a few MB at a time: a chunk whose
    lines are each one JSON object (each starts with ``{`` and ends with ``}``,
    and the chunk parses as one array of exactly that many objects) is parsed by
    one ``json.loads`` call, about 3x faster than a call per line; any other chunk
    line by line. Made for ``metrics.jsonl`` of a million steps.
    """
    parser = LineParser(path, defects)
    with open(path, "rb") as f:
        n = 0
        while True:
            buf = f.read(chunk_bytes)
            if not buf:
                break
            if not buf.endswith(b"\n"):
                buf += f.readline()  # the chunk ends at a line's end
            parser.more()  # more lines follow a held bad line: it was not the last
            body = buf[:-1] if buf.endswith(b"\n") else buf
            count = body.count(b"\n") + 1
            first = n + 1
            n += count
            values = None
            # every line one object: starts with "{", ends with "}" (no blank line, no stray byte between)
            if body[:1] == b"{" and body[-1:] == b"}" and body.count(b"\n{") == count - 1 \
                    and body.count(b"}\n") == count - 1:
                try:
                    values = json.loads(b"[" + body.replace(b"\n", b",") + b"]")
                except (ValueError, RecursionError):
                    values = None
                if values is not None and (len(values) != count or any(type(v) is not dict for v in values)):
                    values = None
            if values is not None:
                yield list(zip(range(first, first + count), values))
            else:
                yield list(parser.feed(enumerate(body.split(b"\n"), start=first)))
    parser.end()




#: The largest integer a record may hold: a JSON number beyond int64 is no count, byte size or step
#: optcheck writes, and it cannot be turned into a float (10^400: OverflowError).
MAX_INT = 2**63 - 1


def out_of_range(obj, path: str = "") -> str | None:
    """The field path (``peak_rss_bytes``, ``cost.steps.count``, ``ranks[1].x``) of the
    first integer in ``obj`` beyond ±:data:`MAX_INT`, with a short account of it; None
    when there is none. (Non-finite floats are numbers: old summaries wrote them.)"""
    if isinstance(obj, int) and not isinstance(obj, bool):
        if abs(obj) > MAX_INT:
            digits = len(str(abs(obj))) if abs(obj) < 10**4000 else "over 4000"
            return f"{path or '(the record)'}: an integer of {digits} digits, out of range"
        return None
    if isinstance(obj, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in obj.items())
    elif isinstance(obj, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    for p, v in items:
        if isinstance(v, (int, dict, list)) and (bad := out_of_range(v, p)) is not None:
            return bad
    return None


def read_records(path: str | os.PathLike, kind: str, defects: list[StreamDefect] | None = None,
                 full_lines: int | None = None) -> list[dict]:
    """Every line of a record file (``metrics.jsonl``, ``findings.jsonl``), each
    checked against the published schema of ``kind`` (``full_lines``: only the
    first that many; the rest by :class:`ShallowCheck`); unreadable lines go to
    ``defects`` as in ``optcheck.record.snapshot.read_jsonl``.

    Raises:
        FileNotFoundError.
        SchemaError: ``"<path>:<line>: <field>: <what is wrong>"``.
    """
    return read_checked(path, kind, defects if defects is not None else [], full_lines)


def read_snapshots(path: str | os.PathLike, defects: list[StreamDefect] | None = None,
                   full_lines: int | None = None) -> list[dict]:
    """Read a recorded snapshot stream (``snapshots.jsonl``), validating every line
    (``full_lines``: the first that many, the rest by :class:`ShallowCheck`)
    against ``optcheck/schemas/snapshot-1.json``.

    Lines that are not JSON go to ``defects`` (see ``optcheck.record.snapshot.read_jsonl``).

    Raises:
        FileNotFoundError, ValueError (an unreadable line, without ``defects``),
        SchemaError: ``"<path>:<line>: <field>: <what is wrong>"``.
    """
    return read_checked(path, "snapshot", defects, full_lines)


class _LooseSummary:
    """The typed fields of a versioned summary applied to an unversioned one (written
    before ``summary_version``): a field it has must be of its type or null; fields
    may be missing, enums and required sub-fields are not enforced. So an old
    summary with ``last_step: "abc"`` is one line, exit 2, not a traceback in the
    command that reads it."""

    def __init__(self):
        import jsonschema

        schema = schema_document("summary")
        props = inline_refs(schema["then"]["properties"], schema.get("$defs", {}))
        loose = {"type": "object", "properties": {k: _loosen(v, top=True) for k, v in props.items()
                                                  if k != "summary_version"}}
        self._v = jsonschema.validators.validator_for(schema)(loose)

    def validate_fields(self, s: dict) -> None:
        import jsonschema

        err = jsonschema.exceptions.best_match(self._v.iter_errors(s))
        if err is not None:
            msg = err.message if len(err.message) <= 160 else err.message[:157] + "..."
            raise SchemaError(f"{field_path(err.absolute_path)}: {msg}")


def _loosen(node, top: bool = False):
    """``node`` without ``required`` (anywhere), and at the top without ``enum``/``const``
    (an old status or source), null allowed."""
    if isinstance(node, list):
        return [_loosen(n) for n in node]
    if not isinstance(node, dict):
        return node
    drop = ("required", "enum", "const") if top else ("required",)
    out = {k: _loosen(v) for k, v in node.items() if k not in drop}
    if top and not any(k in out for k in ("type", "anyOf", "oneOf", "$ref")):
        return out
    t = out.get("type")
    if isinstance(t, str):
        out["type"] = [t, "null"]
    elif isinstance(t, list) and "null" not in t:
        out["type"] = [*t, "null"]
    return out


_LOOSE: list[_LooseSummary] = []


def _loose_validator() -> _LooseSummary:
    if not _LOOSE:
        _LOOSE.append(_LooseSummary())
    return _LOOSE[0]




def check_old_summary(s: dict) -> None:
    """Check an older summary (no ``summary_version``) loosely (:class:`_LooseSummary`).

    Raises:
        SchemaError: ``"<field>: <what is wrong>"``.
    """
    _loose_validator().validate_fields(s)
