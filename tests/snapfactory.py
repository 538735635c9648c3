"""Builds small, valid schema-1 snapshots for rule tests (no torch): the builders the
rules' own VALID/INVALID examples use (``optcheck/rules/_fixtures.py``)."""

from __future__ import annotations

from optcheck.rules._fixtures import at, clean, member, param, state_of  # noqa: F401
