"""The rule check of a live run: :class:`Checker`, the run's one rule engine with the
run directory it writes to (``optcheck/run/recorder.py`` owns one). Torch-free."""

from __future__ import annotations

import time
from typing import Callable

from optcheck.engine import RuleEngine
from optcheck.findings import Finding, severity_rank
from optcheck.run.sequencer import Cost


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
