"""The supervisor's own life: SIGTERM/SIGINT flush and summarise; two backends in
one command, then compared; --same-init errors are one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import start_long_soak
from optcheck.run import exitcodes
from optcheck.record.check import read_snapshots


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_optcheck_flushes_and_writes_the_summary(tmp_path, sig):
    out = tmp_path / "run"
    proc, worker = start_long_soak(out)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == exitcodes.INTERRUPTED, stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["last_step"] >= 40 and s["snapshots"] >= 3
    assert len(read_snapshots(out / "snapshots.jsonl")) == s["snapshots"]
    assert "Traceback" not in stderr
    # the worker went with it
    assert not Path(f"/proc/{worker}").exists() or "zombie" in Path(f"/proc/{worker}/status").read_text()


def test_same_init_without_a_torchsharp_build_is_one_line(tmp_path):
    env_path = "/usr/bin:/bin"  # no dotnet SDK on PATH
    proc = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--backend", "pytorch,torchsharp",
                           "--same-init", "--steps", "10", "--out", str(tmp_path / "pair")],
                          capture_output=True, text=True, env={"PATH": env_path, "HOME": str(tmp_path)})
    assert proc.returncode == exitcodes.USAGE
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "dotnet" in lines[0] and "SDK" in lines[0]
    assert not (tmp_path / "pair" / "pytorch").exists()  # nothing ran


@pytest.mark.dotnet
@pytest.mark.slow  # the default run pairs the backends on real TorchSharp (test_real_soak.py) and fires OC601 in compare
def test_two_backends_run_one_after_the_other_and_are_compared(tmp_path):
    """PyTorch's GPT beside the .NET stand-in loop (tests/dotnet): both run directories are
    written, then compared; a different model must diverge (OC601, exit 1)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dotnet"))
    from build import BuildUnavailable, build_testloop

    try:
        dll = build_testloop()
    except BuildUnavailable as e:
        pytest.skip(str(e))
    out = tmp_path / "pair"
    proc = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--backend", "pytorch,torchsharp",
                           "--steps", "200", "--every", "50", "--dotnet-assembly", str(dll),
                           "--dotnet-trainer", "OptCheckTest.LazyTrainer", "--out", str(out),
                           "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16",
                           "--batch-size", "4"], capture_output=True, text=True, timeout=300)
    for b in ("pytorch", "torchsharp"):
        s = json.loads((out / b / "summary.json").read_text())
        assert s["backend"] == b and s["status"] == "clean" and s["last_step"] == 200, proc.stderr
    assert "OC601" in proc.stdout and proc.returncode == exitcodes.FINDINGS
