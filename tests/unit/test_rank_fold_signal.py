"""Issue 48 points 1-2: which rank a signal stopped first, as ``optcheck soak --nproc`` folds the
ranks (``optcheck.run.rank_fold.fold_ranks``'s ``rank_signal``, read from the launcher's "Root
Cause" report by ``optcheck.distributed.launcher_report.root_cause``). The report below is torch 2.13's
``torch.distributed.run`` text for a SIGTERM to rank 1 at start-up (copied from a real run's
``launcher.log``)."""

from __future__ import annotations

from optcheck.distributed.launcher_report import root_cause
from optcheck.record.summary import Summary
from optcheck.run import exitcodes
from optcheck.run.rank_fold import fold_ranks

REPORT = """[W1202 14:00:23.000000 12650 torch/distributed/elastic/multiprocessing/api.py:1000] Sending process 12657 closing signal SIGTERM
E1202 14:00:23.000000 12650 torch/distributed/elastic/multiprocessing/api.py:900] failed (exitcode: -15) local_rank: 1 (pid: 12658) of binary: python
============================================================
optcheck.distributed.worker FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_14:00:23
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 12658)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 12658
============================================================
"""


def _rank(status: str, code: int, last: int, interrupted_by: str | None = None, crash: dict | None = None) -> dict:
    s = Summary(run="rank", backend="pytorch", source="monitor").to_dict()
    s.update(status=status, exit_code=code, last_step=last, interrupted_by=interrupted_by, crash=crash)
    return s


def test_the_launchers_root_cause_names_a_sigterm():
    assert {k: root_cause(REPORT)[k] for k in ("rank", "exitcode", "signal")} == {"rank": 1, "exitcode": -15, "signal": "SIGTERM"}


def test_a_rank_signalled_at_start_up_is_named_not_the_rank_that_was_not():
    """Rank 1 got SIGTERM before its Monitor ran (no summary); rank 0 had none either: it was
    "CRASHED (exit 3)", ``crash.rank`` 0, ``interrupted_by`` null."""
    s = fold_ranks([None, None], [], [], out="run", source="soak", heartbeats={0: 0, 1: 0},
                   rank_signal={"rank": 1, "signal": "SIGTERM"})
    assert (s["status"], s["exit_code"], s["interrupted_by"]) == ("interrupted", exitcodes.INTERRUPTED, "SIGTERM")
    assert (s["crash"]["rank"], s["crash"]["signal"]) == (1, "SIGTERM"), s["crash"]
    assert s["crash"]["message"].startswith("rank 1 got SIGTERM (not from optcheck) at start-up")
    assert s["missing_ranks"] == [0, 1] and s["ranks"][1]["interrupted_by"] == "SIGTERM"


def test_the_launchers_sigterm_recorded_by_the_other_rank_is_not_the_cause():
    """The race: rank 0 (held, then released) recorded the launcher's SIGTERM as an interruption of its
    own, as rank 1 recorded the user's: both "interrupted by SIGTERM" read as a stop of the whole job,
    ``crash`` null, rank 1 named nowhere. The root cause decides."""
    ranks = [_rank("interrupted", 130, 7, "SIGTERM"), _rank("interrupted", 130, 7, "SIGTERM")]
    before = fold_ranks(ranks, [], [], out="run", source="soak")
    assert before["crash"] is None  # without the root cause: nothing tells the two apart
    s = fold_ranks(ranks, [], [], out="run", source="soak", rank_signal={"rank": 1, "signal": "SIGTERM"})
    assert (s["status"], s["exit_code"], s["interrupted_by"]) == ("interrupted", 130, "SIGTERM")
    assert (s["crash"]["rank"], s["crash"]["step"]) == (1, 8), s["crash"]
    assert s["crash"]["message"] == "rank 1 got SIGTERM (not from optcheck) in step 8; the other ranks were stopped"


def test_a_killed_rank_and_a_rank_own_exception_are_unchanged():
    """The silent side: no ``rank_signal``, the fold is as before (a rank's own exception is the crash)."""
    boom = {"step": 3, "exc_type": "ValueError", "message": "boom"}
    s = fold_ranks([_rank("crashed", 3, 2, crash=boom), _rank("interrupted", 130, 2, "SIGTERM")], [], [],
                   out="run", source="soak")
    assert (s["status"], s["exit_code"], s["crash"]["rank"], s["crash"]["exc_type"]) == ("crashed", 3, 0, "ValueError")


#: torch.distributed.run's report when rank 1 got SIGTERM at start-up and rank 0's rendezvous failed on it in
#: the same second: the two failures tie on their whole-second timestamps and the lower rank is the "Root
#: Cause" (``ChildFailedError.get_first_failure``; the CI rehearsal at bd45ebe read it "CRASHED (exit 3)")
TIED = """E1202 18:01:40.000000 1200 torch/distributed/elastic/multiprocessing/api.py:900] failed (exitcode: 1) local_rank: 0 (pid: 1207) of binary: python
============================================================
optcheck.distributed.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_18:01:40
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 1208)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 1208
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_18:01:40
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 1207)
  error_file: /tmp/torchelastic_x/none_y/attempt_0/0/error.json
  traceback : RuntimeError: Connection closed by peer [127.0.0.1]:29500
============================================================
"""


