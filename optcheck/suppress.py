"""Accepted findings: per-rule, per-parameter suppression, as linters have it.

An entry is ``CODE`` or ``CODE:PATTERN``:

- ``CODE`` is a rule code (``OC205``) or symbol (``stalled-param``);
- ``PATTERN`` is an ``fnmatch`` pattern (``*``, ``?``, ``[...]``, case-sensitive)
  on the parameter names (``subjects``) a finding names: ``OC205:lm_head.*``.

A finding is suppressed when its rule matches an entry without a pattern, or when
*every* parameter it names matches a pattern of an entry for its rule (a finding
that also names a parameter nobody accepted is still reported, whole). A pattern
never matches a finding that names no parameter.

Entries come from the caller (``Monitor(ignore=[...])``, ``--ignore``) and from
the nearest ``pyproject.toml`` (searched from the working directory upwards)::

    [tool.optcheck]
    ignore = ["OC205:lm_head.*", "OC401"]

Suppressed findings are not written to ``findings.jsonl``, not shown and not
counted by the exit code; the summary counts them by code (``suppressed``).
Torch-free.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from optcheck.findings import Finding


@dataclass(frozen=True)
class Ignore:
    """One accepted entry: rule ``code`` ("OC205"), ``pattern`` (None = every finding
    of the rule), and where it came from (``source``: "argument" or a file path)."""

    code: str
    pattern: str | None
    source: str = "argument"


def parse(entries: Iterable[str], source: str = "argument") -> list[Ignore]:
    """Parse ``CODE`` / ``CODE:PATTERN`` entries.

    Raises:
        ValueError: an entry that is not a string, empty, or names no known rule
            (the message names the entry, its source and the known codes).
    """
    from optcheck.rules import get

    out = []
    for e in entries:
        if not isinstance(e, str) or not e.strip():
            raise ValueError(f"ignore entry {e!r} ({source}): expected CODE or CODE:PATTERN, e.g. OC205:lm_head.*")
        code, sep, pattern = e.strip().partition(":")
        try:
            rule = get(code)
        except KeyError as err:
            raise ValueError(f"ignore entry {e!r} ({source}): {err.args[0]}") from None
        if sep and not pattern.strip():
            raise ValueError(f"ignore entry {e!r} ({source}): empty pattern after ':'")
        out.append(Ignore(rule.code, pattern.strip() if sep else None, source))
    return out


def find_config(start: str | Path | None = None) -> Path | None:
    """The nearest ``pyproject.toml`` from ``start`` (default: the working directory) upwards."""
    here = Path(start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        p = d / "pyproject.toml"
        if p.is_file():
            return p
    return None


def load_config(path: str | Path | None = None) -> list[Ignore]:
    """``[tool.optcheck] ignore`` of ``path`` (default: :func:`find_config`); [] when
    there is no file or no such table.

    Raises:
        ValueError: the file is not valid TOML, ``ignore`` is not a list of strings,
            or an entry is bad (see :func:`parse`).
    """
    p = Path(path) if path is not None else find_config()
    if p is None:
        return []
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{p}: cannot read [tool.optcheck]: {e}") from None
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise ValueError(f"{p}: [tool] must be a table, not a {type(tool).__name__} (tool = ...)")
    table = tool.get("optcheck", {})
    if not isinstance(table, dict):
        what = "an array of tables ([[tool.optcheck]])" if isinstance(table, list) else f"a {type(table).__name__}"
        raise ValueError(f"{p}: [tool.optcheck] must be one table, not {what}; write it as [tool.optcheck] "
                         f"with ignore = [\"CODE[:PATTERN]\", ...]")
    entries = table.get("ignore", [])
    if not isinstance(entries, list):
        raise ValueError(f"{p}: [tool.optcheck] ignore must be a list of strings, e.g. [\"OC205:lm_head.*\"]")
    return parse(entries, str(p))


def resolve(ignore: Iterable[str] | None = None, config: str | Path | bool = True) -> list[Ignore]:
    """The entries in force: the config file's (``config``: True = the nearest
    ``pyproject.toml``, a path = that file, False = none) then ``ignore``'s."""
    if isinstance(ignore, (str, bytes)):
        raise ValueError(f"ignore must be a list of CODE or CODE:PATTERN strings, e.g. [{ignore!r}], "
                         f"not a single string")
    found = [] if config is False else load_config(None if config is True else config)
    return found + parse(ignore or [])


def is_suppressed(finding: Finding, ignores: list[Ignore]) -> bool:
    """True when ``ignores`` accept ``finding`` (see the module docstring)."""
    mine = [i for i in ignores if i.code == finding.code]
    if not mine:
        return False
    if any(i.pattern is None for i in mine):
        return True
    if not finding.subjects:
        return False
    return all(any(fnmatch.fnmatchcase(str(s), i.pattern) for i in mine) for s in finding.subjects)
