"""``fatal.log``: where a fatal signal's Python stacks go while a run is open (``faulthandler``).

A segfault in a native kernel, SIGABRT, SIGBUS or SIGFPE kills the process before any
Python code can record it; ``faulthandler`` writes every thread's Python stack to the
file it was given first. :class:`FatalLog` gives it ``fatal.log`` in the run directory
(``optcheck.run.rundir.FATAL_LOG``) and gives stderr back at the end (when it was on
before), removing the file when nothing was written to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from optcheck.run.rundir import FATAL_LOG, open_record_file


class FatalLog:
    """``faulthandler`` pointed at ``<run directory>/fatal.log`` (see the module docstring)."""

    def __init__(self, run_dir: str | os.PathLike):
        import faulthandler

        self.path = Path(run_dir) / FATAL_LOG
        self._fd: int | None = None
        self._was_enabled = faulthandler.is_enabled()
        try:
            self._fd = open_record_file(self.path)
            faulthandler.enable(file=self._fd, all_threads=True)
        except (OSError, ValueError, RuntimeError):
            self._fd = None

    def release(self, *, remove_empty: bool = True) -> None:
        """``faulthandler`` back as it was; the file closed and, when empty and
        ``remove_empty``, removed (a forked child leaves it: the parent's). Idempotent."""
        import faulthandler

        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            faulthandler.disable()
            if self._was_enabled:
                faulthandler.enable()
            empty = os.fstat(fd).st_size == 0
            os.close(fd)
            if empty and remove_empty:
                os.unlink(self.path)
        except (OSError, ValueError, RuntimeError):
            pass
