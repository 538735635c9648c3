"""The exit-code policy, written once (README "Exit codes" repeats this table;
``tests/unit/test_exitcodes_readme.py`` checks they match).

====  ==========================================================================
code  meaning
====  ==========================================================================
0     clean: the run (or the checked stream) has no finding at or above
      ``--fail-on``; ``compare``: the two complete runs agree
1     findings at or above ``--fail-on`` (default: warning); ``compare``: the
      losses diverge (OC601), or a run is incomplete (crashed, interrupted,
      still running, stopped early or shorter than asked): no PASS then
2     usage or input error: bad option, unknown scenario, missing/empty/corrupt
      data, a record of the wrong type, unwritable or busy ``--out`` (another
      optcheck holds its lock), a finished run in ``--out`` without
      ``--force``, a backend that cannot be loaded; one line on stderr, nothing
      run, no run directory left behind
3     the worker crashed or hung: a Python or .NET exception, a signal
      (SIGKILL, SIGABRT from ``Environment.FailFast``, a segfault), a non-zero
      exit, or no step for ``--step-timeout`` seconds; the summary names the
      signal or exception, the last step reached and the tail of the worker's
      stderr. Takes precedence over 1.
4     could not record: a run directory file stopped taking writes (disk full,
      file-size limit, I/O error); the worker is stopped, one line on stderr
      names the file and the OS error, and ``summary.json`` says
      ``record-failed`` wherever it could still be written. Takes precedence
      over 1 and 3.
130   interrupted (SIGINT/SIGTERM to optcheck): the worker flushes what it
      holds and stops (a second signal kills it), everything written so far is
      kept and ``summary.json`` says ``interrupted``
====  ==========================================================================
"""

from __future__ import annotations

CLEAN = 0
FINDINGS = 1
USAGE = 2
CRASHED = 3
RECORD_FAILED = 4
INTERRUPTED = 130


def run_exit_code(*, crashed: bool, interrupted: bool, worst_rank: int | None, fail_on_rank: int,
                  record_failed: bool = False) -> int:
    """The process exit code of a run.

    Args:
        crashed: the worker ended abnormally.
        interrupted: optcheck itself got SIGINT/SIGTERM.
        worst_rank: severity rank of the worst finding (None = no findings).
        fail_on_rank: severity rank of ``--fail-on``.
        record_failed: the run directory stopped taking writes.
    """
    if interrupted:
        return INTERRUPTED
    if record_failed:
        return RECORD_FAILED
    if crashed:
        return CRASHED
    if worst_rank is not None and worst_rank >= fail_on_rank:
        return FINDINGS
    return CLEAN


#: Exit codes from least to most severe: the order :func:`worst` picks by.
SEVERITY_ORDER = (CLEAN, FINDINGS, USAGE, CRASHED, RECORD_FAILED, INTERRUPTED)


def worst(codes) -> int:
    """The worst of several runs' exit codes (interrupted > record-failed > crashed >
    usage > findings > clean); an unknown code counts as worse than all of these
    (it is kept, never dropped); no codes: clean.

    >>> worst([0, 4, 1])
    4
    """
    codes = [c for c in codes if isinstance(c, int) and not isinstance(c, bool)]
    if not codes:
        return CLEAN
    rank = {c: i for i, c in enumerate(SEVERITY_ORDER)}
    return max(codes, key=lambda c: rank.get(c, len(SEVERITY_ORDER)))


#: A run's statuses from least to most severe, beside :data:`SEVERITY_ORDER`: the status of a
#: run of several ranks is the worst of theirs (:func:`worst_status`). A rank still ``running``
#: ranks below one with findings; ``stopped`` (a hazard stopped the step) below a crash.
#: A one-process run's own status is picked by :func:`run_status` in the same order
#: (``running`` first while it runs).
STATUS_ORDER = ("clean", "running", "findings", "stopped", "crashed", "record-failed", "interrupted")


def worst_status(statuses) -> str:
    """The worst of several runs' statuses by :data:`STATUS_ORDER`; an unknown one (an older
    optcheck's, "ended without closing") counts as ``crashed``; none: ``clean``.

    >>> worst_status(["clean", "findings", "running"])
    'findings'
    """
    known = [s if s in STATUS_ORDER else "crashed" for s in statuses]
    return max(known, key=STATUS_ORDER.index, default="clean")


def run_status(*, running: bool = False, interrupted: bool = False, record_failed: bool = False,
               crashed: bool = False, stopped: bool = False, exit_code: int = CLEAN) -> str:
    """A one-process run's ``status``: the worst that holds by :data:`STATUS_ORDER`
    (``running`` first while it runs; ``findings`` when ``exit_code`` is :data:`FINDINGS`)."""
    holds = {"running": running, "interrupted": interrupted, "record-failed": record_failed, "crashed": crashed,
             "stopped": stopped, "findings": exit_code == FINDINGS}
    if running:
        return "running"
    return worst_status(s for s, on in holds.items() if on)
