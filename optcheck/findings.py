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
        phase: "pre-step" or "post-step" (see ``optcheck.record.snapshot``).
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


def lead_time(findings: list[dict], crash: dict | None) -> dict | None:
    """Link a crash to the error findings before it (findings as dicts, in order).

    Returns ``{flagged_step, flagged_phase, finding, failed_step, lead_steps,
    exception, predicted}`` — the finding is the one that predicted this exception
    (``detail.predicted_exception``, e.g. OC108's KeyNotFoundException; ``predicted``
    is True when its predicted key is in the exception message), else the first
    error finding — or None when nothing was flagged before the crash.
    """
    if not crash or crash.get("exc_type") == "InputError" or not isinstance(crash.get("step"), int):
        return None
    step = crash["step"]
    before = [f for f in findings if isinstance(f.get("step"), int) and f["step"] <= step
              and f.get("severity") == "error"]
    if not before:
        return None
    exc = crash.get("exc_type") or crash.get("signal")
    matching = [f for f in before if (f.get("detail") or {}).get("predicted_exception") == exc and exc]
    first = matching[0] if matching else before[0]
    key = (first.get("detail") or {}).get("predicted_key")
    return {"flagged_step": first["step"], "flagged_phase": first.get("phase"),
            "finding": f"{first.get('code')} {first.get('symbol')}", "failed_step": step,
            "lead_steps": step - first["step"], "exception": exc,
            "predicted": bool(matching and key and key in (crash.get("message") or ""))}
