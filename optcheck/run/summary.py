"""The rule check of a run and its ``summary.json``, shared by the soak supervisor
(``optcheck/drivers/soak.py``) and ``optcheck.Monitor``. Torch-free.

:class:`Checker` is the one rule engine of a run: it writes each snapshot,
runs the rules on it (timed), writes the new findings and reports them.
:class:`Summary` is the one ``summary.json`` both fill; its fields are
documented in ``docs/summary.md`` and validated by
``optcheck/schemas/summary-1.json`` (``summary_version`` 2).
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from optcheck.run import exitcodes
from optcheck.engine import RuleEngine
from optcheck.findings import Finding, lead_time, severity_rank
from optcheck.run.sequencer import Cost, cost_dict

#: ``summary_version`` of what :class:`Summary` writes. 1 (or the field absent):
#: written before the soak and the Monitor shared this type, each with its own fields.
SUMMARY_VERSION = 2


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second (``started``/``finished``)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class Checker:
    """The one :class:`RuleEngine` of a run, with the run directory it writes to.

    Args:
        engine: the run's rule engine (its ``config`` and ``ignore`` are the user's).
        rundir: an open ``optcheck.run.rundir.RunDir``, or None (nothing written).
        report: ``report(finding)`` for every new finding, after it is written.
        checked: ``checked(snapshot)`` once the rules ran on it, before its findings are written.
    """

    def __init__(self, engine: RuleEngine, rundir=None, report: Callable[[Finding], None] | None = None,
                 checked: Callable[[dict], None] | None = None):
        self.engine, self.rundir, self.report, self.checked = engine, rundir, report, checked
        self.cost = Cost()

    def check(self, snap: dict) -> list[Finding]:
        """Write ``snap``, run every rule on it; write, report and return the new findings.

        Raises:
            optcheck.errors.RecordError: the run directory stopped taking writes.
        """
        if self.rundir is not None:
            self.rundir.snapshot(snap)
        t = time.perf_counter()
        new = self.engine.feed(snap)
        self.cost.add(time.perf_counter() - t)
        if self.checked is not None:
            self.checked(snap)
        for f in new:
            if self.rundir is not None:
                self.rundir.finding(f.to_dict())
            if self.report is not None:
                self.report(f)
        return new

    @property
    def findings(self) -> list[Finding]:
        return self.engine.findings

    def worst_rank(self) -> int | None:
        """Severity rank of the worst finding, None without findings."""
        return max((severity_rank(f.severity) for f in self.findings), default=None)


def run_status(*, running: bool = False, interrupted: bool = False, record_failed: bool = False,
               crashed: bool = False, stopped: bool = False, exit_code: int = exitcodes.CLEAN) -> str:
    """The summary's ``status``: running, interrupted, record-failed, crashed, stopped, findings or clean
    (the first that holds)."""
    return ("running" if running else "interrupted" if interrupted else "record-failed" if record_failed
            else "crashed" if crashed else "stopped" if stopped
            else "findings" if exit_code == exitcodes.FINDINGS else "clean")


@dataclass
class Summary:
    """``summary.json`` of a run directory, soak or Monitor (``docs/summary.md``).

    Units: seconds (``*_s``), bytes (``*_bytes``), steps are optimizer steps
    (1-based; 0 is before the first). Fields a source does not have stay None
    (e.g. ``steps_requested`` of a Monitor, ``not_checked`` of a soak is []).
    """

    run: str
    backend: str
    source: str                          # "soak" | "monitor"
    status: str = "running"
    exit_code: int | None = None
    fail_on: str = "warning"
    steps_requested: int | None = None
    last_step: int = 0
    snapshots: int = 0
    findings: int = 0
    findings_by_code: dict = field(default_factory=dict)
    suppressed: dict = field(default_factory=dict)
    first_finding: dict | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    val_loss_first: float | None = None
    val_loss_last: float | None = None
    val_step_first: int | None = None
    val_step_last: int | None = None
    elapsed_s: float | None = None
    steps_per_s: float | None = None
    peak_rss_bytes: int = 0
    versions: dict = field(default_factory=dict)
    threads: int | None = None
    crash: dict | None = None
    stopped: dict | None = None
    lead_time: dict | None = None
    cost: dict = field(default_factory=lambda: cost_dict(Cost(), Cost()))
    out: str | None = None
    started: str = field(default_factory=utc_now)
    finished: str | None = None
    corpus: dict | None = None
    config: dict | None = None
    inject: list = field(default_factory=list)
    interrupted_by: str | None = None
    signals: int = 0
    record_error: str | None = None
    garbled_lines: int = 0
    not_checked: list = field(default_factory=list)
    hazards: dict | None = None          # the hazard probes' arming (docs/summary.md); None when off
    summary_version: int = SUMMARY_VERSION

    def fill_findings(self, checker: Checker) -> None:
        """``findings``, ``findings_by_code``, ``suppressed``, ``first_finding``, ``lead_time``
        (to :attr:`crash`) and ``cost.checks`` from the run's checker."""
        fs = checker.findings
        by_code: dict[str, int] = {}
        for f in fs:
            by_code[f.code] = by_code.get(f.code, 0) + 1
        self.findings, self.findings_by_code = len(fs), by_code
        self.suppressed = checker.engine.suppressed_by_code()
        self.first_finding = fs[0].to_dict() if fs else None
        self.lead_time = lead_time([f.to_dict() for f in fs], self.crash)

    def fill_timing(self, elapsed_s: float, snapshots: Cost, checks: Cost) -> None:
        """``elapsed_s``, ``steps_per_s`` (from :attr:`last_step`) and ``cost``."""
        self.elapsed_s = round(elapsed_s, 3)
        self.steps_per_s = round(self.last_step / elapsed_s, 2) if elapsed_s else None
        self.cost = cost_dict(snapshots, checks)

    def to_dict(self) -> dict:
        return asdict(self)


def cost_line(summary: dict) -> str | None:
    """One line of what optcheck cost a run (``cost`` of a summary), or None when it has none::

        optcheck cost: 7 snapshots 0.412 s (median 0.051 s), 7 rule checks 0.093 s (median 0.012 s), 21 µs a step over 300 steps; run 22.4 s
    """
    cost = summary.get("cost")
    if not isinstance(cost, dict):
        return None
    parts = []
    for key, label in (("snapshots", "snapshots"), ("checks", "rule checks")):
        c = cost.get(key) or {}
        med = c.get("median_s")
        parts.append(f"{c.get('count', 0)} {label} {c.get('total_s') or 0:.3f} s"
                     + (f" (median {med:.3f} s)" if med is not None else ""))
    steps = cost.get("steps") or {}
    if steps.get("mean_us") is not None:  # optcheck.run.sequencer.StepCost: the hooks' own time, snapshots left out
        parts.append(f"{steps['mean_us']:.0f} µs a step over {steps['count']} steps")
    line = "optcheck cost: " + ", ".join(parts)
    if summary.get("elapsed_s"):
        line += f"; run {summary['elapsed_s']:.1f} s"
    return line
