"""Checks of output paths given on the command line, made before a run starts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from optcheck.errors import InputError


def check_output_file(path: str, option: str, created_dir: str | os.PathLike | None = None) -> None:
    """Check that ``path`` can be written later, without writing it now.

    Its folder must exist and take a new file (tried with a temporary file),
    unless it is ``created_dir`` — the run directory the command itself
    creates. Folders are never created for it.

    A ``--plot`` file also needs matplotlib (an optional extra): its absence is
    said now, before a run, not after it.

    A path that resolves (symlinks followed) to a record file of a run directory —
    its ``summary.json``, ``snapshots.jsonl``, ``findings.jsonl``, ``metrics.jsonl``,
    ``events.jsonl``, lock, ``config.json``, ``worker.log`` — or of ``created_dir`` is
    refused: the report would overwrite the run it reports on.

    Raises:
        InputError: ``"<option> <path>: ..."`` naming what is wrong.
    """
    target = run_record_file(path, created_dir)
    if target is not None:
        raise InputError(f"{option} {path}: is {target}, a record file of a run directory; optcheck never "
                         f"writes a report over a run's records (choose another file name)")
    if option == "--plot":
        from optcheck.report.plot import require_matplotlib

        require_matplotlib(option)
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{option} {path}: is a directory; give a file name")
    parent = p.parent
    if created_dir is not None and parent.absolute() == Path(created_dir).absolute() and not parent.exists():
        return
    if not parent.is_dir():
        raise InputError(f"{option} {path}: the folder {parent} does not exist (optcheck does not create it; "
                         f"make it first or choose another path)")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise InputError(f"{option} {path}: cannot write in {parent} ({e.strerror or e})") from None


def run_record_file(path: str | os.PathLike, created_dir: str | os.PathLike | None = None) -> Path | None:
    """The record file ``path`` resolves to when it is one of a run directory's
    files (see :func:`check_output_file`) in a folder that holds a run (any record
    file or the lock) or in ``created_dir``; else None."""
    from optcheck.run.rundir import FATAL_LOG, LOCK_NAME, RECORD_FILES, RESERVE_NAME, SUMMARY_TEMP

    names = (*RECORD_FILES, LOCK_NAME, RESERVE_NAME, FATAL_LOG, "worker.log", "config.json")
    try:
        real = Path(path).resolve()
    except (OSError, RuntimeError):
        return None
    if real.name not in names and not SUMMARY_TEMP.fullmatch(real.name):
        return None
    parent = real.parent
    if created_dir is not None:
        try:
            if parent == Path(created_dir).resolve():
                return real
        except (OSError, RuntimeError):
            pass
    if any(os.path.lexists(parent / n) for n in (*RECORD_FILES, LOCK_NAME)):
        return real
    return None


def same_dir(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two directory paths name the same folder (symlinks followed; neither need exist)."""
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):
        return False
