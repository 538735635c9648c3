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

    Raises:
        InputError: ``"<option> <path>: ..."`` naming what is wrong.
    """
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
