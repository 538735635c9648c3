"""Issue 48 point 5: --out made read-only mid-run (chmod 555): summary.json must not keep "running". Real
permissions: the final write runs without CAP_DAC_OVERRIDE (setpriv) as root, or as the user itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

WRITE = ("import sys; from optcheck.run.rundir import write_summary; "
         "write_summary(sys.argv[1], {'status': sys.argv[2], 'exit_code': 4})")


def _unprivileged() -> list[str]:
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): a chmod 555 folder stays writable to root")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


def test_a_folder_made_read_only_mid_run_still_gets_the_final_status(tmp_path):
    prefix = _unprivileged()
    out = tmp_path / "run"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([*prefix, sys.executable, "-c", WRITE, str(out), "running"], check=True, env=env)
    out.chmod(0o555)
    try:
        if subprocess.run([*prefix, "touch", str(out / "probe")], capture_output=True).returncode == 0:
            pytest.skip("this process creates files in a chmod 555 folder all the same")
        proc = subprocess.run([*prefix, sys.executable, "-c", WRITE, str(out), "record_failed"], env=env,
                              capture_output=True, text=True)
    finally:
        out.chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "record_failed" and s["exit_code"] == 4
    assert sorted(os.listdir(out)) == ["summary.json"]
