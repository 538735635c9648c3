"""Reading a run directory back: the one reader behind ``check``, ``compare``,
the run plot, ``history`` and ``upgrade``. Torch-free.

What a run directory holds, and who writes it, is in ``optcheck/run/rundir.py``
and ``docs/run-directory.md``. :class:`RunReader` reads each file once, on first
use. Validation policy (one for every record file): the summary and the first
``FULL_CHECK_LINES`` records of each file are checked against their published
schema (``optcheck/schemas/``), every later record by a cheap structural check
derived from the same schema (``optcheck.record.check.ShallowCheck``: required
fields, top-level types and enums), and fully again when that check fails, so
the error names the field. ``compare`` of a 20,000-step run reads in about a
second that way, against half a minute with every line schema-checked
(``benchmarks/bench_compare.py``).

The rule for a bad line (the same for every file and every command):

* a line that is **not JSON** (the torn last line of a run killed mid-write,
  a line torn by two writers, garbage bytes, nesting too deep for the parser)
  is **skipped and reported**: it goes to :attr:`RunReader.defects` as
  ``"metrics.jsonl:301: truncated last line (...)"``, the commands print it as
  one ``note:`` line, and the rest of the file is read;
* a line that **is JSON but of the wrong shape** (a field of the wrong type, a
  required field missing) is bad input: :class:`InputError` naming the file,
  the line and the field, exit 2 — the reader does not guess what it meant;
* a record of a **newer schema version** than this optcheck knows, a path that
  is **not a run directory**, and a run directory with **no record in it** are
  bad input too: one line, exit 2.

Non-finite numbers are written as the strings ``"nan"``, ``"inf"``, ``"-inf"``
(``optcheck.record.snapshot.dumps``; strict JSON has no NaN) and read back with
:func:`optcheck.record.snapshot.to_float`; ``null`` means "not recorded".
"""

from __future__ import annotations

import json
import math
import os
import re
from functools import cached_property
from pathlib import Path

from optcheck.errors import InputError
from optcheck.run.exitcodes import CRASHED
from optcheck.run.rundir import writer_gone
from optcheck.record.check import FULL_CHECK_LINES, check_old_summary, out_of_range, read_records, read_snapshots
from optcheck.record.snapshot import SCHEMA_DIR, SchemaError, StreamDefect, read_jsonl, to_float, validate_record

#: The status a reader gives a run whose summary says ``running`` and whose writer is gone.
UNCLOSED = "ended without closing"
#: The record files; a directory holding none of them is not a run directory.
RECORD_FILES = ("summary.json", "snapshots.jsonl", "metrics.jsonl", "findings.jsonl")
_VERSION = re.compile(r"^optcheck\.(\w+)/(\d+)$")


def known_version(kind: str) -> int:
    """The newest schema version of ``kind`` ("summary", "snapshot") this optcheck
    reads: the highest N of ``optcheck/schemas/<kind>-N.json``."""
    return max((int(p.stem.rsplit("-", 1)[1]) for p in SCHEMA_DIR.glob(f"{kind}-*.json")
                if p.stem.rsplit("-", 1)[1].isdecimal()), default=1)


def check_version(record, kind: str, where: str) -> None:
    """Refuse a record whose ``schema`` is a newer ``optcheck.<kind>/N`` than
    :func:`known_version` (a record without a ``schema`` is left to validation).

    Raises:
        InputError: ``"<where>: written by a newer optcheck (optcheck.summary/2); this one
            reads optcheck.summary/1 at most: upgrade optcheck to read it"``.
    """
    schema = record.get("schema") if isinstance(record, dict) else None
    m = _VERSION.match(schema) if isinstance(schema, str) else None
    if m and m.group(1) == kind and int(m.group(2)) > known_version(kind):
        raise InputError(f"{where}: written by a newer optcheck ({schema}); this one reads "
                         f"optcheck.{kind}/{known_version(kind)} at most: upgrade optcheck to read it")


