"""The default run's thinned matrices (``THINNED`` in tests/conftest.py, issue 48): each entry names
a parametrized test that exists, and the hook keeps every k-th case and marks the rest ``slow``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[2]


def _parametrized(path: Path, name: str) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return any("parametrize" in ast.unparse(d) for d in node.decorator_list)
    return False


def test_every_thinned_entry_is_a_parametrized_test_and_keeps_at_least_one_case_in_two():
    assert conftest.THINNED
    for key, k in conftest.THINNED.items():
        path, name = key.split("::")
        assert (ROOT / path).is_file() and _parametrized(ROOT / path, name), key
        assert isinstance(k, int) and k >= 2, key


#: collects the tests named in argv[1] with every case selected, and prints each with its tier
_COLLECT = """
import sys, pytest
class Tiers:
    def pytest_collection_finish(self, session):
        for item in session.items:
            print("ITEM", "slow" if item.get_closest_marker("slow") else "default", item.nodeid)
sys.exit(pytest.main(["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "slow or not slow",
                      sys.argv[1]], plugins=[Tiers()]))
"""


def test_the_default_run_keeps_every_kth_case_and_slow_runs_the_rest():
    """Collected for real, in one subprocess: of the warm-up matrix (8 cases, every 4th kept) the
    default run (``-m 'not slow'``) keeps 2, the first and the fifth, and marks the other 6 ``slow``."""
    node = "tests/integration/test_monitor_optimizers.py::test_warmup_from_zero_is_silent"
    assert conftest.THINNED[node] == 4
    p = subprocess.run([sys.executable, "-c", _COLLECT, node], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    tiers = [line.split(" ", 2)[1:] for line in p.stdout.splitlines() if line.startswith("ITEM ")]
    assert len(tiers) == 8 and all(nodeid.startswith(node + "[") for _, nodeid in tiers), p.stdout[-2000:]
    assert [i for i, (tier, _) in enumerate(tiers) if tier == "default"] == [0, 4]
