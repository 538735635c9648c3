"""The run directory: every file a soak or a Monitor writes, flushed as it comes.

Layout of ``--out DIR``::

    snapshots.jsonl   one schema-1 snapshot a line (``optcheck.snapshot``)
    findings.jsonl    one finding a line (``optcheck.findings.Finding``)
    metrics.jsonl     {"step", "loss", "step_time_s"} a line, every step
    events.jsonl      lifecycle events, injections, worker crash records
    summary.json      ``optcheck.summary/1``: written with status "running" at
                      the start and replaced atomically at the end
    worker.log        the worker's stderr

Every line is flushed when written, so a run killed at any moment leaves every
complete line readable (a torn last line is skipped by the readers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

from optcheck.errors import InputError
from optcheck.snapshot import clean_json, dumps, read_jsonl

SUMMARY_SCHEMA = "optcheck.summary/1"
FILES = ("snapshots.jsonl", "findings.jsonl", "metrics.jsonl", "events.jsonl")


class RunDir:
    """Opens ``path`` for a new run (created if missing; existing run files are
    replaced, or appended to with ``append=True``, as a resumed job does).

    Raises:
        InputError: the directory cannot be created or written.
    """

    def __init__(self, path: str | os.PathLike, append: bool = False):
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".optcheck-write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise InputError(f"--out {path}: cannot write there ({e.strerror or e})") from None
        self._files: dict[str, IO[str]] = {
            name: open(self.path / name, "a" if append else "w", encoding="utf-8", buffering=1) for name in FILES}
        self.worker_log = open(self.path / "worker.log", "ab" if append else "wb", buffering=0)

    def _write(self, name: str, obj: dict) -> None:
        f = self._files[name]
        f.write(dumps(obj) + "\n")
        f.flush()

    def snapshot(self, snap: dict) -> None:
        self._write("snapshots.jsonl", snap)

    def finding(self, finding: dict) -> None:
        self._write("findings.jsonl", finding)

    def metric(self, step: int, loss: float | None, step_time_s: float | None) -> None:
        self._write("metrics.jsonl", {"step": step, "loss": loss, "step_time_s": step_time_s})

    def event(self, event: dict) -> None:
        self._write("events.jsonl", event)

    def summary(self, summary: dict) -> None:
        """Replace ``summary.json`` atomically (write a temporary file, then rename)."""
        write_summary(self.path, summary)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self.worker_log.close()


def write_summary(path: str | os.PathLike, summary: dict) -> None:
    """Atomically write ``summary.json`` in run directory ``path``."""
    summary = {"schema": SUMMARY_SCHEMA, **summary}
    target = Path(path) / "summary.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(clean_json(summary), indent=2, default=str, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def read_summary(path: str | os.PathLike) -> dict:
    """The ``summary.json`` of a run directory. Raises InputError if absent or unreadable."""
    p = Path(path) / "summary.json"
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: not a run directory (no summary.json)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{p}: unreadable ({e})") from None


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """``metrics.jsonl`` of a run directory (empty list if there is none)."""
    p = Path(path) / "metrics.jsonl"
    return list(read_jsonl(p)) if p.exists() else []


def read_findings(path: str | os.PathLike) -> list[dict]:
    """``findings.jsonl`` of a run directory (empty list if there is none)."""
    p = Path(path) / "findings.jsonl"
    return list(read_jsonl(p)) if p.exists() else []
