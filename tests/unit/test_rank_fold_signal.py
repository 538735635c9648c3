"""Issue 48 points 1-2: which rank a signal stopped first, as ``optcheck soak --nproc`` folds the
ranks (``optcheck.run.rank_fold.fold_ranks``'s ``rank_signal``, read from the launcher's "Root
Cause" report by ``optcheck.distributed.soak.root_cause``). The report below is torch 2.13's
``torch.distributed.run`` text for a SIGTERM to rank 1 at start-up (copied from a real run's
``launcher.log``)."""

from __future__ import annotations

from optcheck.distributed.soak import root_cause
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
    assert root_cause(REPORT) == {"rank": 1, "exitcode": -15, "signal": "SIGTERM"}


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
