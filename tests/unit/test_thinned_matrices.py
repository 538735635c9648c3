"""The default run's thinned matrices (``THINNED`` in tests/conftest.py, issue 48): each entry names
a parametrized test that exists, and the hook keeps every k-th case and marks the rest ``slow``."""

from __future__ import annotations

import ast
from pathlib import Path

import conftest
from collected_items import collect

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


def test_the_default_run_keeps_every_kth_case_and_slow_runs_the_rest(tmp_path):
    """Collected for real, in one subprocess: of the warm-up matrix (8 cases, every 4th kept) the
    default run (``-m 'not slow'``) keeps 2, the first and the fifth, and marks the other 6 ``slow``."""
    node = "tests/integration/test_monitor_optimizers.py::test_warmup_from_zero_is_silent"
    assert conftest.THINNED[node] == 4
    items = collect(tmp_path / "items.json", "-n", "0", "-m", "slow or not slow", node)
    tiers = [("slow" if d["slow"] else "default", nodeid) for nodeid, d in items.items()]
    assert len(tiers) == 8 and all(nodeid.startswith(node + "[") for _, nodeid in tiers), list(items)
    assert [i for i, (tier, _) in enumerate(tiers) if tier == "default"] == [0, 4]
