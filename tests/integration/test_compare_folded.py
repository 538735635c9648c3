"""``optcheck compare`` and ``--baseline`` of a run folded from several streams (issue 47):
a GAN under ``optcheck run`` (two optimizers: ``rank-0``, ``rank-1``, no ``metrics.jsonl`` at
the top) is judged stream by stream (``optcheck/judge/folded.py``); a folded run against a
one-stream run or one of other streams is one line, exit 2. Real runs, no mocks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from test_run_command import GAN, ROOT, optcheck_run, script


def cli(cwd, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optcheck", *args], cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def gan_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gan")
    script(tmp, "gan.py", GAN)
    rc, _, stderr, out = optcheck_run(tmp, sys.executable, "gan.py")
    assert rc == 0, stderr
    assert not (out / "metrics.jsonl").exists() and (out / "rank-1" / "metrics.jsonl").exists()  # folded
    return tmp, out


def test_compare_a_folded_run_with_itself_rank_by_rank(gan_run):
    tmp, out = gan_run
    p = cli(tmp, "compare", str(out), str(out))
    assert p.returncode == 0, p.stderr
    assert "== rank 0 ==" in p.stdout and "== rank 1 ==" in p.stdout
    assert p.stdout.count("IDENTICAL") == 2 and "no training step in common" not in p.stdout + p.stderr
    j = json.loads(cli(tmp, "compare", "--json", str(out), str(out)).stdout)
    assert [r["rank"] for r in j] == [0, 1]


def test_folded_against_one_stream_or_other_streams_is_one_line_exit_2(gan_run, tmp_path):
    tmp, out = gan_run
    p = cli(tmp, "compare", str(out), str(out / "rank-0"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "folded from 2 streams" in p.stderr and "one stream" in p.stderr
    fewer = tmp_path / "fewer"
    shutil.copytree(out, fewer)
    shutil.rmtree(fewer / "rank-1")
    shutil.copytree(out / "rank-0", fewer / "rank-2")  # streams 0 and 2: not rank-0/rank-1
    p = cli(tmp, "baseline", str(fewer), str(out))
    assert p.returncode == 2 and "Traceback" not in p.stderr and "rank by rank" in p.stderr, p.stderr


def test_baseline_of_a_folded_run_judged_stream_by_stream(gan_run):
    tmp, out = gan_run
    p = cli(tmp, "baseline", str(out), str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "NO REGRESSION against the baseline" in p.stdout
    assert "rank 0: final loss" in p.stdout and "rank 1: final loss" in p.stdout


@pytest.mark.slow  # (a second optcheck run)
def test_run_baseline_folded_regression_names_the_stream(gan_run):
    tmp, out = gan_run
    rc, stdout, stderr, _ = optcheck_run(tmp, sys.executable, "gan.py", "fault", out="night2",
                                         options=("--every", "5", "--baseline", str(out)))
    assert rc == 1, stderr
    assert "REGRESSION against the baseline: rank 1 findings: new OC101" in stdout
    assert "ok           findings: rank 0: none" in stdout
