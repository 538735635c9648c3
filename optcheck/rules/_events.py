"""Helpers for rules that read a snapshot's hazard ``events`` (schema-1 Event dicts)."""

from __future__ import annotations

from optcheck.rules.base import listing


def events(snap: dict, kind: str) -> list[dict]:
    """The events of ``kind`` in ``snap`` (an empty list when it has none)."""
    return [e for e in snap.get("events") or () if isinstance(e, dict) and e.get("kind") == kind]


def names(items, limit: int = 8) -> str:
    """``a, b, c`` — or ``a, b, … and N more`` past ``limit`` (``base.listing``)."""
    return listing(items, limit)


def dated_at_cause(finding, step):
    """``finding`` moved to ``step``, the step of the event that caused it, when that is
    earlier than the snapshot that carried it: a probe's device check is read at the
    next snapshot or metrics batch, not at its step (docs/gpu.md); ``detail["read_at_step"]``
    keeps the snapshot's step."""
    if isinstance(step, int) and not isinstance(step, bool) and step < finding.step:
        finding.detail["read_at_step"] = finding.step
        finding.step = step
    return finding
