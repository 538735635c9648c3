"""The run directory's writer lock leaves no ``.optcheck.lock`` behind, and removing it
opens no window for two writers (``optcheck/report/rundir.py``, ``docs/reliability.md``).
Real files and real ``flock``; the race is staged by running the first writer's close
between the second writer's ``open`` and its ``flock``."""

from __future__ import annotations

import os

import pytest

from optcheck.errors import InputError
from optcheck.report import rundir
from optcheck.report.rundir import LOCK_NAME, RunDir


def test_a_closed_run_directory_keeps_no_lock_file(tmp_path):
    d = RunDir(tmp_path / "run")
    assert (tmp_path / "run" / LOCK_NAME).exists()
    with pytest.raises(InputError, match="in use by PID"):
        RunDir(tmp_path / "run", append=True)
    d.close()
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    RunDir(tmp_path / "run", append=True).close()  # the next writer takes it as before


def test_a_writer_that_locked_the_removed_file_takes_the_new_one(tmp_path, monkeypatch):
    path = tmp_path / "run"
    first = RunDir(path)
    real_open = rundir._open_regular
    staged = []

    def open_then_first_closes(p, flags, *args, **kwargs):
        fd = real_open(p, flags, *args, **kwargs)
        if p.name == LOCK_NAME and not staged:
            staged.append(True)
            first.close()  # unlinks the file this fd refers to, then drops its lock
        return fd

    monkeypatch.setattr(rundir, "_open_regular", open_then_first_closes)
    fd = rundir.lock_run_dir(path)
    try:
        assert staged
        st, now = os.fstat(fd), os.stat(path / LOCK_NAME)
        assert (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)  # it holds the file the name points to
        with pytest.raises(InputError, match="in use by PID"):  # so a third writer is refused
            rundir.lock_run_dir(path)
    finally:
        os.close(fd)
