"""Stopping a soak worker: signals to optcheck, escalation, and the step timeout. Torch-free.

:class:`Signals` installs optcheck's SIGINT/SIGTERM handlers *before* the worker
is spawned (a signal that arrives while the worker starts is not lost) and
escalates: the first signal asks the worker to stop (SIGTERM, then SIGCONT so a
stopped worker can act on it; the worker flushes the metrics it holds and
exits), the second — or :data:`GRACE_S` seconds without the worker exiting —
kills it (SIGKILL, which also ends a stopped process). The handlers never raise:
the supervisor keeps reading the worker's stream to its end and writes the
summary, so no process outlives optcheck and nothing written is lost.

:class:`Watchdog` is a thread that enforces the grace period and
``--step-timeout``: no message from the worker for that many seconds (after
its ``hello``) kills it.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time

#: Seconds a worker has to exit after SIGTERM before it is killed.
GRACE_S = 10.0


def _send(proc: subprocess.Popen | None, sig: int) -> None:
    if proc is not None and proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


class Signals:
    """SIGINT/SIGTERM handlers for the duration of a soak (a context manager).

    Attributes:
        count: signals received so far.
        name: the first one's name ("SIGINT", "SIGTERM"), or None.
        kill_at: ``time.monotonic()`` after which the worker is killed (set by
            the first signal: now + :data:`GRACE_S`).

    Only the main thread can install handlers; elsewhere (a soak run from a
    thread) this does nothing and signals keep their default action.

    Args:
        restore: put the previous handlers back on exit. The command line passes
            False: a late signal while it prints the summary and exits must not
            turn exit 130 into a death by SIGINT.
    """

    def __init__(self, restore: bool = True):
        self.restore = restore
        self.count = 0
        self.name: str | None = None
        self.kill_at: float | None = None
        self.proc: subprocess.Popen | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> "Signals":
        if threading.current_thread() is threading.main_thread() and not self._old:
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self.restore:
            for s, old in self._old.items():
                signal.signal(s, old)
            self._old = {}
        self.proc = None

    def _handler(self, signum, _frame) -> None:
        self.count += 1
        self.name = self.name or signal.Signals(signum).name
        self._escalate()

    def _escalate(self) -> None:
        if self.proc is None or not self.count:
            return
        if self.count == 1:
            self.kill_at = time.monotonic() + GRACE_S
            stop_worker(self.proc)
        else:
            _send(self.proc, signal.SIGKILL)

    def attach(self, proc: subprocess.Popen) -> None:
        """The worker now runs: a signal that came while it was spawned acts on it now."""
        self.proc = proc
        self._escalate()


def stop_worker(proc: subprocess.Popen) -> None:
    """Ask the worker to stop: SIGTERM (it flushes what it holds), then SIGCONT
    in case it is stopped (SIGSTOP/SIGTSTP) and would never see the SIGTERM."""
    _send(proc, signal.SIGTERM)
    _send(proc, signal.SIGCONT)


class Watchdog(threading.Thread):
    """Kills the worker when it overstays a stop request or stops making progress.

    Args:
        proc: the worker.
        signals: its :class:`Signals` (``kill_at``).
        step_timeout_s: seconds without a message from the worker (after
            :meth:`started`) before it is declared hung and killed; 0 = never.

    Attributes:
        hung_after: seconds of silence when the worker was killed as hung, else None.
    """

    def __init__(self, proc: subprocess.Popen, signals: Signals, step_timeout_s: float = 0.0, poll_s: float = 0.2):
        super().__init__(daemon=True, name="optcheck-watchdog")
        self.proc, self.signals, self.step_timeout_s, self.poll_s = proc, signals, step_timeout_s, poll_s
        self.hung_after: float | None = None
        self.kill_at: float | None = None  # the supervisor's own stop request (a write failed)
        self._last: float | None = None
        self._over = False
        self._done = threading.Event()

    def started(self) -> None:
        """The worker said hello: the step timeout counts from now."""
        self._last = time.monotonic()

    def progress(self) -> None:
        """A message arrived from the worker."""
        if self._last is not None:
            self._last = time.monotonic()

    def finished(self) -> None:
        """The worker sent its last message (done, stopped, crash): no step is due any
        more, so no step timeout either (the supervisor waits ``GRACE_S`` for its exit)."""
        self._last = None
        self._over = True

    @contextlib.contextmanager
    def paused(self):
        """The supervisor is busy with a message (writing it, checking a snapshot: the first
        rule check imports SciPy, seconds on a loaded machine): that time is not the
        worker's silence, so the step timeout counts again from its end."""
        last, self._last = self._last, None
        try:
            yield
        finally:
            if last is not None and not self._over:
                self._last = time.monotonic()

    def request_stop(self) -> None:
        """The supervisor stops the worker (e.g. the run directory stopped taking writes)."""
        self.kill_at = time.monotonic() + GRACE_S
        stop_worker(self.proc)

    def stop(self) -> None:
        self._done.set()

    def run(self) -> None:
        while not self._done.wait(self.poll_s) and self.proc.poll() is None:
            now = time.monotonic()
            deadlines = [t for t in (self.signals.kill_at, self.kill_at) if t is not None]
            if deadlines and now >= min(deadlines):
                _send(self.proc, signal.SIGKILL)
            elif self.step_timeout_s and (last := self._last) is not None and now - last >= self.step_timeout_s:
                self.hung_after = now - last
                _send(self.proc, signal.SIGKILL)
