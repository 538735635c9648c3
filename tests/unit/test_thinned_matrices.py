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


def test_the_default_run_keeps_every_kth_case_and_slow_runs_the_rest():
    """Collected for real: of the warm-up matrix (8 cases, every 4th kept) the default run selects
    2, ``-m slow`` the other 6, and together they are the whole matrix."""
    node = "tests/integration/test_monitor_optimizers.py::test_warmup_from_zero_is_silent"
    assert conftest.THINNED[node] == 4

    def ids(marker: str) -> list[str]:
        p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-m", marker, node],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return [line for line in p.stdout.splitlines() if line.startswith(node)]

    default, slow = ids("not slow"), ids("slow")
    assert len(default) == 2 and len(slow) == 6 and not set(default) & set(slow)
    everything = ids("slow or not slow")
    assert sorted(default + slow) == sorted(everything) and everything.index(default[1]) == 4
