"""Shared test set-up: paths, a small soak configuration, and CLI helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

# A model small enough for a few hundred steps in seconds on one thread.
SMALL = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--batch-size", "8",
         "--val-every", "100"]


@pytest.fixture
def small_args():
    return list(SMALL)


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield


@pytest.fixture(autouse=True)
def _no_monitor_left_open():
    """A test whose loop died inside an optcheck.Monitor must not leave its hooks to the next test."""
    yield
    mod = sys.modules.get("optcheck.monitor")
    if mod is not None:
        for mon in list(mod._ACTIVE):
            mon.close()
        assert not mod._ACTIVE and not mod._ORIG


def start_long_soak(out: Path, snapshots: int = 3, timeout_s: float = 90.0):
    """Start ``optcheck soak`` (100,000 steps of the small model, a snapshot every 20)
    in a subprocess and return it once ``out`` holds ``snapshots`` snapshots, with
    the worker's pid (from the hello event)."""
    import json
    import subprocess
    import time

    proc = subprocess.Popen([sys.executable, "-m", "optcheck", "soak", "-q", "--steps", "100000", "--every", "20",
                             "--out", str(out), *SMALL], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout_s
    snaps = out / "snapshots.jsonl"
    while time.time() < deadline and not (snaps.exists() and len(snaps.read_text().splitlines()) >= snapshots):
        time.sleep(0.2)
    hello = next(line for line in (out / "events.jsonl").read_text().splitlines() if '"hello"' in line)
    return proc, json.loads(hello)["pid"]


def run_cli(args: list[str], cwd: str | os.PathLike | None = None):
    """Invoke the optcheck CLI in-process through click's CliRunner; returns (exit_code, stdout, stderr)."""
    from click.testing import CliRunner

    from optcheck.cli import cli

    runner = CliRunner()
    res = runner.invoke(cli, args, catch_exceptions=False, standalone_mode=False)
    rc = res.return_value if isinstance(res.return_value, int) else res.exit_code
    return rc, res.stdout, res.stderr
