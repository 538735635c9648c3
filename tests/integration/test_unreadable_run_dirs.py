"""Issue 48 point 3: a run directory the user may not read (a folder above it without permission) is
one line and exit 2 in every reading command, never a traceback. Real permissions: the folder is
``chmod 000``; as root, the command runs without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH (``setpriv``),
so the kernel refuses it as it refuses any other user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

CLEAN = ROOT / "tests" / "fixtures" / "runs" / "clean"


def _unprivileged() -> list[str]:
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): cannot drop the right to read any folder")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


@pytest.fixture
def locked(tmp_path):
    top = tmp_path / "N"
    top.mkdir()
    for night in ("night-1", "night-2"):
        shutil.copytree(CLEAN, top / night)
    top.chmod(0)
    prefix = _unprivileged()
    if subprocess.run([*prefix, "ls", str(top)], capture_output=True).returncode == 0:
        top.chmod(0o755)
        pytest.skip("this process reads a chmod 000 folder all the same (no way to drop the privilege here)")
    yield top, prefix
    top.chmod(0o755)


@pytest.mark.parametrize("args", [
    ["check", "{N}/night-1"],
    ["check", "{N}/night-1/snapshots.jsonl"],
    ["compare", "{N}/night-1", "{N}/night-2"],
    ["compare", str(CLEAN), "{N}/night-2"],
    ["baseline", str(CLEAN), "{N}/night-1"],
    ["history", "{N}"],
])
def test_an_unreadable_run_directory_is_one_line_and_exit_2(locked, args):
    top, prefix = locked
    argv = [a.replace("{N}", str(top)) for a in args]
    proc = subprocess.run([*prefix, sys.executable, "-m", "optcheck", *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("optcheck: error: " + str(top)), proc.stderr
    assert "cannot read (Permission denied)" in lines[0], proc.stderr
