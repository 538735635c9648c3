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
from optcheck.run.recorder import RankRecorder, RunRecorder
from optcheck.report.reader import read_summary
from optcheck.record.summary import Summary
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


def _ranks(tmp_path, *summaries):
    from optcheck.distributed import merge

    for r, fields in enumerate(summaries):
        d = tmp_path / f"rank-{r}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"findings": 0, **fields}))
    return merge.read_ranks(tmp_path, len(summaries))


def _fold(tmp_path, *summaries, **supervisor):
    from optcheck.distributed import merge

    return RankRecorder(tmp_path, source="soak", knock_on=merge.knock_on).fold(*_ranks(tmp_path, *summaries),
                                                                                **supervisor)


def test_rank_summaries_fold_with_the_worst_exit_code(tmp_path):
    s = _fold(tmp_path, {"status": "record-failed", "exit_code": 4, "last_step": 5},
              {"status": "findings", "exit_code": 1, "last_step": 6}, {"status": "crashed", "exit_code": 3, "last_step": 7})
    assert (s["status"], s["exit_code"], s["last_step"]) == ("record-failed", exitcodes.RECORD_FAILED, 5)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["exit_code"] == 4 and on_disk["schema"] == "optcheck.summary/1" and on_disk["world"] == 3
    assert not list(tmp_path.glob("*.tmp"))


GLOO = {"step": 6, "exc_type": "RuntimeError", "message": "[gloo/transport/tcp/pair.cc:553] Connection closed by peer"}


def test_a_signal_to_one_rank_names_the_rank_and_the_signal_not_the_peers_knock_on(tmp_path):
    """Issue 35: SIGTERM to rank 1 of ``soak --nproc 2`` (not to optcheck) read "INTERRUPTED (exit 130)"
    with rank 0's gloo "Connection closed by peer" as the crash, interrupted_by null."""
    s = _fold(tmp_path, {"status": "crashed", "exit_code": 3, "last_step": 5, "crash": GLOO},
              {"status": "interrupted", "exit_code": 130, "last_step": 5, "interrupted_by": "SIGTERM"},
              launcher_exit=1)
    assert (s["status"], s["exit_code"], s["interrupted_by"]) == ("interrupted", 130, "SIGTERM")
    assert (s["crash"]["rank"], s["crash"]["signal"], s["crash"]["step"]) == (1, "SIGTERM", 6)
    assert "rank 1 got SIGTERM (not from optcheck) in step 6" in s["crash"]["message"]


def test_one_status_order_a_ranks_own_crash_outranks_the_launchers_stop_of_the_others(tmp_path):
    own = {"step": 12, "exc_type": "RuntimeError", "message": "Expected to have finished reduction"}
    s = _fold(tmp_path, {"status": "interrupted", "exit_code": 130, "last_step": 11, "interrupted_by": "SIGTERM"},
              {"status": "crashed", "exit_code": 3, "last_step": 11, "crash": own}, launcher_exit=1)
    assert (s["status"], s["exit_code"], s["crash"]["rank"]) == ("crashed", 3, 1)
    # optcheck itself signalled: interrupted whatever the ranks say; a fault seen from outside: crashed
    assert _fold(tmp_path / "a", {"status": "clean", "exit_code": 0, "last_step": 9},
                 {"status": "running", "exit_code": 0, "last_step": 8}, interrupted_by="SIGINT",
                 heartbeats={1: 9})["status"] == "interrupted"
    hang = {"rank": 1, "step": 9, "exc_type": "Hang", "message": "rank 1 made no progress"}
    s = _fold(tmp_path / "b", {"status": "interrupted", "exit_code": 130, "last_step": 8, "interrupted_by": "SIGTERM"},
              {"status": "running", "exit_code": 0, "last_step": 3}, fault=hang, heartbeats={1: 8})
    assert (s["status"], s["exit_code"], s["crash"]) == ("crashed", 3, hang)


def test_every_rank_interrupted_by_one_signal_is_the_jobs_interruption(tmp_path):
    s = _fold(tmp_path, *[{"status": "interrupted", "exit_code": 130, "last_step": 4, "interrupted_by": "SIGINT"}] * 2)
    assert (s["status"], s["exit_code"], s["interrupted_by"], s["crash"]) == ("interrupted", 130, "SIGINT", None)


@pytest.mark.parametrize("bad", [2.0**63, 9.223372036854776e18, float("nan"), float("inf"), -3, True, "7", [1]])
def test_a_step_number_out_of_range_never_reaches_the_summary(tmp_path, bad):
    """A damaged worker message (hypothesis found a 'stopped' at step 9.22e18 = 2**63): the
    recorder passes it over, so the summary it writes reads back (before: last_step
    2**63 was written, and every reader refused the file as damaged)."""
    rec = _rec(tmp_path / "run")
    rec.metrics([1, 2], [2.0, 1.9], [0.1] * 2)
    rec.reached(bad)
    rec.reached(5.0)  # a whole float is a step
    summary = rec.finish()
    rec.close()
    assert summary["last_step"] == 5 and isinstance(summary["last_step"], int)
    assert read_summary(tmp_path / "run")["last_step"] == 5


def test_a_fold_racing_another_ranks_fold_writes_the_summary(tmp_path, monkeypatch):
    """Two ranks fold OUT/summary.json in turn (rank 0 at its close, a later rank after it):
    one's write can fail while the other replaces the file, and the reserve is already gone.
    Seen in a full run: FileNotFoundError on the reserve out of rank 0's close (exit 1). Now
    the fold writes again."""
    from optcheck.errors import RecordError
    from optcheck.run import rundir

    real, calls = rundir.write_summary, []

    def racing(path, summary):
        calls.append(path)
        if len(calls) == 1:  # the other rank's rename took our temporary file away
            raise RecordError(path, FileNotFoundError(2, "No such file or directory"))
        return real(path, summary)

    monkeypatch.setattr(rundir, "write_summary", racing)
    s = _fold(tmp_path, {"status": "clean", "exit_code": 0, "last_step": 5},
              {"status": "clean", "exit_code": 0, "last_step": 5})
    assert not (tmp_path / rundir.RESERVE_NAME).exists() and len(calls) == 2
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == s["status"] == "clean"
