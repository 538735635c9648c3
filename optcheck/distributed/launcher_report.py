"""What ``torch.distributed.run`` says about the ranks that failed: its error report
("Failures:" and "Root Cause (first observed failure)", ``torch/distributed/elastic/
multiprocessing/errors/__init__.py``), as ``optcheck soak --nproc`` writes it to
``OUT/launcher.log``, and which of those failures is the run's cause. Torch-free.

Facts it relies on (torch 2.13, ``torch/distributed/elastic/multiprocessing/api.py``,
``SubprocessContext._poll`` and ``_close``): once one rank has failed the launcher sends every
rank still running SIGTERM, logging ``Sending process PID closing signal SIGTERM`` for each, and
then lists those ranks among the "Failures" too (exit -15, or 1 where a handler turned the
signal into an exception, as optcheck's ``LauncherStopped`` does). A rank whose PID the
launcher did not log that way ended on its own: its exception, or a signal from someone else.
The "first observed failure" is the earliest by a timestamp in whole seconds, ties to the
lower rank.
"""

from __future__ import annotations

import re
import signal
from typing import Callable

from optcheck.distributed import merge

HANDLED_SIGTERM = "LauncherStopped"  # optcheck.distributed.watch: a rank's SIGTERM, raised as an exception


def launcher_stopped(log: str) -> set[int]:
    """PIDs the launcher itself sent a closing signal ("Sending process PID closing signal SIG...")."""
    return {int(m.group(1)) for m in re.finditer(r"Sending process (\d+) closing signal", log)}


def launcher_failures(log: str) -> list[dict]:
    """Every failed rank of ``torch.distributed.run``'s error report
    (``torch/distributed/elastic/multiprocessing/errors``), the "Root Cause" one first: each
    ``{"rank", "exitcode", "pid", "signal", "stopped", "traceback"}``: ``signal`` a name, or None
    for an exit code >= 0 (a SIGTERM that the rank's handler raised as ``LauncherStopped``, and that
    the launcher did not send, is "SIGTERM"); ``stopped`` True where the launcher sent the rank its
    closing signal (:func:`launcher_stopped`: it failed as a knock-on of another's failure);
    ``traceback`` the report's text for it (the rank's error file's message, or the signal)."""
    head, sep, root = log.rpartition("Root Cause")
    if not sep:
        return []
    by_launcher = launcher_stopped(log)

    def parse(text: str) -> list[dict]:
        found = []
        for chunk in re.split(r"^\[\d+\]:\s*$", text, flags=re.M)[1:]:
            rank = re.search(r"^\s*rank\s*:\s*(\d+)", chunk, re.M)
            code = re.search(r"^\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?", chunk, re.M)
            if not (rank and code):
                continue
            exitcode, pid = int(code.group(1)), int(code.group(2)) if code.group(2) else None
            text = re.split(r"^[=-]{5,}\s*$", chunk.partition("traceback :")[2], flags=re.M)[0].strip()
            stopped = pid in by_launcher
            sig = signal.Signals(-exitcode).name if exitcode < 0 and -exitcode in signal.valid_signals() else None
            if sig is None and not stopped and HANDLED_SIGTERM in text:
                sig = "SIGTERM"
            found.append({"rank": int(rank.group(1)), "exitcode": exitcode, "pid": pid, "signal": sig,
                          "stopped": stopped, "traceback": text})
        return found

    return parse(root)[:1] + parse(head.rpartition("Failures:")[2])


def root_cause(log: str, knocked_on: Callable[[dict], bool] | None = None) -> dict | None:
    """The failed rank of ``torch.distributed.run``'s "Root Cause" report
    (:func:`launcher_failures`: ``{"rank", "exitcode", "pid", "signal", "stopped", "traceback"}``) or None.

    The launcher's "first observed failure" is the earliest by a timestamp in whole seconds
    (``ChildFailedError.get_first_failure``): a rank killed by a signal (no error file: stamped
    when the launcher saw it) and the peer whose rendezvous or collective failed on it (stamped by
    its error file) often tie, and the tie goes to the lower rank. So where the root cause is no
    signal and ``knocked_on(failure)`` says its end was the knock-on of a peer's, a failure by a
    signal listed beside it is the cause. Before that, the ranks the launcher stopped itself
    (``stopped``) are passed over: a tie can make one of them the "Root Cause"."""
    failures = launcher_failures(log)
    if not failures:
        return None
    own = [f for f in failures if not f["stopped"]] or failures  # the launcher's own stops are knock-ons
    cause = own[0]
    if cause["signal"] is None and knocked_on is not None and knocked_on(cause):
        cause = next((f for f in own[1:] if f["signal"] is not None), cause)
    return cause


def knocked_on_judge(ranks: list[dict | None]) -> Callable[[dict], bool]:
    """Whether a launcher failure (:func:`launcher_failures`) was a knock-on: by the rank's own
    record where it has one (its crash a collective's or rendezvous's error on a peer's end; a rank
    that recorded a signal is none), else by the report's traceback of it."""
    def judge(failure: dict) -> bool:
        r = failure["rank"]
        own = ranks[r] if 0 <= r < len(ranks) else None
        if own:
            return bool(own.get("crash")) and merge.knock_on(own["crash"])
        return merge.knock_on({"message": failure.get("traceback", "")})
    return judge
