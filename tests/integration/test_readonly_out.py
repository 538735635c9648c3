"""Issue 48 point 5: ``--out`` made read-only mid-run (``chmod 555``) gave exit 4 and one line,
but ``summary.json`` kept ``running`` (its temporary file could not be made), and every reader
then guessed "killed (SIGKILL, out of memory)". The summary is rewritten in place there
(``optcheck.run.rundir.write_summary``): it says what happened. Real soak, real permissions: as
root the soak runs without the capabilities that bypass them (util-linux ``setpriv``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SMALL
from optcheck.run import exitcodes

ROOT = Path(__file__).resolve().parents[2]


def _without_dac() -> tuple:
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: a read-only folder stays writable to root")
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search")


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("OPTCHECK_RAISE_INTERNAL", None)
    return env


WRITE = ("import sys\nfrom optcheck.errors import RecordError\nfrom optcheck.run.rundir import write_summary\n"
         "try:\n    write_summary(sys.argv[1], {'status': 'clean', 'last_step': 7})\n"
         "except RecordError as e:\n    print('RecordError', e)\nelse:\n    print('written')\n")


def test_a_summary_in_a_folder_that_takes_no_new_file_is_rewritten_in_place(tmp_path):
    prefix = _without_dac()
    (tmp_path / "summary.json").write_text(json.dumps({"status": "running", "last_step": 3, "pad": "x" * 500}))
    empty = tmp_path / "empty"
    empty.mkdir()
    for d in (tmp_path, empty):
        d.chmod(0o555)
    try:
        run = [*prefix, sys.executable, "-c", WRITE]
        out = subprocess.run([*run, str(tmp_path)], capture_output=True, text=True, env=_env(), timeout=60)
        assert out.stdout.strip() == "written", out.stdout + out.stderr
        s = json.loads((tmp_path / "summary.json").read_text())  # whole: the old, longer text cut off
        assert (s["status"], s["last_step"]) == ("clean", 7) and "pad" not in s
        none = subprocess.run([*run, str(empty)], capture_output=True, text=True, env=_env(), timeout=60)
        assert none.stdout.startswith("RecordError cannot record to") and "Permission denied" in none.stdout
    finally:
        for d in (tmp_path, empty):
            d.chmod(0o755)


def test_out_made_read_only_mid_run_ends_with_a_summary_that_says_what_happened(tmp_path):
    prefix = _without_dac()
    out = tmp_path / "run"
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "optcheck", "soak", "-q", "--steps", "300", "--every",
                             "20", "--out", str(out), *SMALL], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.monotonic() + 300
    while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").stat().st_size > 1000):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    out.chmod(0o555)
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        out.chmod(0o755)
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] != "running", s   # it kept "running": a reader said "killed (SIGKILL ...)"
    assert (proc.returncode, s["status"], s["exit_code"], s["last_step"]) == (exitcodes.CLEAN, "clean", 0, 300), \
        (proc.returncode, stderr, s)
    check = subprocess.run([sys.executable, "-m", "optcheck", "check", str(out)], capture_output=True, text=True,
                           env=_env(), timeout=300)
    assert check.returncode == exitcodes.CLEAN and "ended without closing" not in check.stderr, check.stderr
