"""How an ``optcheck.Monitor``'s run ends when the loop does not reach ``close()``:
a signal, the death of the thread running the loop, an ``os.fork()`` child.
Torch-free; the Monitor (``optcheck/drivers/monitor.py``) registers itself in :data:`_OPEN`
while it is open and is driven through the public interface :class:`RunEnd`.

- :class:`SignalChain`: SIGINT/SIGTERM handlers in front of the user's (the run is
  marked interrupted, then the previous handler runs; SIGTERM's default action
  still kills the process, after the run is closed).
- :func:`install_thread_hook`: ``threading.excepthook`` in front of the user's (a
  thread that ran the loop dying of an exception is the run's crash).
- at fork (``os.register_at_fork``): the child closes its copies of the run's files
  and never writes to the parent's run.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from typing import Protocol

log = logging.getLogger("optcheck")
class RunEnd(Protocol):
    """What this module calls on an open run (:class:`optcheck.Monitor` implements it)."""

    closed: bool

    def record_signal(self, name: str) -> None:
        """SIGINT/SIGTERM (``name``) reached the process, before the user's handler runs."""

    def record_crash(self, exc: BaseException) -> None:
        """``exc`` ended the loop (here: the thread running it died of it)."""

    def ran_in(self, thread_ident: int) -> bool:
        """Whether the thread ``thread_ident`` ran this run's loop (created it, or stepped its optimizer)."""

    def write_running(self) -> None:
        """Put the run's ``running`` summary on disk now (a handler may end the process)."""

    def detach_fork(self) -> None:
        """In an ``os.fork()`` child: stop writing to the parent's run."""

    def close(self) -> dict:
        """End the run; idempotent."""


#: The open monitors (weakly held: a monitor dropped without close() is not kept alive).
_OPEN: "weakref.WeakSet" = weakref.WeakSet()


def opened(mon: RunEnd) -> None:
    """Register an open monitor (its thread hook and fork hook apply to it)."""
    _OPEN.add(mon)
    install_thread_hook()


def closed(mon: RunEnd) -> None:
    _OPEN.discard(mon)


class SignalChain:
    """SIGINT/SIGTERM handlers in front of the user's while a Monitor is open: the
    run is marked interrupted, then the previous handler runs (Python's own SIGINT
    handler raises KeyboardInterrupt; a handler of the user's runs as before). With
    the default action (SIGTERM's is to die) the run is closed first, then the
    default action is taken: the process still dies by the signal, its summary says
    ``interrupted``. An ignored signal stays ignored and marks nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, mon: RunEnd):
        self._mon = weakref.ref(mon)
        self._prev: dict[int, object] = {}
        for s in self.SIGNALS:
            try:
                prev = signal.getsignal(s)
                if prev == signal.SIG_IGN or prev is None:  # ignored, or set outside Python: leave it
                    continue
                signal.signal(s, self._handler)
                self._prev[s] = prev
            except (ValueError, OSError):
                pass

    def _handler(self, signum, frame) -> None:
        prev = self._prev.get(signum, signal.SIG_DFL)
        mon = self._mon()
        if mon is not None and not mon.closed:
            mon.record_signal(signal.Signals(signum).name)
            if prev == signal.SIG_DFL:  # the process dies now: close the run first
                try:
                    mon.close()
                except Exception:  # noqa: BLE001 - the signal's own effect comes first
                    log.exception("optcheck: could not close the run on %s", signal.Signals(signum).name)
            else:
                mon.write_running()  # on disk now: the user's handler may end the process
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_DFL:
            self.restore()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def restore(self) -> None:
        """Put the previous handlers back (those still ours: a handler set after ours stays)."""
        for s, prev in list(self._prev.items()):
            try:
                if signal.getsignal(s) == self._handler:
                    signal.signal(s, prev)
            except (ValueError, OSError):
                pass
        self._prev = {}


def _thread_died(args) -> None:
    """``threading.excepthook``: a thread that ran a monitor's loop died of an exception:
    that run crashed (recorded and closed), then the previous hook reports it."""
    for mon in list(_OPEN):
        if args.thread is not None and mon.ran_in(args.thread.ident):
            try:
                if args.exc_value is not None:
                    mon.record_crash(args.exc_value)
                mon.close()
            except Exception:  # noqa: BLE001 - never hide the thread's traceback behind ours
                log.exception("optcheck: could not record the thread's crash")
    _PREV_THREAD_HOOK[0](args)


def install_thread_hook() -> None:
    """Put :func:`_thread_died` in front of the current ``threading.excepthook`` (once
    per replacement: a hook set after ours is wrapped again at the next Monitor)."""
    if threading.excepthook is not _thread_died:
        _PREV_THREAD_HOOK[0] = threading.excepthook
        threading.excepthook = _thread_died


def _forked_child() -> None:
    for mon in list(_OPEN):
        try:
            mon.detach_fork()
        except Exception:  # noqa: BLE001 - the child runs on regardless
            pass


_PREV_THREAD_HOOK = [threading.__excepthook__]
os.register_at_fork(after_in_child=_forked_child)


