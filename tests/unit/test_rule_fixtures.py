"""Every rule on its own examples, in the manner of Fixit: each rule class carries
``VALID`` and ``INVALID`` cases (``optcheck/rules/_fixtures.py``) and this one test runs
the whole catalogue on each. A ``Valid`` case gives no finding of the rule's code; an
``Invalid`` case gives one, first at the stated step, naming the stated parameter."""

from __future__ import annotations

import json

import pytest

from optcheck import rules
from optcheck.compare import compare_runs
from optcheck.engine import check_stream
from optcheck.rules import RuleConfig
from optcheck.rules._fixtures import Invalid

CASES = [(cls, kind, i, case) for cls in rules.catalogue()
         for kind, cases in (("valid", cls.VALID), ("invalid", cls.INVALID)) for i, case in enumerate(cases)]


def _run_dir(path, losses: dict[int, float]):
    """A minimal run directory: the metrics.jsonl a soak writes, one line per step."""
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": v}) + "\n"
                                                for s, v in sorted(losses.items())))
    return path


def findings_of(case, tmp_path) -> list:
    """What the catalogue says about ``case``: the findings of its snapshot stream, or
    of ``optcheck compare`` over two run directories holding its two loss trajectories."""
    if case.losses is not None:
        a, b = case.losses
        return compare_runs(_run_dir(tmp_path / "a", a), _run_dir(tmp_path / "b", b)).findings
    return check_stream(list(case.snaps), RuleConfig(**case.config))


@pytest.mark.parametrize("cls,kind,i,case", CASES, ids=[f"{c.code}-{k}{i}-{x.note}" for c, k, i, x in CASES])
def test_rule_on_its_example(cls, kind, i, case, tmp_path):
    assert case.note, "every example says what it shows"
    assert bool(case.snaps) != (case.losses is not None), "an example is a snapshot stream or two runs' losses"
    found = [f for f in findings_of(case, tmp_path) if f.code == cls.code]
    if not isinstance(case, Invalid):
        assert found == [], [f.message for f in found]
        return
    assert found, f"{cls.code} did not fire on: {case.note}"
    assert found[0].step == case.step, (found[0].step, found[0].message)
    if case.param is not None:
        assert case.param in found[0].subjects, (found[0].subjects, found[0].message)
