"""The rule catalogue itself: every rule documented, and exercised by some test."""

from __future__ import annotations

from pathlib import Path

import pytest

from optcheck import rules
from optcheck.findings import SEVERITIES

TESTS = Path(__file__).resolve().parents[1]
ALL_TEST_TEXT = "\n".join(p.read_text(encoding="utf-8") for p in TESTS.rglob("test_*.py")
                          if p.name != "test_catalogue.py")


@pytest.mark.parametrize("cls", rules.catalogue(), ids=lambda c: c.code)
def test_rule_is_documented(cls):
    assert cls.code.startswith("OC") and cls.symbol and cls.severity in SEVERITIES and cls.message
    doc = cls.doc()
    assert len(doc.splitlines()) >= 3, f"{cls.code} needs a docstring: what, what fails next, how to fix"
    assert "Fix" in doc or "fix" in doc
    assert rules.get(cls.symbol) is cls and rules.get(cls.code.lower()) is cls


@pytest.mark.parametrize("cls", rules.catalogue(), ids=lambda c: c.code)
def test_rule_is_exercised_by_a_test(cls):
    assert cls.code in ALL_TEST_TEXT, f"no test mentions {cls.code}"
