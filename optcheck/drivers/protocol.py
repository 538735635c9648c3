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
snapshot   snapshot: a schema-1 snapshot (``optcheck.record.snapshot``); cost_s: seconds
           its body took; verdict: true when the worker waits for a verdict
lifecycle  step, kind ("eval", "checkpoint", "resume", "inject"), detail
crash      step, exc_type, message, stack, where: an exception ended the run
stopped    step, reason: the worker stopped early on purpose
done       step, val_loss_first, val_loss_last, val_step_first,
           val_step_last, step_cost (``optcheck.run.sequencer.StepCost``), train_cpu_s,
           train_cpu_block_s (``optcheck.run.sequencer.CpuBlocks``: CPU seconds per step, a block each)
=========  ====================================================================

The other way there is one message, the **verdict**: after a snapshot sent
with ``verdict: true`` (``--stop-on-finding``, a pre-step check snapshot) the
worker blocks until the supervisor, whose rule engine is the run's only one,
answers one line ``{"stop": REASON}`` (REASON null: go on). The worker then
stops before the step, or runs it.

Non-finite numbers travel as the strings ``"nan"``, ``"inf"``, ``"-inf"``
(``optcheck.record.snapshot.dumps``: strict JSON has none). :func:`read_messages`
decodes them back to floats once, in the numeric fields of :data:`NUMERIC`, so
nothing that handles a message sees a string where it expects a number (a
snapshot's body keeps the recorded form: the rules read it with
``optcheck.record.snapshot.to_float``). A numeric field holding anything else
(a list where a number goes, a bool) is dropped to None: the message is kept.

Torch-free: the TorchSharp worker imports it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from typing import IO, Iterator

from optcheck.record.snapshot import dumps

TYPES = ("hello", "metrics", "snapshot", "lifecycle", "crash", "stopped", "done")
#: The numeric fields of each message type: scalars, and ``[...]`` lists of numbers.
NUMERIC: dict[str, tuple[str, ...]] = {
    "metrics": ("[losses]", "[step_times_s]"),
    "snapshot": ("cost_s",),
    "done": ("val_loss_first", "val_loss_last", "train_cpu_s", "[train_cpu_block_s]"),
}
#: Integer fields (steps, counts): anything but a whole number >= 0 becomes None (in a list: the entry is dropped).
INTEGER: dict[str, tuple[str, ...]] = {
    "metrics": ("[steps]",),
    "lifecycle": ("step",),
    "crash": ("step",),
    "stopped": ("step",),
    "done": ("step", "val_step_first", "val_step_last"),
    "hello": ("threads",),
}
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "+inf": math.inf,
              "infinity": math.inf, "-infinity": -math.inf}


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

    def held(self):
        """A context in which a SIGTERM waits (the worker loop's guarded stream holds it; a plain
        stream holds nothing)."""
        return contextlib.nullcontext()

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
            yield decode(msg)
        else:
            yield {"type": "garbled", "line": line[:200]}


def number(value) -> float | None:
    """A message's number as a float: ``"nan"``/``"inf"``/``"-inf"`` decoded, an int or
    float kept, anything else (None, a bool, another string, a list) None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        return _NONFINITE.get(value.strip().lower())
    return None


def _integer(value) -> int | None:
    """A step or a count: a whole number >= 0, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


def decode(msg: dict) -> dict:
    """Decode one message's numeric fields in place (see the module docstring) and return it.

    ``metrics``: ``steps``, ``losses`` and ``step_times_s`` become lists of equal
    length (the shortest; an entry whose step is not a whole number is dropped).
    """
    kind = msg.get("type")
    for fields, conv in ((NUMERIC.get(kind, ()), number), (INTEGER.get(kind, ()), _integer)):
        for f in fields:
            if f.startswith("["):
                name = f[1:-1]
                v = msg.get(name)
                msg[name] = [conv(x) for x in v] if isinstance(v, list) else []
            elif f in msg:
                msg[f] = conv(msg[f])
    if kind == "metrics":
        steps, losses, times = msg["steps"], msg["losses"], msg["step_times_s"]
        if len(times) < len(steps):
            times = times + [None] * (len(steps) - len(times))
        keep = [i for i, s in enumerate(steps[:len(losses)]) if s is not None]
        msg["steps"] = [steps[i] for i in keep]
        msg["losses"] = [losses[i] for i in keep]
        msg["step_times_s"] = [times[i] for i in keep]
    elif kind == "snapshot" and not isinstance(msg.get("snapshot"), dict):
        return {"type": "garbled", "line": "snapshot message without a snapshot object"}
    for f in ("detail", "hazards", "step_cost", "versions", "corpus"):
        if f in msg and msg[f] is not None and not isinstance(msg[f], dict):
            msg[f] = None
    return msg


def seconds(value) -> float | None:
    """A duration a worker reported, when it is one: a finite number >= 0 (else None)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def step_cost(value) -> dict | None:
    """The worker's ``step_cost`` (``optcheck.run.sequencer.StepCost.to_dict``) when it has that
    shape (count, total_s, mean_us: numbers >= 0, mean_us may be None), else None."""
    if not isinstance(value, dict):
        return None
    count, total, mean = value.get("count"), value.get("total_s"), value.get("mean_us")
    if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0) or seconds(total) is None \
            or (mean is not None and seconds(mean) is None):
        return None
    return value
