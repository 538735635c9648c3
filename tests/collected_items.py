"""Test items as collected by ``pytest --collect-only`` in a subprocess, each described by :func:`described`: its
function's source, its parametrize values and its tier. Used by tests/unit/test_catalogue.py (which real run
asserts which rule) and tests/unit/test_thinned_matrices.py (which cases the default run keeps)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def described(item) -> dict:
    """``{"source": the test function's source, "params": {name: repr(value)}, "slow": marked slow}``."""
    cs = getattr(item, "callspec", None)
    return {"source": inspect.getsource(item.function),
            "params": {k: repr(v) for k, v in (cs.params if cs else {}).items()},
            "slow": item.get_closest_marker("slow") is not None}


#: argv: the JSON file to write, then pytest's arguments
_SCRIPT = """
import json, sys
import pytest
sys.path.insert(0, "tests")
from collected_items import described

class Items:
    out = {}

    def pytest_collection_finish(self, session):
        for item in session.items:
            self.out[item.nodeid] = described(item)

items = Items()
rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[2:]], plugins=[items])
with open(sys.argv[1], "w") as f:
    json.dump({"rc": int(rc), "items": items.out}, f)
"""


def collect(out: Path, *args: str) -> dict[str, dict]:
    """{node id: :func:`described`} of what ``pytest --collect-only *args`` selects from the checkout, collected
    in a subprocess that writes ``out``. Raises AssertionError, with pytest's output, when collection fails."""
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(out), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["rc"] == 0, proc.stdout[-2000:]
    return res["items"]
