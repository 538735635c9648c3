"""The run directory: every file a soak or a Monitor writes, flushed as it comes.

Layout of ``--out DIR``::

    snapshots.jsonl   one schema-1 snapshot a line (``optcheck/schemas/snapshot-1.json``)
    findings.jsonl    one finding a line (``optcheck/schemas/finding-1.json``)
    metrics.jsonl     {"step", "loss", "step_time_s"} a line, every step, written in
                      batches (``docs/run-directory.md``: when records reach the disk)
    events.jsonl      lifecycle events, injections, worker crash records
    summary.json      ``optcheck.summary/1``: written with status "running" at
                      the start and replaced atomically at the end
    worker.log        the worker's stderr
    fatal.log         a Monitor's process killed by a fatal signal: its Python stacks
                      (``faulthandler``); removed at close when empty
    .optcheck.lock    the writer's lock (``fcntl.flock``) and its PID, while it writes

Guarantees:

* **one writer**: :class:`RunDir` takes an exclusive ``flock`` on
  ``.optcheck.lock`` for as long as it is open; a second writer gets
  :class:`InputError` naming the PID that holds it. The kernel drops the lock
  when the holder exits, however it exits (flock(2)); a writer that closes
  removes the file while it still holds the lock, and a writer that locked a
  file removed that way (its inode no longer the path's) takes the new one.
* **no silent overwrite**: a directory that already holds run records is
  refused unless ``force=True`` (``--force``) or ``append=True`` (a resume).
* **no symlink is followed**: every file is opened with ``O_NOFOLLOW`` (and
  must be a regular file), so a ``metrics.jsonl -> victim`` link planted in the
  directory is refused, never written through; ``force`` removes the link, not
  its target.
* **no torn line**: each record, or batch of metrics lines, is one
  ``write(2)``; when it fails (``ENOSPC`` disk full, ``EFBIG`` over
  ``RLIMIT_FSIZE``, ``EIO``) the partial bytes are cut off again and
  :class:`RecordError` names the file and the error. (Only a process killed
  in the middle of a ``write(2)`` can leave a torn last line; readers skip it.)
* **a summary even on a full disk**: 64 KiB are set aside in
  ``.optcheck-reserve`` when the directory is opened and given back to write
  the last ``summary.json`` if the disk is full by then.

Reading a run directory back is :class:`optcheck.report.reader.RunReader`'s job.

The OS facts behind these (flock(2), open(2) ``O_NOFOLLOW``, rename(2), partial
writes and ``RLIMIT_FSIZE``) are in ``docs/reliability.md``. Who writes through
:class:`RunDir`: ``optcheck.run.recorder.RunRecorder``, and nothing else.

(Over 400 lines: the file-system guarantees of a run directory are kept in one place.)
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import threading
from pathlib import Path

from optcheck.errors import InputError, RecordError
from optcheck.record.snapshot import dumps, strict_json

SUMMARY_SCHEMA = "optcheck.summary/1"
FILES = ("snapshots.jsonl", "findings.jsonl", "metrics.jsonl", "events.jsonl")
LOCK_NAME = ".optcheck.lock"
FATAL_LOG = "fatal.log"
RESERVE_NAME = ".optcheck-reserve"
RESERVE_BYTES = 64 * 1024
#: Files whose presence means the directory already holds a run.
RECORD_FILES = ("summary.json", *FILES)
#: Inodes a soak's run directory takes: the directory, its 4 record files,
#: worker.log, lock, reserve, config.json, work/, summary.json and its temporary.
MIN_INODES = 13
#: Free bytes below which a run is not started: the reserve and the first records.
MIN_FREE_BYTES = RESERVE_BYTES + 64 * 1024


def check_space(out: str | os.PathLike, needed_bytes: int) -> str | None:
    """Check the file system ``out`` will be on before a run starts.

    Args:
        out: the run directory (it need not exist yet).
        needed_bytes: an estimate of what the run will write.

    Returns:
        A warning line when the estimate exceeds the free space or the
        per-file size limit (``RLIMIT_FSIZE``), else None.

    Raises:
        RecordError: fewer than :data:`MIN_FREE_BYTES` free bytes or
            :data:`MIN_INODES` free inodes: nothing could be recorded.
    """
    import resource

    from optcheck.units import format_bytes

    p = Path(out)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    if st.f_blocks == 0:  # /proc, /sys: no block accounting; the open fails with its own message
        return None
    free = st.f_bavail * st.f_frsize
    if free < MIN_FREE_BYTES:
        raise RecordError(out, OSError(errno.ENOSPC, f"No space left on device: {free:,} bytes free there, "
                                                     f"a run needs at least {MIN_FREE_BYTES:,}"))
    if st.f_files and st.f_favail < MIN_INODES:
        raise RecordError(out, OSError(errno.ENOSPC, f"No free inodes: {st.f_favail} left there, "
                                                     f"a run needs {MIN_INODES}"))
    if needed_bytes > free:
        return (f"--out {out}: {format_bytes(free)} free there, the run will write about "
                f"{format_bytes(needed_bytes)}: it stops with exit 4 when the disk is full")
    fsize = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if fsize != resource.RLIM_INFINITY and needed_bytes > fsize:
        return (f"--out {out}: files are limited to {format_bytes(fsize)} (ulimit -f), the run will write about "
                f"{format_bytes(needed_bytes)}: it stops with exit 4 at the limit")
    return None


def _open_regular(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never follows a symlink and accepts only a regular file.

    Raises:
        InputError: ``path`` is a symlink, a FIFO, a device or a directory.
        OSError: anything else (ENOSPC...).
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(f"{path}: is a symbolic link; optcheck never writes through one "
                             f"(remove it, or pass --force to replace it)") from None
        if e.errno in (errno.ENXIO, errno.EISDIR):
            raise InputError(f"{path}: not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{path}: not a regular file")
    os.set_blocking(fd, True)
    return fd


def open_record_file(path: Path) -> int:
    """Open (create, truncate) a file of the run directory for writing, never through
    a symlink; returns its file descriptor. Raises InputError or OSError as :func:`_open_regular`."""
    if os.path.islink(path):
        os.unlink(path)
    return _open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)


def writer_gone(path: str | os.PathLike) -> str | None:
    """Whether the process recording a run whose ``summary.json`` still says ``running`` is gone.

    Returns None while the process named in ``.optcheck.lock`` lives; else a
    description: ``"PID 4242 is gone"``, or ``"no writer holds it"`` (no lock
    file, or no PID in it). A writer that closes writes its final summary
    before it removes the lock file, so a ``running`` summary with no live
    writer is a run that ended without closing (SIGKILL, a segfault, power).
    """
    try:
        text = Path(path, LOCK_NAME).read_bytes()[:32].decode("ascii", "replace").strip()
    except OSError:
        return "no writer holds it"
    if not text.isdecimal():
        return "no writer holds it"
    pid = int(text)
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return f"PID {pid} is gone"
    except PermissionError:  # alive, another user's
        return None
    return None


def lock_run_dir(path: Path, option: str = "--out ") -> int:
    """Take the run directory's writer lock; return its file descriptor (closing
    it releases the lock).

    Raises:
        InputError: another process holds it ("in use by PID N").
    """
    for _ in range(8):  # the holder removes the file when it finishes: lock the file the path names now
        fd = _open_regular(path / LOCK_NAME, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise InputError(f"{option}{path}: the run directory is in use by PID {holder} (another optcheck "
                             f"writes there); wait for it to finish or choose another --out") from None
        try:
            st, now = os.fstat(fd), os.stat(path / LOCK_NAME, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # locked a file its holder had just removed: take the new one
    else:
        raise InputError(f"{option}{path}: could not take the run directory's lock ({LOCK_NAME} keeps changing)")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:  # a full disk: the lock holds without the PID in it
        pass
    return fd


def existing_run(path: Path) -> str | None:
    """A description of the run records already in ``path`` ("status clean, last
    step 300"), or None when it holds none."""
    present = [n for n in RECORD_FILES if os.path.lexists(path / n)]
    if not present:
        return None
    try:
        s = json.loads((path / "summary.json").read_text(encoding="utf-8"))
        if isinstance(s, dict):
            return f"status {s.get('status')!s}, last step {s.get('last_step', 0)!s}"
    except (OSError, ValueError, RecursionError):
        pass
    return "files " + ", ".join(present)


def rank_folders(path: str | os.PathLike) -> list[Path]:
    """The ``rank-K`` folders of a distributed run in ``path`` (``optcheck soak --nproc``
    or a Monitor under torchrun: each rank's own run directory), sorted by name;
    symlinks are not followed."""
    p = Path(path)
    try:
        return sorted(d for d in p.glob("rank-*") if d.name[5:].isascii() and d.name[5:].isdecimal()
                      and d.is_dir() and not d.is_symlink())
    except OSError:
        return []


def remove_rank_folders(ranks: list[Path]) -> None:
    """Remove the rank folders of an old distributed run (``--force``), each only
    once its lock is held by this process: a folder another process writes is
    never removed (:class:`InputError` naming its PID, nothing removed).

    Raises:
        InputError: a rank folder is in use; or cannot be removed (one line).
    """
    locks = []
    try:
        for d in ranks:  # every lock first
            locks.append(lock_run_dir(d))
        for d in ranks:
            shutil.rmtree(d)
    except OSError as e:
        raise InputError(f"--out {Path(ranks[0]).parent}: cannot replace the run there "
                         f"({e.strerror or e})") from None
    finally:
        for fd in locks:
            os.close(fd)


def held_by_other(path: str | os.PathLike) -> int | None:
    """The PID named in ``path``'s lock when that process lives and is neither this
    process nor one of its ancestors (an ``optcheck soak --nproc`` supervisor holds
    ``OUT`` while its ranks write ``OUT/rank-K``); None otherwise. Read from
    ``.optcheck.lock`` and the process table (``psutil``)."""
    if writer_gone(path) is not None:
        return None
    try:
        pid = int(Path(path, LOCK_NAME).read_bytes()[:32].decode("ascii", "replace").strip())
    except (OSError, ValueError):
        return None
    import psutil

    try:
        mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    except psutil.Error:
        mine = {os.getpid(), os.getppid()}
    return None if pid in mine else pid


class RunDir:
    """Opens ``path`` for one writer (see the module docstring).

    Args:
        path: the run directory (created with its parents if missing).
        append: add to the records already there (a resumed job).
        force: replace the records of a run already there.
        reuse_hint: what the "already holds a run" error tells the caller to do
            (default: the CLI's "pass --force to replace it, or choose another
            --out"; ``optcheck.Monitor`` names its own arguments, it has no --force).
        option: how error lines name the folder's argument ("--out " for the CLI,
            "out=" for ``optcheck.Monitor``).

    Raises:
        InputError: the directory cannot be created or written, is locked by
            another process, already holds a run (without ``append``/``force``),
            or holds a symlink or special file where a record file goes.
        RecordError: not even the reserve fits (the disk is full already).
    """

    def __init__(self, path: str | os.PathLike, append: bool = False, *, force: bool = False,
                 reuse_hint: str = "", option: str = "--out "):
        self.path = Path(path)
        self.failed: RecordError | None = None
        self._created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"{option}{path}: cannot write there ({e.strerror or e})") from None
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise InputError(f"{option}{path}: cannot write there (permission denied)")
        self._lock = None
        self._owned = False  # set once the lock is held and the directory may be written
        self._fds: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        try:
            self._lock = lock_run_dir(self.path, option)
            if not append:
                links = [n for n in (*RECORD_FILES, "worker.log", "config.json") if (self.path / n).is_symlink()]
                if links and not force:
                    raise InputError(f"{self.path / links[0]}: is a symbolic link; optcheck never writes through "
                                     f"one (remove it, or pass --force to replace it)")
                ranks = rank_folders(self.path)
                held = existing_run(self.path) or (f"rank folders {', '.join(d.name for d in ranks)}"
                                                   if ranks else None)
                if held and not force:
                    raise InputError(f"{option}{path}: already holds a run ({held}); "
                                     + (reuse_hint or "pass --force to replace it, or choose another --out"))
                if force:
                    if ranks:
                        remove_rank_folders(ranks)  # a distributed run's; refused while a rank writes
                    for name in (*RECORD_FILES, "worker.log", "config.json", *summary_temps(self.path)):
                        if os.path.lexists(self.path / name):
                            os.unlink(self.path / name)  # a symlink goes, its target stays
            self._owned = True
            self._reserve()
            mode = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
            for name in (*FILES, "worker.log"):
                fd = _open_regular(self.path / name, mode)
                self._fds[name] = fd
                self._sizes[name] = os.fstat(fd).st_size
        except OSError as e:
            self._release()
            self.discard_created()
            raise RecordError(self.path, e) if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) \
                else InputError(f"{option}{path}: cannot write there ({e.strerror or e})") from None
        except BaseException:
            self._release()
            self.discard_created()
            raise
        self.worker_log = os.fdopen(os.dup(self._fds["worker.log"]), "ab", buffering=0)

    # -- writing -----------------------------------------------------------
    def _reserve(self) -> None:
        p = self.path / RESERVE_NAME
        if os.path.lexists(p):
            os.unlink(p)
        fd = _open_regular(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            _write_all(fd, b"\0" * RESERVE_BYTES)
        except OSError:
            os.close(fd)
            os.unlink(p)
            raise
        os.close(fd)

    def release_reserve(self) -> bool:
        """Give the reserved space back (to write a summary on a full disk); True if there was some."""
        try:
            os.unlink(self.path / RESERVE_NAME)
            return True
        except OSError:
            return False

    def write_file(self, name: str, text: str) -> Path:
        """Write a whole small file (``config.json``) in the directory, never through a symlink.

        Raises:
            RecordError: the write failed.
        """
        p = self.path / name
        try:
            if os.path.lexists(p):
                os.unlink(p)
            fd = _open_regular(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            try:
                _write_all(fd, text.encode("utf-8"))
            finally:
                os.close(fd)
        except OSError as e:
            raise RecordError(p, e) from None
        return p

    def _write(self, name: str, obj: dict) -> None:
        """Append one record line (:meth:`_write_lines`)."""
        self._write_lines(name, [obj])

    def _write_lines(self, name: str, objs: list[dict]) -> None:
        """Append record lines with one ``write(2)`` (``_write_all`` repeats it only
        after a short write). After a failure the partial bytes are cut off again, the
        directory is marked ``failed`` and later records are dropped (the caller
        reports the first)."""
        if self.failed is not None or not objs:
            return
        fd = self._fds[name]
        data = "".join([dumps(o) + "\n" for o in objs]).encode("utf-8")
        try:
            _write_all(fd, data)
        except OSError as e:
            try:  # cut the partial lines off: the file ends with a whole record
                os.ftruncate(fd, self._sizes[name])
            except OSError:
                pass
            self.failed = RecordError(self.path / name, e)
            raise self.failed from None
        self._sizes[name] += len(data)

    def snapshot(self, snap: dict) -> None:
        self._write("snapshots.jsonl", snap)

    def finding(self, finding: dict) -> None:
        self._write("findings.jsonl", finding)

    def metric(self, step: int, loss: float | None, step_time_s: float | None) -> None:
        self.metrics([step], [loss], [step_time_s])

    def metrics(self, steps: list[int], losses: list, step_times_s: list | None = None) -> None:
        """Append one ``metrics.jsonl`` line per step, all with one ``write(2)``: a batch
        reaches the file whole or (a full disk) not at all. ``step_times_s`` None: no
        step times (a Monitor's)."""
        times = step_times_s if step_times_s is not None else [None] * len(steps)
        self._write_lines("metrics.jsonl", [{"step": s, "loss": v, "step_time_s": t}
                                            for s, v, t in zip(steps, losses, times)])

    def event(self, event: dict) -> None:
        self._write("events.jsonl", event)

    def summary(self, summary: dict, *, final: bool = True) -> None:
        """Replace the summary file atomically (:func:`write_summary`; for the recorder only).
        On a full disk the reserve is given back and the write tried once more —
        for the ``final`` summary only: a ``running`` one never spends the reserve
        the last summary needs.

        Raises:
            RecordError: it could not be written even then.
        """
        try:
            write_summary(self.path, summary)
        except RecordError as e:
            if not final or e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or not self.release_reserve():
                raise
            write_summary(self.path, summary)

    # -- closing -----------------------------------------------------------
    def _release(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        if self._lock is not None:
            try:  # no lock file left behind; still locked, so a writer starting now waits for the new one
                os.unlink(self.path / LOCK_NAME)
            except OSError:
                try:
                    os.ftruncate(self._lock, 0)  # no stale PID for the next writer to read
                except OSError:
                    pass
            os.close(self._lock)  # releases the flock
            self._lock = None

    def abandon(self) -> None:
        """In a forked child: close this process's copies of the files and of the lock
        without touching the directory (the lock file, the reserve and the flock stay
        the parent's: flock(2) locks belong to the open file description the parent
        still holds). Nothing is written afterwards. Idempotent."""
        for fd in (*self._fds.values(), *([self._lock] if self._lock is not None else [])):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds, self._lock = {}, None
        log = getattr(self, "worker_log", None)
        if log is not None and not log.closed:
            try:
                log.close()
            except OSError:
                pass
        self.failed = RecordError(self.path, OSError(errno.EPERM, "a forked child never writes its parent's run"))

    def close(self) -> None:
        """Close every file, drop the reserve and release the lock. Idempotent."""
        if getattr(self, "worker_log", None) is not None and not self.worker_log.closed:
            self.worker_log.close()
        if self._fds or self._lock is not None:
            self.release_reserve()
        self._release()

    def discard_created(self) -> None:
        """Remove the directory if this RunDir created it (a run that never
        started leaves nothing behind); otherwise remove only the record files it
        created. Call after :meth:`close` (or on a failed open). Does nothing when
        this RunDir never held the directory (locked by another, or refused)."""
        if not self._owned:
            return
        if self._created and self.path.is_dir() and not self.path.is_symlink():
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for name in (*RECORD_FILES, "worker.log", "config.json", *summary_temps(self.path), RESERVE_NAME, LOCK_NAME):
            p = self.path / name
            if os.path.lexists(p) and not os.path.islink(p):
                try:
                    os.unlink(p)
                except OSError:
                    pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]


SUMMARY_TEMP = re.compile(r"summary\.json(\.\d+-\d+-[0-9a-f]+)?\.tmp")
"""The names of ``summary.json``'s temporary files: ``summary.json.<pid>-<thread>-<random>.tmp`` (one per
writing process and thread: two ranks folding at once never share one), and the single name older versions
used."""


def summary_temp_name() -> str:
    """A temporary name for ``summary.json`` of this process and thread alone (:data:`SUMMARY_TEMP`)."""
    return f"summary.json.{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}.tmp"


def summary_temps(path: str | os.PathLike) -> list[str]:
    """The names of summary temporaries (:data:`SUMMARY_TEMP`) in folder ``path`` (a writer stopped between
    its write and its rename leaves one); [] when it cannot be listed."""
    try:
        return sorted(n for n in os.listdir(path) if SUMMARY_TEMP.fullmatch(n))
    except OSError:
        return []


def write_summary(path: str | os.PathLike, summary: dict) -> None:
    """Atomically replace the summary file of run directory ``path`` (a temporary file of this
    process and thread alone, :func:`summary_temp_name`, then rename(2); never through a symlink):
    two writers at once (two ranks folding) never remove or publish each other's half-written file.
    Called by ``optcheck/run/recorder.py`` only: the one writer of a run's summary
    (``tests/unit/test_layout.py``).

    Raises:
        RecordError: the temporary file could not be written or renamed.
    """
    summary = {"schema": SUMMARY_SCHEMA, **summary}
    target = Path(path) / "summary.json"
    tmp = target.with_name(summary_temp_name())
    data = (strict_json(summary, indent=2, default=str) + "\n").encode("utf-8")
    made = False
    try:
        fd = _open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        made = True
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, target)  # rename(2) replaces a symlink itself, never its target
    except OSError as e:
        if made:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if e.errno in (errno.EACCES, errno.EPERM) and _rewrite_in_place(target, data):
            return  # the folder took no new file (made read-only mid-run): the summary says the end all the same
        raise RecordError(target, e) from None


def _rewrite_in_place(target: Path, data: bytes) -> bool:
    """Replace the bytes of an existing regular summary file in place (not atomic; never through a symlink), for a
    folder that takes no new file but whose files still take writes (``chmod 555`` mid-run): its status then
    says how the run ended instead of staying ``running`` (issue 48). True when written."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        _write_all(fd, data)
        os.ftruncate(fd, len(data))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
