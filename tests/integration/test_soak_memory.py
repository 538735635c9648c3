"""OC401 on real soaks: a leak injected mid-run is flagged with its projected step;
the same soak without it stays silent."""

from __future__ import annotations

import pytest

from conftest import SMALL, run_cli
from optcheck import exitcodes
from optcheck.snapshot import read_jsonl


def test_state_leak_is_flagged_with_a_projected_step(tmp_path):
    out = tmp_path / "leak"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "2000", "--every", "50", "--val-every", "0",
                             "--inject", "state-leak@200", "--memory-budget", "8GiB", "--out", str(out), *SMALL])
    found = [f for f in read_jsonl(out / "findings.jsonl") if f["code"] == "OC401"]
    assert rc == exitcodes.FINDINGS and found, stdout
    f = found[0]
    assert 200 < f["step"] <= 2000 and f["detail"]["projected_step"] > f["step"]
    assert "8 GiB budget at step" in f["message"]


def test_same_soak_without_the_leak_is_silent(tmp_path):
    out = tmp_path / "clean"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "2000", "--every", "50", "--val-every", "0",
                             "--memory-budget", "8GiB", "--out", str(out), *SMALL])
    assert rc == exitcodes.CLEAN, stdout
    assert list(read_jsonl(out / "findings.jsonl")) == []


@pytest.mark.slow
def test_default_20k_soak_is_clean(tmp_path):
    """The main job as the README runs it (minutes): zero findings, loss falls, every snapshot kept."""
    out = tmp_path / "default"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "20000", "--out", str(out)])
    assert rc == exitcodes.CLEAN, stdout
    snaps = list(read_jsonl(out / "snapshots.jsonl"))
    assert len(snaps) == 201 and snaps[-1]["step"] == 20000
