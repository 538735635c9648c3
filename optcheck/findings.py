"""A finding: what a rule says about one snapshot (one line of ``findings.jsonl``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("info", "warning", "error")


def severity_rank(severity: str) -> int:
    """0 for info, 1 for warning, 2 for error. Raises ValueError for anything else."""
    try:
        return SEVERITIES.index(severity)
    except ValueError:
        raise ValueError(f"unknown severity {severity!r} (one of {', '.join(SEVERITIES)})") from None


@dataclass
class Finding:
    """One rule firing at one step.

    Attributes:
        code: rule code, e.g. "OC101".
        symbol: rule symbol, e.g. "stale-param".
        severity: "info" | "warning" | "error".
        step: training step of the snapshot that showed it.
        phase: "pre-step" or "post-step" (see ``optcheck.snapshot``).
        message: one line naming what and where.
        subjects: parameter names (or other subjects) the finding is about.
        next_failure: what will fail next if nothing is done.
        detail: anything else, JSON-serialisable.
        key: identity used to report a persisting condition once (not written).
    """

    code: str
    symbol: str
    severity: str
    step: int
    message: str
    phase: str = "post-step"
    subjects: list[str] = field(default_factory=list)
    next_failure: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    backend: str = ""
    run: str = ""
    key: str = field(default="", repr=False, compare=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("key")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "key"}
        return cls(**known)
