"""Helpers for rules that read a snapshot's hazard ``events`` (schema-1 Event dicts)."""

from __future__ import annotations

from optcheck.rules.base import listing


def events(snap: dict, kind: str) -> list[dict]:
    """The events of ``kind`` in ``snap`` (an empty list when it has none)."""
    return [e for e in snap.get("events") or () if isinstance(e, dict) and e.get("kind") == kind]


def names(items, limit: int = 8) -> str:
    """``a, b, c`` — or ``a, b, … and N more`` past ``limit`` (``base.listing``)."""
    return listing(items, limit)
