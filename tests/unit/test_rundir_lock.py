"""The run directory's writer lock leaves no ``.optcheck.lock`` behind, and removing it
opens no window for two writers (``optcheck/run/rundir.py``, ``docs/reliability.md``).
Real files and real ``flock``; the race is staged by running the first writer's close
between the second writer's ``open`` and its ``flock``."""

from __future__ import annotations

import os

import pytest

from optcheck.errors import InputError
from optcheck.run import rundir
from optcheck.run.rundir import LOCK_NAME, RunDir


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


def test_a_run_directory_with_rank_folders_is_a_run_and_force_never_removes_a_live_rank(tmp_path):
    """A one-process writer (soak, Monitor) on the folder of a distributed run: its
    ``rank-K`` folders are a run already there; ``force`` replaces them only once no
    rank writes them (the lock rule ``optcheck soak --nproc`` follows too)."""
    out = tmp_path / "run"
    rank0 = RunDir(out / "rank-0")  # a rank of a distributed Monitor, still writing
    with pytest.raises(InputError, match=r"already holds a run \(rank folders rank-0\)"):
        RunDir(out)
    with pytest.raises(InputError, match=f"rank-0: the run directory is in use by PID {os.getpid()}"):
        RunDir(out, force=True)
    assert (out / "rank-0" / "snapshots.jsonl").exists()  # nothing removed
    rank0.close()
    RunDir(out / "rank-1").close()
    d = RunDir(out, force=True)  # every rank closed: replaced
    assert not (out / "rank-0").exists() and not (out / "rank-1").exists()
    d.close()


def test_held_by_other_names_a_live_holder_but_never_an_ancestor(tmp_path):
    """``held_by_other``: the PID of a live process holding the lock, None for this
    process's own ancestors (a ``--nproc`` supervisor holds OUT while its ranks write
    OUT/rank-K) and once the holder is gone. Real processes and a real flock."""
    import subprocess
    import sys
    import textwrap

    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import subprocess, sys, time
        from pathlib import Path
        from optcheck.run import rundir
        fd = rundir.lock_run_dir(Path({str(out)!r}))
        child = subprocess.run([sys.executable, "-c", "from optcheck.run import rundir; "
                                "print(rundir.held_by_other({str(out)!r}))"], capture_output=True, text=True)
        print(child.stdout.strip(), flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "None"  # the holder's own child: its ancestor holds it
        assert rundir.held_by_other(out) == holder.pid
    finally:
        holder.kill()
        holder.wait()
    assert rundir.held_by_other(out) is None
