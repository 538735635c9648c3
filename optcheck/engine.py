"""Runs the rule catalogue over a stream of snapshots, as they arrive.

A condition that persists (a stale parameter stays stale) is reported once, at
the first snapshot that shows it; it is reported again only if it clears and
comes back. This is the one place rules are called, for a live soak (in the
supervisor only: a worker runs no rules), a ``Monitor`` and ``optcheck check``
alike; ``optcheck.run.checker.Checker`` wraps the engine of a live run.
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules import Rule, RuleConfig, RuleContext, catalogue
from optcheck.suppress import Ignore, is_suppressed


class RuleEngine:
    """Feed snapshots in step order with :meth:`feed`; get the new findings back.

    Args:
        config: rule knobs (:class:`optcheck.rules.RuleConfig`).
        rules: rule classes to run (default: the whole catalogue).
        history_limit: snapshots kept in ``history`` for rules that look back a
            few snapshots (OC202); older ones are dropped, the first is always kept.
            Rules that need a long series (OC401) keep their own numbers in
            ``memo``. Small on purpose: each snapshot is ~85 KiB of Python objects,
            and a long history would itself look like a leak to OC401.
        ignore: accepted findings (``optcheck.suppress.resolve``): those go to
            ``suppressed`` instead of ``findings`` (and so out of the exit code).
    """

    def __init__(self, config: RuleConfig | None = None, rules: Iterable[type[Rule]] | None = None,
                 history_limit: int = 64, ignore: list[Ignore] | None = None):
        self.config = config or RuleConfig()
        self.rules = [cls() for cls in (rules if rules is not None else catalogue())]
        self.history: list[dict] = []
        self.history_limit = history_limit
        self.memo: dict[str, dict] = {}
        self._active: dict[str, set[str]] = {}
        self.findings: list[Finding] = []
        self.ignore = list(ignore or [])
        self.suppressed: list[Finding] = []

    def feed(self, snap: dict, only: Iterable[str] | None = None) -> list[Finding]:
        """Run every rule on ``snap``; return the findings not reported before.

        ``only``: rule codes to run on a partial record (a metrics line's loss, not a
        snapshot); it joins no history, and what it finds counts as reported for
        the next snapshot's check of the same subject."""
        if only is not None:
            return self._feed_partial(snap, set(only))
        previous = self.history[-1] if self.history else None
        self.history.append(snap)
        if len(self.history) > self.history_limit:
            del self.history[1]
        ctx = RuleContext(previous=previous, history=self.history, config=self.config, memo=self.memo)
        new: list[Finding] = []
        for rule in self.rules:
            ctx.memo.setdefault(rule.code, {})
            found = list(rule.check(snap, ctx))
            keys = {f.key for f in found}
            active = self._active.get(rule.code, set())
            new.extend(f for f in found if f.key not in active)
            self._active[rule.code] = keys
        new = self._keep(new)
        self.findings.extend(new)
        return new

    def _feed_partial(self, record: dict, codes: set[str]) -> list[Finding]:
        previous = self.history[-1] if self.history else None
        ctx = RuleContext(previous=previous, history=self.history, config=self.config, memo=self.memo)
        new: list[Finding] = []
        for rule in self.rules:
            if rule.code not in codes:
                continue
            ctx.memo.setdefault(rule.code, {})
            active = self._active.setdefault(rule.code, set())
            for f in rule.check(record, ctx):
                if f.key not in active:
                    active.add(f.key)
                    new.append(f)
        new = self._keep(new)
        self.findings.extend(new)
        return new

    def _keep(self, new: list[Finding]) -> list[Finding]:
        """Move accepted findings to ``suppressed``; return the rest."""
        if not self.ignore:
            return new
        kept = [f for f in new if not is_suppressed(f, self.ignore)]
        self.suppressed.extend(f for f in new if is_suppressed(f, self.ignore))
        return kept

    def suppressed_by_code(self) -> dict[str, int]:
        """How many findings ``ignore`` accepted, by rule code (the summary's ``suppressed``)."""
        out: dict[str, int] = {}
        for f in self.suppressed:
            out[f.code] = out.get(f.code, 0) + 1
        return out


def check_stream(snapshots: Iterable[dict], config: RuleConfig | None = None,
                 ignore: list[Ignore] | None = None) -> list[Finding]:
    """All findings of a recorded snapshot stream, in order (without those ``ignore`` accepts)."""
    engine = RuleEngine(config, ignore=ignore)
    for snap in snapshots:
        engine.feed(snap)
    return engine.findings
