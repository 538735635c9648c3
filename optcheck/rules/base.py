"""The rule interface and the catalogue registry.

A rule is a class with a stable ``code`` ("OC101"), a ``symbol``
("stale-param"), a one-line ``message``, a ``severity``, a docstring that is
its documentation (``optcheck explain OC101`` prints it): what it means, what will
fail next, how to fix it — and ``VALID`` / ``INVALID`` examples that a generic test
runs (``optcheck/rules/_fixtures.py``). ``check`` reads snapshots only and returns findings; it
never prints. Codes are never reused (``RETIRED`` lists the ones taken back).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable

from optcheck.findings import Finding

RETIRED: dict[str, str] = {}


@dataclass
class RuleConfig:
    """Knobs the rules read.

    Attributes:
        grad_starved_snapshots: OC202 fires after this many consecutive snapshots
            without a gradient (snapshots, not steps).
        stalled_snapshots: OC205 fires after this many consecutive snapshot pairs
            in which a parameter with a gradient kept its version counter.
        memory_budget_bytes: OC401 projects the step at which RSS exceeds this
            (bytes; None = no projection).
        memory_warmup_fraction: OC401 ignores this leading fraction of snapshots.
        memory_min_snapshots: OC401 needs this many snapshots after warm-up.
        memory_alpha: OC401 significance level of the trend test.
        memory_min_growth_bytes_per_1k_steps: OC401 ignores slopes below this.
        memory_min_span_steps: OC401 reports a byte metric (RSS, heaps) only when its
            trend holds over at least this many steps (counts of tensors are exact
            and need no such span).
    """

    grad_starved_snapshots: int = 3
    stalled_snapshots: int = 2
    memory_budget_bytes: int | None = None
    memory_warmup_fraction: float = 0.2
    memory_min_snapshots: int = 12
    memory_alpha: float = 0.001
    memory_min_growth_bytes_per_1k_steps: float = 8 * 2**20
    memory_min_span_steps: int = 300
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RuleContext:
    """What a rule sees besides the current snapshot.

    Attributes:
        previous: the previous snapshot of the same run, or None.
        history: every snapshot so far, current one last (read-only).
        config: the :class:`RuleConfig`.
        memo: per-rule scratch space, ``memo[code]`` is a dict kept across calls.
    """

    previous: dict | None
    history: list[dict]
    config: RuleConfig
    memo: dict[str, dict]


class Rule:
    """Base class of every rule. Subclasses set the class attributes and ``check``."""

    code: ClassVar[str] = ""
    symbol: ClassVar[str] = ""
    severity: ClassVar[str] = "error"
    message: ClassVar[str] = ""
    family: ClassVar[str] = ""
    #: examples the rule must stay silent on / must report (``optcheck/rules/_fixtures.py``:
    #: ``Valid`` / ``Invalid`` cases); every rule has at least one of each
    VALID: ClassVar[list] = []
    INVALID: ClassVar[list] = []

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:  # pragma: no cover - abstract
        raise NotImplementedError

    def finding(self, snap: dict, message: str, *, subjects: Iterable[str] = (), key: str = "",
                next_failure: str = "", **detail: Any) -> Finding:
        """Build a finding of this rule at ``snap``'s step; ``key`` dedups a persisting condition."""
        subjects = list(subjects)
        return Finding(
            code=self.code, symbol=self.symbol, severity=self.severity, step=snap["step"],
            phase=snap.get("phase", "post-step"), message=message, subjects=subjects,
            next_failure=next_failure, detail=detail, backend=snap.get("backend", ""),
            run=snap.get("run", ""), key=key or ",".join(subjects),
        )

    @classmethod
    def doc(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")


def listing(names, limit: int = 6) -> str:
    """``a, b, c and 26 more``: names for a one-line message (a finding's
    ``subjects`` keep them all)."""
    names = list(names)
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f" and {len(names) - limit} more"


REGISTRY: dict[str, type[Rule]] = {}


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: add a rule to the catalogue. Raises ValueError on a reused code."""
    if not cls.code or not cls.symbol:
        raise ValueError(f"{cls.__name__} has no code or symbol")
    if cls.code in REGISTRY or cls.code in RETIRED:
        raise ValueError(f"rule code {cls.code} is already taken")
    REGISTRY[cls.code] = cls
    return cls