class RunReader:
    """One run directory (``optcheck soak --out`` or ``optcheck.Monitor(out=)``), read back.

    Args:
        path: the run directory.
        allow_stream: also accept a ``snapshots.jsonl`` file alone (``optcheck
            check``); its directory is then read for nothing else.
        purpose: what the caller does with it ("plot", "compare"...), named by
            the error for an empty run directory ("nothing to plot: ...").

    Attributes:
        path: the run directory.
        defects: lines skipped because they were not JSON, as
            ``"<file>:<line>: <reason>"`` (filled as files are read).

    Raises:
        InputError: ``path`` does not exist ("no such run directory"), is a file
            or a directory holding none of :data:`RECORD_FILES` ("not a run
            directory"), or holds them all empty and no ``summary.json``
            ("nothing to <purpose>: an empty run directory").
    """

    def __init__(self, path: str | os.PathLike, *, allow_stream: bool = False, purpose: str = "read"):
        p = Path(path)
        self.stream_only = allow_stream and p.is_file()
        self.path = p.parent if self.stream_only else p
        self._snapshots_path = p if self.stream_only else p / "snapshots.jsonl"
        self.defects: list[str] = []
        self.unclosed: str | None = None  # set when the summary is read: "ended without closing: ..."
        if self.stream_only:
            return
        if not p.is_dir():
            raise InputError(f"{path}: not a run directory (a file; give its folder)" if p.exists()
                             else f"{path}: no such run directory")
        present = [n for n in RECORD_FILES if (p / n).is_file()]
        if not present:
            raise InputError(f"{path}: not a run directory (none of {', '.join(RECORD_FILES)} in it); give the "
                             f"--out directory of `optcheck soak` or of an optcheck.Monitor")
        if "summary.json" not in present and all((p / n).stat().st_size == 0 for n in present):
            raise InputError(f"{path}: nothing to {purpose}: an empty run directory ({', '.join(present)} "
                             f"hold no record; the run stopped before its first step?)")

    def has(self, name: str) -> bool:
        """Whether the run directory holds record file ``name``."""
        return not self.stream_only and (self.path / name).is_file()

    # -- the files -------------------------------------------------------------
    @cached_property
    def summary(self) -> dict:
        """``summary.json`` checked against ``optcheck/schemas/summary-1.json``; ``{}`` when absent.

        Raises:
            InputError: unreadable, not JSON, of a newer schema, or of the wrong shape (names the field).
        """
        if not self.has("summary.json"):
            return {}
        p = self.path / "summary.json"
        try:
            s = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:
            raise InputError(f"{p}: unreadable ({type(e).__name__}: {str(e)[:120]})") from None
        if not isinstance(s, dict):
            raise InputError(f"{p}: (the record): a summary is a JSON object, not a {type(s).__name__}")
        check_version(s, "summary", str(p))
        try:
            s = validate_record(s, "summary")
            if "summary_version" not in s:  # an older summary: every field it has must still have its type
                check_old_summary(s)
        except SchemaError as e:
            raise InputError(f"{p}: {e}") from None
        if (bad := out_of_range(s)) is not None:  # 10^400: no float holds it, and no optcheck wrote it
            raise InputError(f"{p}: {bad} (not written by optcheck: the file was edited or damaged)")
        if s.get("status") == "running":
            gone = writer_gone(self.path)
            if gone:
                s = self._unclosed(s, gone)
        return s

    def _unclosed(self, s: dict, gone: str) -> dict:
        """A ``running`` summary whose writer is gone: the run ended without closing
        (SIGKILL, a segfault in a native kernel, power). Read back with status
        :data:`UNCLOSED`, exit code 3, ``last_step`` the last step recorded anywhere
        and a ``crash`` saying so (the file itself is left as it is)."""
        last = max(s.get("last_step") or 0, _last_step(self.path / "metrics.jsonl"),
                   _last_step(self.path / "snapshots.jsonl"))
        fatal = self.path / "fatal.log"
        why = "a fatal signal, its Python stack in fatal.log" if fatal.is_file() and fatal.stat().st_size else \
            "killed (SIGKILL, out of memory), a fatal signal or a power loss"
        msg = (f"ended without closing: the summary still says running and its writer is gone ({gone}); "
               f"{why}; last step recorded {last}")
        self.unclosed = msg
        crash = s.get("crash") if isinstance(s.get("crash"), dict) else {}
        return {**s, "status": UNCLOSED, "exit_code": CRASHED, "last_step": last,
                "crash": {"step": last, "exc_type": UNCLOSED, **crash, "message": msg}}

    @cached_property
    def metrics(self) -> list[dict]:
        """``metrics.jsonl`` (``{"step", "loss", "step_time_s"}`` a line), checked against
        ``optcheck/schemas/metrics-1.json``; ``[]`` when absent. Raises InputError (wrong shape)."""
        return self._records("metrics.jsonl", "metrics")

    @cached_property
    def findings(self) -> list[dict]:
        """``findings.jsonl`` as finding dicts, checked against ``optcheck/schemas/finding-1.json``;
        ``[]`` when absent. Raises InputError (wrong shape)."""
        return self._records("findings.jsonl", "finding")

    @cached_property
    def snapshots(self) -> list[dict]:
        """``snapshots.jsonl``, every line checked against ``optcheck/schemas/snapshot-1.json``;
        ``[]`` when absent.

        Raises:
            InputError: a newer snapshot schema, or a record of the wrong shape
                (``"<file>:<line>: <field>: <what is wrong>"``).
        """
        p = self._snapshots_path
        if not p.is_file():
            return []
        defects: list[StreamDefect] = []
        try:
            first = next(iter(read_jsonl(p, defects=[])), None)
            check_version(first, "snapshot", str(p))
            snaps = read_snapshots(p, defects, full_lines=FULL_CHECK_LINES)
        except SchemaError as e:
            raise InputError(f"{e} (schema: optcheck/schemas/snapshot-1.json)") from None
        except OSError as e:
            raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
        self._note(p.name, defects)
        return snaps

    def _records(self, name: str, kind: str) -> list[dict]:
        if not self.has(name):
            return []
        p = self.path / name
        defects: list[StreamDefect] = []
        try:
            out = read_records(p, kind, defects, full_lines=FULL_CHECK_LINES)
        except SchemaError as e:
            raise InputError(str(e)) from None
        except OSError as e:
            raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
        self._note(name, defects)
        return out

    def _note(self, name: str, defects: list[StreamDefect]) -> None:
        self.defects += [f"{name}:{d.line}: {d.reason}" for d in defects]

    # -- what the commands derive ----------------------------------------------
    @cached_property
    def losses(self) -> dict[int, float]:
        """``{step: training loss}`` of ``metrics.jsonl`` (the last record of a step wins;
        NaN/inf kept, a step without a loss — or with a string that is no number — left out)."""
        out: dict[int, float] = {}
        for rec in self.metrics:
            loss = rec.get("loss")
            if type(loss) is float:  # nearly every line: no call
                out[rec["step"]] = loss
            elif loss is not None and (v := _number(loss)) is not None:
                out[rec["step"]] = v
        return out

    @cached_property
    def step_times(self) -> list[float]:
        """The finite, positive ``step_time_s`` values of ``metrics.jsonl``, in seconds."""
        out = []
        for r in self.metrics:
            t = r.get("step_time_s")
            if type(t) is not float:
                t = _number(t)
            if t is not None and 0 < t < math.inf:
                out.append(t)
        return out

    def peak_rss_bytes(self) -> float | None:
        """The summary's ``peak_rss_bytes``, else the largest finite ``memory.rss_bytes`` of the snapshots."""
        peak = self.summary.get("peak_rss_bytes")
        if isinstance(peak, (int, float)) and not isinstance(peak, bool):
            return float(peak)
        values = [to_float((s.get("memory") or {}).get("rss_bytes")) for s in self.snapshots]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        return max(finite) if finite else None

    def versions(self) -> dict[str, str]:
        """Library versions: the summary's, else the first snapshot's (``{}`` when neither has them)."""
        v = self.summary.get("versions") or next((s["versions"] for s in self.snapshots
                                                  if isinstance(s.get("versions"), dict)), {})
        return {str(k): str(x) for k, x in v.items()}

    def notes(self) -> list[str]:
        """One line per skipped line: ``"<dir>/<file>:<line>: <reason>; skipped, the rest was read"``,
        and one for a run that ended without closing (once its summary was read)."""
        out = [f"{self.path / d}; skipped, the rest was read" for d in self.defects]
        if self.unclosed:
            out.append(f"{self.path}: {self.unclosed}")
        return out


