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


def run_clis(commands: dict, jobs: int | None = None) -> dict[str, tuple[int, str, str]]:
    """Run independent optcheck commands (``{name: args}`` or ``{name: (args, extra
    environment)}``, e.g. a module's soaks) as
    ``python -m optcheck <args>`` subprocesses, up to ``jobs`` at a time (default: the
    CPU count, at least 2): a soak's worker keeps one core busy, so on two cores two
    soaks side by side take about the time of one. Returns ``{name: (exit code, stdout,
    stderr)}``; each command's result is the same as run alone (a soak's training is
    deterministic for its seed and thread count, whatever runs beside it)."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def one(command) -> tuple[int, str, str]:
        args, extra = command if isinstance(command, tuple) else (command, {})
        p = subprocess.run([sys.executable, "-m", "optcheck", *args], capture_output=True, text=True,
                           env={**env, **extra}, timeout=1800)
        return p.returncode, p.stdout, p.stderr

    with ThreadPoolExecutor(max_workers=jobs or max(2, os.cpu_count() or 1)) as pool:
        futures = {name: pool.submit(one, args) for name, args in commands.items()}
        return {name: f.result() for name, f in futures.items()}