def test_a_tie_with_the_peer_knocked_on_names_the_signalled_rank():
    from optcheck.distributed.launcher_report import knocked_on_judge, launcher_failures

    def brief(f):
        return f and {k: f[k] for k in ("rank", "exitcode", "signal")}

    assert [brief(f) for f in launcher_failures(TIED)] == [{"rank": 0, "exitcode": 1, "signal": None},
                                                           {"rank": 1, "exitcode": -15, "signal": "SIGTERM"}]
    assert launcher_failures(TIED)[0]["traceback"] == "RuntimeError: Connection closed by peer [127.0.0.1]:29500"
    assert brief(root_cause(TIED)) == {"rank": 0, "exitcode": 1, "signal": None}  # as the launcher says, unjudged
    sigterm = {"rank": 1, "exitcode": -15, "signal": "SIGTERM"}
    # rank 0 left no record: its traceback in the report is the peer's end, so rank 1's signal is the cause
    assert brief(root_cause(TIED, knocked_on_judge([None, None]))) == sigterm
    # rank 0 recorded the peer's end as its crash: the same
    knocked = _rank("crashed", 3, 4, crash={"exc_type": "RuntimeError", "message": "Connection closed by peer"})
    assert brief(root_cause(TIED, knocked_on_judge([knocked, None]))) == sigterm
    # rank 0's own exception, or a signal rank 0 recorded (its Monitor's handler ran, it exited 1), stays the cause
    own = _rank("crashed", 3, 4, crash={"exc_type": "ValueError", "message": "bad batch"})
    assert brief(root_cause(TIED, knocked_on_judge([own, None])))["rank"] == 0
    assert brief(root_cause(TIED, knocked_on_judge([_rank("interrupted", 130, 4, "SIGTERM"), None])))["rank"] == 0
    own_start = TIED.replace("RuntimeError: Connection closed by peer [127.0.0.1]:29500", "ImportError: no module x")
    assert brief(root_cause(own_start, knocked_on_judge([None, None])))["rank"] == 0
    assert brief(root_cause(REPORT, knocked_on_judge([None, None]))) == sigterm
    assert root_cause("no report") is None and launcher_failures("") == []


# torch 2.13's report (trimmed from a real run's launcher.log, stop 53's CI failure) for a SIGTERM to rank 1 after
# its SIGTERM handler was installed but before its Monitor wrote anything: rank 1 raised LauncherStopped (exit 1,
# an error file), the launcher then stopped rank 0 (its "Sending process ... closing signal") and listed it too.
def _stopped_block(rank: int, pid: int) -> str:
    """One failure of the report: rank ``rank`` (PID ``pid``) raised LauncherStopped, exit 1, an error file."""
    return f"""  time      : 2026-12-03_10:31:27
  host      : localhost
  rank      : {rank} (local_rank: {rank})
  exitcode  : 1 (pid: {pid})
  error_file: /tmp/torchelastic_11gvgqxh/none_h4x9bcbo/attempt_0/{rank}/error.json
  traceback : Traceback (most recent call last):
    File "/work/main/optcheck/distributed/watch.py", line 265, in _on_sigterm
      raise LauncherStopped("SIGTERM from the launcher (torch.distributed.run stops every rank when one fails)")
  optcheck.distributed.watch.LauncherStopped: SIGTERM from the launcher (torch.distributed.run stops every rank when one fails)
"""


def _handled(root: tuple[int, int], other: tuple[int, int]) -> str:
    """The report with ``root`` (rank, PID) as the "Root Cause" and ``other`` under "Failures"."""
    return ("W1203 10:31:27.618000 31059 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 31061 "
            "closing signal SIGTERM\n" + "=" * 60 + "\noptcheck.distributed.worker FAILED\n" + "-" * 60
            + "\nFailures:\n[1]:\n" + _stopped_block(*other) + "\n" + "-" * 60
            + "\nRoot Cause (first observed failure):\n[0]:\n" + _stopped_block(*root) + "=" * 60 + "\n")


HANDLED = _handled(root=(1, 31062), other=(0, 31061))


def test_a_handled_sigterm_the_launcher_did_not_send_is_the_signal_and_the_launchers_stops_are_not():
    from optcheck.distributed.launcher_report import knocked_on_judge, launcher_failures, launcher_stopped

    assert launcher_stopped(HANDLED) == {31061}
    assert [(f["rank"], f["pid"], f["signal"], f["stopped"]) for f in launcher_failures(HANDLED)] == [
        (1, 31062, "SIGTERM", False), (0, 31061, None, True)]
    sigterm = {"rank": 1, "exitcode": 1, "signal": "SIGTERM"}
    assert {k: root_cause(HANDLED, knocked_on_judge([None, None]))[k] for k in sigterm} == sigterm
    # the same seconds with the tie to the lower rank: the launcher's stop of rank 0 as the "Root Cause"
    tied = _handled(root=(0, 31061), other=(1, 31062))
    assert [f["rank"] for f in launcher_failures(tied)] == [0, 1]
    assert {k: root_cause(tied, knocked_on_judge([None, None]))[k] for k in sigterm} == sigterm
    # a LauncherStopped the launcher did send (its "closing signal" line for that PID) is no signal of the user's
    assert launcher_failures(HANDLED.replace("process 31061", "process 31062"))[0]["signal"] is None