def _number(value) -> float | None:
    """A record's number as a float (``"nan"``/``"inf"`` strings decoded); None for
    None, a bool, or a string that is no number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return to_float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _last_step(path: Path) -> int:
    """The ``step`` of the last whole record of a JSON Lines file (its last 64 KiB read); 0 if none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError, RecursionError):
            continue
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return 0


def run_dirs(paths, skipped: list[str] | None = None) -> list[Path]:
    """Run directories named by ``paths``: each is a run directory (has a
    ``summary.json``) or a folder whose immediate subfolders holding one are
    taken, in name order. Duplicates are dropped, order kept. A subfolder that
    cannot be read (another user's, mode 700) is left out and named in ``skipped``
    (``"<path>: cannot read (Permission denied)"``).

    Raises:
        InputError: a path that does not exist or cannot be read, or a folder with no run in it.
    """
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        try:
            if (p / "summary.json").is_file():
                runs = [p]
            elif p.is_dir():
                runs = []
                for c in sorted(p.iterdir()):
                    try:
                        if (c / "summary.json").is_file():
                            runs.append(c)
                    except OSError as e:
                        if skipped is not None:
                            skipped.append(f"{c}: cannot read ({e.strerror or e}); left out")
                if not runs:
                    raise InputError(f"{raw}: no run directory in it (no summary.json in it or its subfolders)")
            else:
                raise InputError(f"{raw}: no such run directory")
        except OSError as e:
            raise InputError(f"{raw}: cannot read ({e.strerror or e})") from None
        found += [r for r in runs if r not in found]
    return found


def rank_dirs(path: str | Path) -> list[tuple[int, Path]]:
    """The ``rank-K`` folders of a run folded from several streams (``optcheck soak --nproc``,
    a distributed Monitor, ``optcheck run`` of a GAN or torchrun) that hold a ``snapshots.jsonl``,
    as ``(K, folder)`` sorted by K; [] for a one-process run, a stream file or a folder without
    them. ``check``, ``compare`` and ``--baseline`` read a folded run stream by stream through it."""
    p = Path(path)
    if not p.is_dir() or (p / "snapshots.jsonl").exists():
        return []
    found = []
    for d in p.glob("rank-*"):
        k = d.name[len("rank-"):]
        if k.isascii() and k.isdecimal() and (d / "snapshots.jsonl").is_file():
            found.append((int(k), d))
    return sorted(found)


def read_summary(path: str | os.PathLike) -> dict:
    """The checked ``summary.json`` of run directory ``path`` (:attr:`RunReader.summary`).

    Raises:
        InputError: not a run directory, no ``summary.json``, or as :attr:`RunReader.summary`.
    """
    r = RunReader(path)
    if not r.has("summary.json"):
        raise InputError(f"{path}: not a run directory (no summary.json)")
    return r.summary
