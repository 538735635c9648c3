"""The README's "Exit codes" table and optcheck/run/exitcodes.py say the same thing."""

from __future__ import annotations

import re

from conftest import ROOT
from optcheck.run import exitcodes


def readme_codes() -> dict[int, str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| (.+) \|$", section, re.M)}


def docstring_codes() -> dict[int, str]:
    """The reST table of the module docstring: a code starts an entry, indented lines continue it."""
    out: dict[int, str] = {}
    code = None
    for line in exitcodes.__doc__.splitlines():
        m = re.match(r"^(\d+) +(\S.*)$", line)
        if m:
            code = int(m.group(1))
            out[code] = m.group(2)
        elif code is not None and line.startswith("      "):
            out[code] += " " + line.strip()
    return out


def test_readme_table_lists_exactly_the_codes_exitcodes_defines():
    defined = {v for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int)}
    assert set(readme_codes()) == defined == set(docstring_codes())


def test_each_code_means_the_same_in_both():
    readme, doc = readme_codes(), docstring_codes()
    for code, words in {0: ("clean",), 1: ("findings", "diverge", "incomplete"), 2: ("input", "one line"),
                        3: ("crashed", "step-timeout"), 4: ("could not record", "disk full"),
                        130: ("interrupted", "sigterm")}.items():
        for word in words:
            assert word in readme[code].lower() and word in doc[code].lower(), (code, word)
