"""Processes of ``optcheck soak --nproc N`` never outlive optcheck. Torch-free, Linux facts.

The chain is optcheck (the supervisor) → ``torch.distributed.run`` (the launcher,
started through ``python -m optcheck.distributed.launch``) → the ranks
(``optcheck.distributed.worker``). ``torch.distributed.run`` starts each rank in a
session of its own (``start_new_session=True`` in
``torch/distributed/elastic/multiprocessing/subprocess_handler``), so a signal to the
launcher's process group never reaches them, and a launcher that dies (SIGKILL, the
OOM killer) leaves them training. Each link therefore asks the kernel for a signal
when its parent dies (``prctl(PR_SET_PDEATHSIG)``, prctl(2); it is sent when the
*thread* that forked the child exits, here the parents' main threads): the launcher
and the ranks get SIGKILL. A parent that died before the ``prctl`` is caught by
comparing ``getppid()`` before and after.

:func:`proc_state` and :func:`is_rank` read ``/proc/PID/stat`` and
``/proc/PID/cmdline`` (proc(5)): a rank stopped by SIGSTOP is in state ``T``.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies; exit at
    once (status 1) if the parent is already gone. Returns False where this cannot be
    set (not Linux, no libc ``prctl``): then nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent == 1 or os.getppid() != parent:  # orphaned before the prctl took effect
        os._exit(1)
    return True


def proc_state(pid: int) -> str | None:
    """The state letter of ``pid`` (``R`` running, ``S`` sleeping, ``T`` stopped,
    ``t`` traced, ``Z`` zombie...) from ``/proc/PID/stat``; None when it is gone or
    there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:][:1].decode("ascii", "replace") or None


def is_rank(pid: int) -> bool:
    """Whether ``pid`` is alive (not a zombie) and runs ``optcheck.distributed.worker``
    (a recycled PID is not signalled)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"optcheck.distributed.worker" in cmd and proc_state(pid) not in (None, "Z", "X")


def send(pid: int, sig: int) -> None:
    """``os.kill`` that ignores a process already gone."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
