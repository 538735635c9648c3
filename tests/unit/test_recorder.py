"""The one recorder of a run (``optcheck/run/recorder.py``): one writer per directory, a
non-finite loss in the metrics is OC501 at its step once (the next snapshot's own
OC501 on the loss is not reported twice), the summary and exit code come from one
policy, and a ``--nproc`` merged summary is written through it with
``exitcodes.worst``. Real files."""

from __future__ import annotations

import json
import math

import pytest

from optcheck.run import exitcodes
from optcheck.engine import RuleEngine
from optcheck.errors import InputError
from optcheck.run.recorder import RunRecorder, fold_rank_summaries
from optcheck.report.reader import read_summary
from optcheck.run.summary import Summary
from snapfactory import clean


def _rec(out, **kw) -> RunRecorder:
    return RunRecorder(out, Summary(run="r", backend="pytorch", source="soak", steps_requested=10),
                       engine=RuleEngine(), **kw)


def test_one_writer_per_run_directory(tmp_path):
    rec = _rec(tmp_path / "run")
    with pytest.raises(InputError, match="in use by PID"):
        _rec(tmp_path / "run")
    rec.finish()
    rec.close()
    with pytest.raises(InputError, match="already holds a run"):
        _rec(tmp_path / "run")


def test_a_nan_loss_in_the_metrics_is_oc501_at_its_step_once(tmp_path):
    rec = _rec(tmp_path / "run")
    assert rec.metrics([1, 2, 3], [2.0, 1.9, 1.8], [0.1] * 3) == []
    new = rec.metrics([4, 5, 6], [1.7, math.nan, math.nan], [0.1] * 3)
    assert [(f.code, f.step, f.subjects) for f in new] == [("OC501", 5, ["loss"])]
    snap = clean(step=10)
    snap["loss"] = "nan"
    assert [f for f in rec.check(snap) if f.subjects == ["loss"]] == []  # not reported twice
    s = rec.finish()
    rec.close()
    assert (s["status"], s["exit_code"], s["last_step"], s["findings_by_code"]) == ("findings", 1, 10, {"OC501": 1})
    back = read_summary(tmp_path / "run")
    assert back["loss_last"] == "nan" and back["first_finding"]["step"] == 5


def test_the_running_summary_follows_the_snapshots(tmp_path):
    rec = _rec(tmp_path / "run")
    rec.metrics([1, 2], [2.0, 1.9])
    rec.check(clean(step=2))
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (s["status"], s["last_step"], s["snapshots"]) == ("running", 2, 1)
    rec.finish(interrupted=True)
    rec.close()
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (s["status"], s["exit_code"]) == ("interrupted", exitcodes.INTERRUPTED)


def test_set_refuses_a_field_the_summary_does_not_have(tmp_path):
    rec = _rec(None)
    rec.set(threads=3)
    with pytest.raises(AttributeError, match="no field"):
        rec.set(no_such_field=1)


def test_rank_summaries_fold_with_the_worst_exit_code(tmp_path):
    from optcheck.distributed import merge

    for r, (status, code) in enumerate([("record-failed", 4), ("findings", 1), ("crashed", 3)]):
        d = tmp_path / f"rank-{r}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"status": status, "exit_code": code, "last_step": 5 + r,
                                                    "findings": 0}))
    s = fold_rank_summaries(tmp_path, 3, merge.merged(tmp_path, 3))
    assert s["exit_code"] == exitcodes.RECORD_FAILED
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["exit_code"] == 4 and on_disk["schema"] == "optcheck.summary/1" and on_disk["world"] == 3
    assert not list(tmp_path.glob("*.tmp"))
