"""The held-out loss of a real soak: evaluated at every ``--val-every`` step and at the
last step, and one evaluation printed as one value, not as a change (issue: 1,000 steps
with the default ``--val-every 1000`` printed ``held-out 2.2601 -> 2.2601``)."""

from __future__ import annotations

import json

import pytest

from conftest import SMALL, run_clis
from optcheck.run import exitcodes
from optcheck.record.check import read_snapshots


@pytest.fixture(scope="module")
def soaks(tmp_path_factory):
    """The module's two soaks (100 and 150 steps, held-out loss every 100), run side by side once."""
    root = tmp_path_factory.mktemp("held_out")
    done = run_clis({steps: ["soak", "--steps", str(steps), "--every", "50", "--out", str(root / str(steps)), *SMALL,
                             "--val-every", "100"] for steps in (100, 150)})
    return {steps: (root / str(steps), rc, stdout) for steps, (rc, stdout, _) in done.items()}


def _soak(soaks, steps):
    out, rc, stdout = soaks[steps]
    assert rc == exitcodes.CLEAN, stdout
    loss_line = next(line for line in stdout.splitlines() if line.startswith("  loss"))
    return json.loads((out / "summary.json").read_text()), read_snapshots(out / "snapshots.jsonl"), loss_line


def test_one_evaluation_is_printed_as_one_value(soaks):
    summary, snaps, line = _soak(soaks, 100)
    assert summary["val_step_first"] == summary["val_step_last"] == 100
    assert summary["val_loss_first"] == summary["val_loss_last"]
    assert [s["step"] for s in snaps if s.get("val_loss") is not None] == [100]
    assert line.endswith(f"held-out {summary['val_loss_last']:.4f} (step 100 only)"), line
    assert "->" not in line.split("held-out")[1]


def test_the_last_step_is_evaluated_too(soaks):
    summary, snaps, line = _soak(soaks, 150)
    assert (summary["val_step_first"], summary["val_step_last"]) == (100, 150)
    vals = {s["step"]: s["val_loss"] for s in snaps if s.get("val_loss") is not None}
    assert list(vals) == [100, 150]
    assert summary["val_loss_first"] == vals[100] and summary["val_loss_last"] == vals[150]
    assert vals[150] < vals[100]                      # 50 more steps of training on byte tokens
    assert line.endswith(f"held-out {vals[100]:.4f} -> {vals[150]:.4f}"), line
