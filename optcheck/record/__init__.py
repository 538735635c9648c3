"""The record format: what a run directory holds, as the rules and every reader see it. Torch-free.

- ``snapshot.py``: snapshot schema 1 (its docstring explains every field), JSON Lines
  I/O (non-finite numbers as strings), schema validation;
- ``check.py``: how records are read back (schema for the first lines, a structural
  check for the rest; an older summary's fields typed loosely; integers out of range);
- ``summary.py``: :class:`~optcheck.record.summary.Summary`, ``summary.json``'s one type,
  and the published schema built from its fields.

The lowest layer of optcheck's own packages: the rules (``optcheck/rules/``) read
snapshots through it, the run's writer (``optcheck/run/``) writes them through it, and it
imports neither of them (``tests/unit/test_layout.py``).
"""
