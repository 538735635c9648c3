"""Report files never overwrite a run's records (issue 26): ``--summary-md``,
``--junit`` and ``--plot`` that resolve to a record file of any run directory are
refused in one line, exit 2, and the record is left as it was (``check``,
``baseline``, ``history``, ``soak``); ``soak --out D --baseline D`` is refused;
``soak --help`` names only commands that exist. Real CLI processes, real files."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLEAN = ROOT / "tests" / "fixtures" / "runs" / "clean"
RECORDS = ("summary.json", "snapshots.jsonl", "findings.jsonl", "metrics.jsonl", "events.jsonl")


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "optcheck", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


def _digest(d: Path) -> dict:
    return {n: hashlib.sha256((d / n).read_bytes()).hexdigest() for n in RECORDS if (d / n).exists()}


@pytest.fixture
def run(tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(CLEAN, d)
    return d


def _refused(res: subprocess.CompletedProcess, option: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith(f"optcheck: error: {option} ") and "record file of a run directory" in lines[0]


@pytest.mark.parametrize("name", RECORDS)
@pytest.mark.parametrize("option", ["--summary-md", "--junit"])
def test_check_refuses_a_report_over_a_record_file(run, name, option):
    before = _digest(run)
    _refused(_cli("check", run, option, run / name), option)
    assert _digest(run) == before


def test_a_symlink_or_a_dotted_path_to_a_record_file_is_refused_too(run, tmp_path):
    link = tmp_path / "report.md"
    link.symlink_to(run / "snapshots.jsonl")
    before = _digest(run)
    _refused(_cli("check", run, "--summary-md", link), "--summary-md")
    _refused(_cli("check", run, "--junit", run / ".." / "run" / "findings.jsonl"), "--junit")
    assert _digest(run) == before


def test_a_record_of_another_run_directory_is_refused(run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(CLEAN, other)
    before = _digest(other)
    _refused(_cli("baseline", run, run, "--summary-md", other / "summary.json"), "--summary-md")
    _refused(_cli("baseline", run, run, "--junit", other / "metrics.jsonl"), "--junit")
    assert _digest(other) == before


def test_history_plot_over_a_record_file_is_refused(run):
    pytest.importorskip("matplotlib")
    before = _digest(run)
    _refused(_cli("history", run, "--plot", run / "summary.json"), "--plot")
    assert _digest(run) == before


def test_soak_refuses_reports_over_its_own_or_another_runs_records(run, tmp_path):
    out = tmp_path / "new"
    for option, target in (("--summary-md", out / "summary.json"), ("--junit", out / "findings.jsonl"),
                           ("--summary-md", run / "snapshots.jsonl")):
        res = _cli("soak", "--steps", 5, "--out", out, option, target)
        _refused(res, option)
        assert not out.exists()  # nothing ran, nothing created


def test_a_report_named_like_a_record_outside_a_run_directory_is_fine(run, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    res = _cli("check", run, "--summary-md", reports / "summary.json")
    assert res.returncode in (0, 1), res.stderr
    assert (reports / "summary.json").read_text().startswith("## ")


def test_soak_with_baseline_equal_to_out_is_refused(run):
    before = _digest(run)
    for out in (run, run / ".." / run.name):
        res = _cli("soak", "--steps", 5, "--out", out, "--baseline", run, "--force")
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "is the --out of this soak" in res.stderr
    assert _digest(run) == before


def test_soak_help_names_no_command_that_does_not_exist():
    res = _cli("soak", "--help")
    assert res.returncode == 0
    assert "--band" not in res.stdout
    assert "optcheck compare" in res.stdout
