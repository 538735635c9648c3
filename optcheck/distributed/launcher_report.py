"""What ``torch.distributed.run`` says about the ranks that failed: its error report
("Failures:" and "Root Cause (first observed failure)", ``torch/distributed/elastic/
multiprocessing/errors/__init__.py``), as ``optcheck soak --nproc`` writes it to
``OUT/launcher.log``, and which of those failures is the run's cause. Torch-free."""

from __future__ import annotations

import re
import signal
from typing import Callable

from optcheck.distributed import merge


def launcher_failures(log: str) -> list[dict]:
    """Every failed rank of ``torch.distributed.run``'s error report
    (``torch/distributed/elastic/multiprocessing/errors``), the "Root Cause" one first: each
    ``{"rank", "exitcode", "signal", "traceback"}`` (``signal`` a name, or None for an exit code
    >= 0; ``traceback`` the report's text for it: the rank's error file's message, or the signal)."""
    head, sep, root = log.rpartition("Root Cause")
    if not sep:
        return []

    def parse(text: str) -> list[dict]:
        found = []
        for chunk in re.split(r"^\[\d+\]:\s*$", text, flags=re.M)[1:]:
            rank = re.search(r"^\s*rank\s*:\s*(\d+)", chunk, re.M)
            code = re.search(r"^\s*exitcode\s*:\s*(-?\d+)", chunk, re.M)
            if not (rank and code):
                continue
            exitcode = int(code.group(1))
            sig = signal.Signals(-exitcode).name if exitcode < 0 and -exitcode in signal.valid_signals() else None
            found.append({"rank": int(rank.group(1)), "exitcode": exitcode, "signal": sig,
                          "traceback": re.split(r"^[=-]{5,}\s*$", chunk.partition("traceback :")[2],
                                                       flags=re.M)[0].strip()})
        return found

    return parse(root)[:1] + parse(head.rpartition("Failures:")[2])


def root_cause(log: str, knocked_on: Callable[[dict], bool] | None = None) -> dict | None:
    """The failed rank of ``torch.distributed.run``'s "Root Cause" report
    (:func:`launcher_failures`): ``{"rank", "exitcode", "signal", "traceback"}`` or None.

    The launcher's "first observed failure" is the earliest by a timestamp in whole seconds
    (``ChildFailedError.get_first_failure``): a rank killed by a signal (no error file: stamped
    when the launcher saw it) and the peer whose rendezvous or collective failed on it (stamped by
    its error file) often tie, and the tie goes to the lower rank. So where the root cause is no
    signal and ``knocked_on(failure)`` says its end was the knock-on of a peer's, a failure by a
    signal listed beside it is the cause."""
    failures = launcher_failures(log)
    if not failures:
        return None
    cause = failures[0]
    if cause["signal"] is None and knocked_on is not None and knocked_on(cause):
        cause = next((f for f in failures[1:] if f["signal"] is not None), cause)
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
