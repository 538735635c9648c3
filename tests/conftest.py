"""Shared test set-up: paths, a small soak configuration, and CLI helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
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


def run_cli(args: list[str], cwd: str | os.PathLike | None = None):
    """Invoke the optcheck CLI in-process through click's CliRunner; returns (exit_code, stdout, stderr)."""
    from click.testing import CliRunner

    from optcheck.cli import cli

    runner = CliRunner()
    res = runner.invoke(cli, args, catch_exceptions=False, standalone_mode=False)
    rc = res.return_value if isinstance(res.return_value, int) else res.exit_code
    return rc, res.stdout, res.stderr
