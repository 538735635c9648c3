"""The soak worker as a process, seen from the supervisor (``optcheck/drivers/soak.py``). Torch-free.

Which module a backend's worker runs, its command line and environment, the
copy of its stderr into ``worker.log``, the name of the signal that ended it,
and the progress bar the supervisor shows while it runs.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
from pathlib import Path

from optcheck.config import SoakConfig

WORKER_MODULES = {"pytorch": "optcheck.pytorch.worker", "torchsharp": "optcheck.torchsharp_bridge.worker"}
STDERR_TAIL_LINES = 40


class Progress:
    """A tqdm bar on stderr: step, steps/s, loss, findings so far. Quiet when disabled."""

    def __init__(self, total: int, enabled: bool, label: str):
        self.bar = None
        self._args = (total, label) if enabled else None  # the bar is drawn at the first step, not before:
        self.step = 0                                      # a start-up error line comes alone

    def _open(self) -> None:
        from tqdm import tqdm

        total, label = self._args
        self._args = None
        tty = sys.stderr.isatty()
        self.bar = tqdm(total=total, unit="step", desc=label, file=sys.stderr, dynamic_ncols=True,
                        mininterval=0.5 if tty else 15.0, leave=True)

    def update(self, step: int, loss: float | None, findings: int) -> None:
        if self._args is not None and step > self.step:
            self._open()
        if self.bar is None or step <= self.step:
            return
        self.bar.update(step - self.step)
        self.step = step
        post = {"findings": findings}
        if isinstance(loss, (int, float)) and not isinstance(loss, bool):
            post["loss"] = f"{loss:.3f}"  # nan/inf print as such
        self.bar.set_postfix(post, refresh=False)

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        elif self._args is not None:  # enabled, before the first step
            print(line, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def drain_stderr(pipe, log, tail: collections.deque) -> None:
    """Copy the worker's stderr to worker.log and keep its tail; a log that stops
    taking writes (disk full) only stops the copy, never the drain."""
    for line in iter(pipe.readline, b""):
        if log is not None:
            try:
                log.write(line)
            except (OSError, ValueError):
                log = None
        tail.append(line.decode("utf-8", "replace").rstrip("\n"))
    pipe.close()


def signal_name(returncode: int) -> str | None:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    if returncode == 134:  # SIGABRT as seen through a shell or a .NET host
        return "SIGABRT"
    return None


def worker_command(cfg: SoakConfig, config_path: Path, fd: int) -> list[str]:
    """The worker's command line: ``cfg.run.python`` (``--python``, e.g. another venv's
    interpreter with another torch) or this interpreter, running the backend's worker module;
    ``fd`` is the worker's end of the stream socket (``optcheck/drivers/protocol.py``)."""
    return [cfg.run.python or sys.executable, "-m", WORKER_MODULES[cfg.run.backend], "--config", str(config_path),
            "--stream-fd", str(fd)]


def worker_env(cfg: SoakConfig) -> dict:
    """The worker's environment. With ``--python`` the folder holding this ``optcheck`` package
    goes first on PYTHONPATH, so the other interpreter runs this optcheck with its own torch."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if cfg.run.python:
        root = str(Path(__file__).resolve().parents[2])  # the folder holding optcheck/
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


