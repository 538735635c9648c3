"""optcheck.drivers.watch on real child processes: escalation of repeated signals, the
grace period, the step timeout, and silence on a healthy child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from optcheck.drivers.watch import Signals, Watchdog

IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def child(code: str = IGNORES_SIGTERM) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_first_signal_asks_second_kills():
    before = signal.getsignal(signal.SIGINT)  # (a Monitor another test left open in this worker may hold it)
    proc = child()
    with Signals() as sig:
        sig.attach(proc)
        os.kill(os.getpid(), signal.SIGINT)  # handled: no KeyboardInterrupt
        time.sleep(0.5)
        assert proc.poll() is None and sig.count == 1 and sig.name == "SIGINT"  # it ignores SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGKILL and sig.count == 2
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_signal_before_the_worker_exists_acts_when_it_is_attached():
    with Signals() as sig:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        proc = child("import time; print('ready', flush=True); time.sleep(60)")
        sig.attach(proc)
        assert proc.wait(timeout=10) == -signal.SIGTERM


def test_grace_period_kills_a_worker_that_ignores_sigterm():
    proc = child()
    sig = Signals()
    sig.count, sig.kill_at = 1, time.monotonic() + 0.5
    dog = Watchdog(proc, sig, poll_s=0.05)
    dog.start()
    assert proc.wait(timeout=10) == -signal.SIGKILL and dog.hung_after is None
    dog.stop()


def test_step_timeout_fires_on_silence_only_after_hello():
    proc = child()
    dog = Watchdog(proc, Signals(), step_timeout_s=0.5, poll_s=0.05)
    dog.start()
    time.sleep(1.0)
    assert proc.poll() is None  # no hello yet: start-up is not timed
    dog.started()
    for _ in range(10):  # progress keeps it alive
        time.sleep(0.1)
        dog.progress()
    assert proc.poll() is None and dog.hung_after is None
    assert proc.wait(timeout=10) == -signal.SIGKILL and dog.hung_after >= 0.5
    dog.stop()


def test_step_timeout_does_not_count_the_supervisors_own_work_nor_the_exit_after_done():
    """A slow rule check in the supervisor (the first one imports SciPy: seconds on a loaded
    machine) is not the worker's silence; after its last message the worker is not timed."""
    proc = child()
    dog = Watchdog(proc, Signals(), step_timeout_s=0.5, poll_s=0.05)
    dog.start()
    dog.started()
    with dog.paused():
        time.sleep(1.2)  # the supervisor busy with one message
    time.sleep(0.2)
    assert proc.poll() is None and dog.hung_after is None  # counted again from the end of the pause
    dog.finished()  # "done": only its exit is left
    time.sleep(1.2)
    assert proc.poll() is None and dog.hung_after is None
    dog.stop()
    proc.kill()
    proc.wait()
