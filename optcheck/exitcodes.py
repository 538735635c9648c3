"""The exit-code policy, written once (README "Exit codes" repeats this table).

====  ==========================================================================
code  meaning
====  ==========================================================================
0     clean: the run (or the checked stream) has no finding at or above
      ``--fail-on``
1     findings at or above ``--fail-on`` (default: warning)
2     usage or input error: bad option, unknown scenario, missing/empty/corrupt
      data, unwritable ``--out``, a backend that cannot be loaded; one line on
      stderr, nothing run
3     the worker crashed: a Python or .NET exception, a signal (SIGKILL, SIGABRT
      from ``Environment.FailFast``, a segfault) or a non-zero exit; the summary
      names the signal or exception, the last step reached and the tail of the
      worker's stderr. Takes precedence over 1.
130   interrupted (SIGINT/SIGTERM to optcheck): everything written so far is
      flushed and ``summary.json`` says ``interrupted``
====  ==========================================================================
"""

from __future__ import annotations

CLEAN = 0
FINDINGS = 1
USAGE = 2
CRASHED = 3
INTERRUPTED = 130


def run_exit_code(*, crashed: bool, interrupted: bool, worst_rank: int | None, fail_on_rank: int) -> int:
    """The process exit code of a run.

    Args:
        crashed: the worker ended abnormally.
        interrupted: optcheck itself got SIGINT/SIGTERM.
        worst_rank: severity rank of the worst finding (None = no findings).
        fail_on_rank: severity rank of ``--fail-on``.
    """
    if interrupted:
        return INTERRUPTED
    if crashed:
        return CRASHED
    if worst_rank is not None and worst_rank >= fail_on_rank:
        return FINDINGS
    return CLEAN
