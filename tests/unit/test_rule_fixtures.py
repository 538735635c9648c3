"""Every rule on its own examples, in the manner of Fixit: each rule class carries
``VALID`` and ``INVALID`` cases (``optcheck/rules/_fixtures.py``) and this one test runs
the whole catalogue on each. A ``Valid`` case gives no finding of the rule's code; an
``Invalid`` case gives one, first at the stated step, naming the stated parameter."""

from __future__ import annotations

import json

import pytest

from optcheck import rules
from optcheck.judge.compare import compare_runs
from optcheck.engine import check_stream
from optcheck.rules import RuleConfig
from optcheck.rules._fixtures import Invalid
from optcheck.record.snapshot import validate

CASES = [(cls, kind, i, case) for cls in rules.catalogue()
         for kind, cases in (("valid", cls.VALID), ("invalid", cls.INVALID)) for i, case in enumerate(cases)]


def _run_dir(path, losses: dict[int, float]):
    """A minimal run directory: the metrics.jsonl a soak writes, one line per step."""
    path.mkdir(parents=True)
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


def mismatch(cls, case, tmp_path) -> str | None:
    """None when ``cls`` behaves as ``case`` says; else what went wrong."""
    for snap in case.snaps:
        validate(snap)  # what a probe could have written: optcheck/schemas/snapshot-1.json
    found = [f for f in findings_of(case, tmp_path) if f.code == cls.code]
    if not isinstance(case, Invalid):
        return f"{cls.code} fired on a valid example: {[f.message for f in found]}" if found else None
    if not found:
        return f"{cls.code} did not fire"
    if found[0].step != case.step:
        return f"{cls.code} fired at step {found[0].step}, not {case.step}: {found[0].message}"
    if case.param is not None and case.param not in found[0].subjects:
        return f"{cls.code} names {found[0].subjects}, not {case.param}"
    return None


@pytest.mark.parametrize("cls,kind,i,case", CASES, ids=[f"{c.code}-{k}{i}-{x.note}" for c, k, i, x in CASES])
def test_rule_on_its_example(cls, kind, i, case, tmp_path):
    assert case.note, "every example says what it shows"
    assert bool(case.snaps) != (case.losses is not None), "an example is a snapshot stream or two runs' losses"
    problem = mismatch(cls, case, tmp_path)
    assert problem is None, problem


def test_a_wrong_example_is_caught(tmp_path):
    """The check can fail: an invalid example that is clean, one at the wrong step or
    naming the wrong parameter, and a valid example that fires."""
    from optcheck.rules._fixtures import Valid, clean, steps

    oc101 = rules.get("OC101")
    bad = oc101.INVALID[0]
    assert mismatch(oc101, Invalid(steps(clean(), 200), "clean", step=100), tmp_path / "a") == "OC101 did not fire"
    assert "not 999" in mismatch(oc101, Invalid(bad.snaps, "step", step=999, param=bad.param), tmp_path / "b")
    assert "not nope" in mismatch(oc101, Invalid(bad.snaps, "param", step=bad.step, param="nope"), tmp_path / "c")
    assert "fired on a valid example" in mismatch(oc101, Valid(bad.snaps, "fires"), tmp_path / "d")
