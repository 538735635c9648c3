"""Helpers for rules that read a snapshot's hazard ``events`` (schema-1 Event dicts)."""

from __future__ import annotations


def events(snap: dict, kind: str) -> list[dict]:
    """The events of ``kind`` in ``snap`` (an empty list when it has none)."""
    return [e for e in snap.get("events") or () if isinstance(e, dict) and e.get("kind") == kind]


def names(items, limit: int = 8) -> str:
    """``a, b, c`` — or ``a, b, … (+N more)`` past ``limit``."""
    items = list(items)
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", … (+{len(items) - limit} more)"
