"""``optcheck run -- COMMAND``: run a command unchanged, every Python process of it watched.

1. :func:`check_command` and :func:`check_out`: bad input is one line
   (:class:`~optcheck.errors.InputError`, exit 2) before anything starts;
2. :func:`run_command`: the command runs with ``optcheck/autowatch/boot`` first on
   ``PYTHONPATH`` and the settings in ``OPTCHECK_RUN`` (the boot ``sitecustomize`` installs
   :class:`optcheck.autowatch.attach.AutoWatch` in each process that imports torch, which
   writes one stream per optimizer under ``out``); SIGTERM to optcheck is passed to the
   command at once, SIGINT too unless stdin is a terminal (a Ctrl-C there reached the
   whole foreground group already); optcheck waits for the command either way;
3. :func:`fold`: the streams become one run directory every reader takes. One stream
   (one process, one optimizer): its files are moved up into ``out`` — a Monitor's run
   directory. Several (a GAN, torchrun ranks, subprocesses): each is renamed
   ``out/rank-K`` (a torchrun rank keeps its number; the others follow) and folded as
   ``optcheck soak --nproc`` folds its ranks (:class:`optcheck.run.recorder.RankRecorder`,
   ``optcheck/run/rank_fold.py``); ``notes`` say which process and optimizer each is.
   None: a summary saying "no optimizer stepped" (:class:`optcheck.run.recorder.RunRecorder`).

The exit code (:func:`exit_code`): the command's own when it failed (a signal N: 128+N);
else 0, or 1 when a finding reaches ``fail_on``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from optcheck.errors import InputError
from optcheck.findings import severity_rank
from optcheck.run import exitcodes

BOOT = Path(__file__).resolve().parent / "boot"
#: what the streams are called while the command runs (optcheck/autowatch/attach.py)
STREAM_PREFIXES = ("proc-", "opt-")
NO_STEP = "no optimizer stepped"


def check_command(command: list[str]) -> list[str]:
    """``command`` with its program checked: given, found on ``PATH`` (or a path), executable.

    Raises:
        InputError: one line naming what is wrong.
    """
    if not command:
        raise InputError("no COMMAND: give the command to watch after --, e.g. optcheck run -- python train.py")
    prog = command[0]
    if os.sep in prog or (os.altsep and os.altsep in prog):
        p = Path(prog)
        if not p.exists():
            raise InputError(f"{prog}: no such file (the COMMAND to run)")
        if p.is_dir() or not os.access(p, os.X_OK):
            raise InputError(f"{prog}: not executable (chmod +x it, or run it through its interpreter: "
                             f"optcheck run -- python {prog})")
        return command
    if shutil.which(prog) is None:
        raise InputError(f"{prog}: command not found on PATH")
    return command


def check_out(out: str | os.PathLike) -> Path:
    """``out`` checked before the command starts: it holds no run and can be written (nothing
    is created here).

    Raises:
        InputError: ``--out DIR: already holds a run (...)`` or ``--out DIR: cannot write there``.
    """
    from optcheck.run.rundir import existing_run, rank_folders

    p = Path(out)
    if p.exists() and not p.is_dir():
        raise InputError(f"--out {out}: is a file, not a folder")
    if p.is_dir():
        held = existing_run(p) or (f"rank folders {', '.join(d.name for d in rank_folders(p))}"
                                   if rank_folders(p) else None) or _streams_text(p)
        if held:
            raise InputError(f"--out {out}: already holds a run ({held}); choose another --out or remove it")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"--out {out}: cannot write there (permission denied in {probe})")
    return p


def _streams_text(p: Path) -> str | None:
    found = [d.name for d in p.iterdir() if d.is_dir() and d.name.startswith(STREAM_PREFIXES)]
    return f"stream folders {', '.join(sorted(found)[:3])}" if found else None


def environment(out: Path, *, every: int, hazards: str, fail_on: str, ignore: list[str]) -> dict:
    """The command's environment: this one, with the boot folder first on ``PYTHONPATH`` and
    ``OPTCHECK_RUN`` set (``optcheck/autowatch/boot/sitecustomize.py`` reads it)."""
    env = dict(os.environ)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(BOOT) + (os.pathsep + old if old else "")
    env["OPTCHECK_RUN"] = json.dumps({"out": str(out.absolute()), "every": every, "hazards": hazards,
                                      "fail_on": fail_on, "ignore": ignore,
                                      "root": str(Path(__file__).resolve().parents[2])})
    return env


@dataclass
class Ended:
    """How the command ended: ``returncode`` (a signal N as 128+N), the signal optcheck got."""

    returncode: int
    interrupted_by: str | None = None
    signals: list[str] = field(default_factory=list)


def run_command(command: list[str], env: dict) -> Ended:
    """Run ``command`` and wait for it, passing SIGTERM (and SIGINT when stdin is no terminal)
    on to it (module docstring)."""
    child = subprocess.Popen(command, env=env)
    got: list[str] = []
    tty = _stdin_is_tty()

    def handler(signum, frame):
        name = signal.Signals(signum).name
        got.append(name)
        if signum == signal.SIGINT and tty and got.count(name) == 1:
            return  # the terminal sent it to the command too
        try:
            child.send_signal(signum)
        except OSError:
            pass

    previous = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[s] = signal.signal(s, handler)
        except (ValueError, OSError):  # not the main thread
            pass
    try:
        while True:
            try:
                rc = child.wait()
                break
            except KeyboardInterrupt:  # (a handler replaced by the default one)
                continue
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return Ended(128 - rc if rc < 0 else rc, got[0] if got else None, got)


def _stdin_is_tty() -> bool:
    try:
        return os.isatty(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):
        return False


# -- the fold ----------------------------------------------------------------------
def streams(out: Path) -> list[tuple[Path, str]]:
    """The streams the command's processes wrote under ``out``, as ``(folder, origin)``: the
    ranks of a torchrun job first (``rank-K``), then ``opt-N/rank-K``, then ``proc-*`` by name."""
    from optcheck.run.rundir import rank_folders

    found = [(d, f"torchrun rank {d.name[5:]}") for d in rank_folders(out)]
    for opt in sorted(out.glob("opt-*")):
        found += [(d, f"torchrun rank {d.name[5:]}, optimizer {opt.name[4:]}") for d in rank_folders(opt)]
    for d in sorted(out.glob("proc-*")):
        if d.is_dir() and not d.is_symlink():
            pid, _, opt = d.name[5:].partition("-opt")
            found.append((d, f"process {pid}, optimizer {opt}" if opt else f"process {pid}"))
    return [(d, o) for d, o in found if (d / "summary.json").is_file() or (d / "snapshots.jsonl").is_file()]


def _process_notes(out: Path) -> list[str]:
    notes = []
    for f in sorted(out.glob("notes-*.txt")):
        try:
            pid = f.stem[6:]
            notes += [f"process {pid}: {line}" for line in f.read_text(encoding="utf-8").splitlines() if line]
            f.unlink()
        except OSError:
            pass
    return notes


def fold(out: Path, ended: Ended, command: list[str], *, fail_on: str, every: int) -> tuple[dict, list[dict], list[str]]:
    """Fold the streams under ``out`` into its ``summary.json`` (module docstring); returns
    ``(summary, findings, notes)``. Never raises for what the command left: a stream that
    cannot be read is a note."""
    from optcheck.distributed import merge
    from optcheck.run.recorder import RankRecorder

    notes = _process_notes(out)
    found = streams(out)
    config = {"every": every, "command": list(command), "command_exit": ended.returncode}
    if not found:
        return _no_stream(out, ended, notes, config, fail_on)
    if len(found) == 1 and found[0][0].name.startswith("proc-"):
        _move_up(found[0][0], out)
        world, origins = 1, [found[0][1]]
        ranks = [_read_here(out, notes)]
        findings = [{**f, "rank": 0} for f in _findings_here(out, notes)]
    else:
        origins = []
        taken = {d for d, _ in found if d.parent == out and d.name.startswith("rank-")}
        k = len(taken)
        for d, origin in found:
            if d not in taken:
                target = out / f"rank-{k}"
                k += 1
                d.rename(target)
            else:
                target = d
            origins.append((int(target.name[5:]), origin))
        for opt in out.glob("opt-*"):
            shutil.rmtree(opt, ignore_errors=True)  # (its rank folders moved; the merged summary of its own goes)
        world = k
        ranks, findings, read_notes = merge.read_ranks(out, world)
        notes += read_notes
        origins = [o for _, o in sorted(origins)]
    if world > 1:
        notes = [f"rank-{i}: {o}" for i, o in enumerate(origins)] + notes
    fields = {"config": config, "fail_on": fail_on}
    if ended.returncode != 0 and ended.interrupted_by is None:
        s0 = [r for r in ranks if r]
        if not any(r.get("status") in ("crashed", "interrupted", "record-failed") for r in s0):
            fields.update(status="crashed", exit_code=exitcodes.CRASHED,
                          crash={"message": f"{command[0]} exited {ended.returncode}", "exit_code": ended.returncode})
    rec = RankRecorder(out, source="monitor", knock_on=merge.knock_on)
    summary = rec.fold(ranks, findings, notes, interrupted_by=ended.interrupted_by, attempts=3, **fields)
    return summary, findings, notes


def _read_here(out: Path, notes: list[str]) -> dict | None:
    from optcheck.report.reader import RunReader

    try:
        return RunReader(out).summary or None
    except InputError as e:
        notes.append(str(e))
        return None


def _findings_here(out: Path, notes: list[str]) -> list[dict]:
    from optcheck.report.reader import RunReader

    try:
        r = RunReader(out)
        found = r.findings
        notes += r.notes()
        return found
    except InputError as e:
        notes.append(f"{e}; its findings are left out")
        return []


def _move_up(stream: Path, out: Path) -> None:
    """Move one stream's files into ``out`` (the run directory is then a Monitor's)."""
    for f in stream.iterdir():
        os.replace(f, out / f.name)
    stream.rmdir()


def _no_stream(out: Path, ended: Ended, notes: list[str], config: dict, fail_on: str):
    """The summary of a command that stepped no optimizer: its exit code, and the note."""
    from optcheck.engine import RuleEngine
    from optcheck.record.summary import Summary
    from optcheck.run.recorder import RunRecorder

    rec = RunRecorder(out, Summary(run=out.name, backend="pytorch", source="monitor", fail_on=fail_on),
                      engine=RuleEngine(), reuse_hint="choose another --out")
    crashed = ended.returncode != 0 and ended.interrupted_by is None
    rec.set(not_checked=[f"{NO_STEP}: the command ran no optimizer.step() in a process that imported torch",
                         *notes], config=config, interrupted_by=ended.interrupted_by,
            crash={"message": f"{config['command'][0]} exited {ended.returncode}",
                   "exit_code": ended.returncode} if crashed else None)
    summary = rec.finish(crashed=crashed, interrupted=ended.interrupted_by is not None)
    rec.close()
    return summary, [], notes


def exit_code(ended: Ended, findings: list[dict], fail_on: str) -> int:
    """The command's own exit code when it failed; else 1 when a finding reaches ``fail_on``, else 0."""
    if ended.returncode != 0:
        return ended.returncode
    floor = severity_rank(fail_on)
    worst = max((severity_rank(f.get("severity", "info")) for f in findings), default=None)
    return exitcodes.FINDINGS if worst is not None and worst >= floor else exitcodes.CLEAN


__all__ = ["check_command", "check_out", "environment", "run_command", "fold", "exit_code", "Ended", "NO_STEP"]
