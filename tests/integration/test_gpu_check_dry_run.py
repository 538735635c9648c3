"""``benchmarks/gpu_check.sh`` (docs/gpu.md) in its dry-run mode on the CPU: the script a
lent card runs once must not rot between the sessions that have one (a name it used went
missing in a refactor once, and only the card would have found it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_check_runs_every_part_a_cpu_can_run(tmp_path):
    out = tmp_path / "check"
    p = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(out), "--device", "cpu",
                        "--sizes", "tiny", "--steps", "20", "--rounds", "1", "--repeat", "2"],
                       capture_output=True, text=True, timeout=600, env={"PYTHON": sys.executable,
                                                                         "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    res = json.loads((out / "gpu_check.json").read_text())
    assert not [k for k, v in res.items() if isinstance(v, dict) and v.get("error")]
    for loop in ("soak", "monitor"):  # the CPU-side count (the CUDA sync count needs a card)
        assert res["syncs"][loop]["host_reads_by_optcheck_outside_snapshots"] == 0
        assert res["syncs"][loop]["host_reads_by_optcheck_in_snapshots"] > 0  # (the counter counts)
    over = res["overhead"]
    assert over["plain_ms_per_step"]["median"] > 0
    assert over["soak_ratio"]["n"] == over["monitor_ratio"]["n"] == 1 and over["monitor_ratio"]["median"] > 0
    table = (out / "table.md").read_text()
    assert "FAILED" not in table and "host reads by optcheck outside snapshots (counter) | 0 |" in table
