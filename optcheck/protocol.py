"""The worker ↔ supervisor stream: JSON Lines on a dedicated socket.

A worker writes one JSON object per line to the file descriptor given as
``--stream-fd`` (never stdout: the training code, libtorch and .NET may print
there), one end of a ``socket.socketpair()`` the supervisor made. Every message
has a ``type``:

=========  ====================================================================
type       payload
=========  ====================================================================
hello      backend, versions, threads, pid, corpus: what is about to run
metrics    steps: [int], losses: [float], step_times_s: [float] (batched)
snapshot   snapshot: a schema-1 snapshot (``optcheck.snapshot``); cost_s: seconds
           its body took; verdict: true when the worker waits for a verdict
lifecycle  step, kind ("eval", "checkpoint", "resume", "inject"), detail
crash      step, exc_type, message, stack, where: an exception ended the run
stopped    step, reason: the worker stopped early on purpose
done       step, loss_first, loss_last, val_loss_first, val_loss_last, val_step_first,
           val_step_last, step_cost (``optcheck.session.StepCost``), train_cpu_s
=========  ====================================================================

The other way there is one message, the **verdict**: after a snapshot sent
with ``verdict: true`` (``--stop-on-finding``, a pre-step check snapshot) the
worker blocks until the supervisor, whose rule engine is the run's only one,
answers one line ``{"stop": REASON}`` (REASON null: go on). The worker then
stops before the step, or runs it.

Torch-free: the TorchSharp worker imports it.
"""

from __future__ import annotations

import json
import os
from typing import IO, Iterator

from optcheck.snapshot import dumps

TYPES = ("hello", "metrics", "snapshot", "lifecycle", "crash", "stopped", "done")


class Stream:
    """Writes protocol messages to a file descriptor, one flushed line each.

    Args:
        fd: an open, writable file descriptor (the pipe to the supervisor), or
            None to drop every message (a worker run by hand).
    """

    def __init__(self, fd: int | None):
        self._f: IO[str] | None = os.fdopen(fd, "w", encoding="utf-8", buffering=1) if fd is not None else None
        self._r: IO[str] | None = None

    def send(self, type: str, **payload) -> None:
        """Send one message. Raises ValueError for an unknown ``type``."""
        if type not in TYPES:
            raise ValueError(f"unknown message type {type!r}")
        if self._f is None:
            return
        payload["type"] = type
        self._f.write(dumps(payload) + "\n")
        self._f.flush()

    def verdict(self) -> dict:
        """Block until the supervisor's verdict line arrives; ``{}`` when there is no
        supervisor (no fd), or it cannot answer (a one-way pipe, EOF)."""
        if self._f is None:
            return {}
        try:
            if self._r is None:
                self._r = os.fdopen(os.dup(self._f.fileno()), "r", encoding="utf-8")
            line = self._r.readline()
        except OSError:
            return {}
        try:
            msg = json.loads(line) if line.strip() else {}
        except json.JSONDecodeError:
            return {}
        return msg if isinstance(msg, dict) else {}

    def close(self) -> None:
        if self._r is not None:
            try:
                self._r.close()
            except OSError:
                pass
            self._r = None
        if self._f is not None:
            try:
                self._f.close()
            except OSError:
                pass
            self._f = None


def send_verdict(sock, stop: str | None) -> None:
    """The supervisor's answer to a snapshot sent with ``verdict: true``: ``stop`` is the
    reason to stop (a finding), None to go on. A worker already gone is not an error."""
    try:
        sock.sendall((json.dumps({"stop": stop}) + "\n").encode("utf-8"))
    except OSError:
        pass


def read_messages(f: IO[str]) -> Iterator[dict]:
    """Yield messages from the supervisor's end of the pipe until EOF.

    A line that is not a JSON object (a worker killed mid-write) is yielded as
    ``{"type": "garbled", "line": ...}``.
    """
    for line in f:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            yield {"type": "garbled", "line": line[:200]}
            continue
        if isinstance(msg, dict) and msg.get("type") in TYPES:
            yield msg
        else:
            yield {"type": "garbled", "line": line[:200]}
