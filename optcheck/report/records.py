"""Reading a run directory's records back, each checked against its published
schema (``optcheck/schemas/``): ``summary.json``, ``metrics.jsonl``,
``findings.jsonl``. A line that is not JSON at all is skipped and listed in
``defects``; a record of the wrong shape is :class:`InputError` naming the file,
the line and the field. Torch-free."""

from __future__ import annotations

import json
import os
from pathlib import Path

from optcheck.errors import InputError


def read_summary(path: str | os.PathLike) -> dict:
    """The ``summary.json`` of a run directory, checked against
    ``optcheck/schemas/summary-1.json``.

    Raises:
        InputError: absent, unreadable, not JSON, or of the wrong shape (names the field).
    """
    from optcheck.snapshot import SchemaError, validate_record

    p = Path(path) / "summary.json"
    try:
        s = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: not a run directory (no summary.json)") from None
    except (OSError, ValueError, RecursionError) as e:
        raise InputError(f"{p}: unreadable ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(s, dict):
        raise InputError(f"{p}: (the record): a summary is a JSON object, not a {type(s).__name__}")
    try:
        return validate_record(s, "summary")
    except SchemaError as e:
        raise InputError(f"{p}: {e}") from None


def read_metrics(path: str | os.PathLike, defects: list | None = None) -> list[dict]:
    """``metrics.jsonl`` of a run directory (empty list if there is none), every
    line checked against ``optcheck/schemas/metrics-1.json``.

    Raises:
        InputError: a line of the wrong shape ("<file>:<line>: <field>: <what>").
    """
    return _records(Path(path) / "metrics.jsonl", "metrics", defects)


def read_findings(path: str | os.PathLike, defects: list | None = None) -> list[dict]:
    """``findings.jsonl`` of a run directory (empty list if there is none), every
    line checked against ``optcheck/schemas/finding-1.json``.

    Raises:
        InputError: a line of the wrong shape ("<file>:<line>: <field>: <what>").
    """
    return _records(Path(path) / "findings.jsonl", "finding", defects)


def _records(p: Path, kind: str, defects: list | None) -> list[dict]:
    from optcheck.snapshot import SchemaError, read_records

    if not p.exists():
        return []
    try:
        return read_records(p, kind, defects)
    except SchemaError as e:
        raise InputError(str(e)) from None
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None


def run_dirs(paths) -> list[Path]:
    """Run directories named by ``paths``: each is a run directory (has a
    ``summary.json``) or a folder whose immediate subfolders holding one are
    taken, in name order. Duplicates are dropped, order kept.

    Raises:
        InputError: a path that does not exist, or a folder with no run in it.
    """
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if (p / "summary.json").is_file():
            runs = [p]
        elif p.is_dir():
            runs = sorted(c for c in p.iterdir() if (c / "summary.json").is_file())
            if not runs:
                raise InputError(f"{raw}: no run directory in it (no summary.json in it or its subfolders)")
        else:
            raise InputError(f"{raw}: no such run directory")
        found += [r for r in runs if r not in found]
    return found
