"""``optcheck soak --nproc N``: the built-in GPT soak under DDP with N ranks on this
machine. Torch-free supervisor.

It takes ``OUT``'s run-directory lock (``optcheck.run.rundir.lock_run_dir``, the
same lock as a one-process soak or a Monitor: a second writer is refused naming the
PID that holds it), starts ``python -m optcheck.distributed.launch --nproc-per-node N
-m optcheck.distributed.worker`` (``torch.distributed.run``; gloo, CPU; a free port from
the OS) in a new session, shows the usual progress bar from the ranks' heartbeats and
prints each finding as it is written, and when the job ends folds every ``OUT/rank-K/``
(each rank's own stream, the layout of a one-process soak) into ``OUT/summary.json``
through the run's recorder (:class:`optcheck.run.recorder.RankRecorder`, ``summary_version``
2), with what only the supervisor saw: a rank killed or hung, optcheck signalled, the
launcher's failure.

Exit codes as ``optcheck.run.exitcodes``:

- a rank killed (SIGKILL, the OOM killer): ``torch.distributed.run`` sees the
  worker die and stops the others; its "Root Cause" report names the rank and
  signal, the heartbeat the step: exit 3;
- a rank that hangs or is stopped (SIGSTOP): with ``--step-timeout S``, when no rank
  has advanced for S seconds every rank is stopped; the blamed rank is the one in
  state ``T`` (stopped), else the one behind that is not inside forward/backward
  (heartbeat stage 0; the others wait in a collective): exit 3;
- without ``--step-timeout`` the other ranks' collectives fail after the process
  group's timeout (``--timeout`` of the worker, 60 s here; gloo's own default is
  30 min), and the Monitor's exchange records OC707;
- SIGINT or SIGTERM to optcheck: every rank is asked to stop (SIGTERM, SIGCONT), killed
  after :data:`RANK_GRACE_S` (or at a second signal); ``summary.json`` says ``interrupted``: exit 130;
- SIGTERM (or SIGINT) to one rank, not to optcheck: that rank closes as interrupted, the
  launcher stops the others; ``summary.json`` says ``interrupted`` (exit 130), its
  ``interrupted_by`` the signal and its ``crash`` the rank (``optcheck/run/rank_fold.py``).

No process outlives the supervisor: ``optcheck/distributed/lifetime.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from optcheck.config import SoakConfig
from optcheck.distributed import lifetime, merge
from optcheck.distributed.launcher_report import knocked_on_judge, root_cause
from optcheck.distributed.limits import check_capacity, env_timeout_s
from optcheck.errors import InputError
from optcheck.findings import Finding
from optcheck.run import rundir as rd
from optcheck.run.recorder import RankRecorder
from optcheck.record.summary import Summary, utc_now

POLL_S = 0.5
STARTING = 2  # optcheck.distributed.worker.STARTING (the worker imports torch; this module must not)
#: What a --nproc run leaves in OUT besides the one-process files (``rundir.RECORD_FILES``...).
OWN_FILES = ("config.json", "launcher.log", "worker.log", rd.RESERVE_NAME)


class Beat(NamedTuple):
    step: int
    stage: int
    pid: int | None


#: seconds the ranks get to close after SIGTERM before SIGKILL (see _stop)
RANK_GRACE_S = 30.0

def free_port() -> int:
    """A TCP port the OS has just handed out on 127.0.0.1 (bind to port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def heartbeats(out: Path, world: int) -> dict[int, Beat]:
    """``{rank: Beat(step, stage, pid)}`` from ``OUT/rank-K/heartbeat`` (ranks without one left out)."""
    beats = {}
    for r in range(world):
        try:
            parts = (out / f"rank-{r}" / "heartbeat").read_text().split()
            beats[r] = Beat(int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else None)
        except (OSError, ValueError, IndexError):
            continue
    return beats


class _Claim:
    """``OUT`` held for this run: its lock taken, an old run there refused or (``force``)
    removed. The lock is ``lock_run_dir``'s; a rank folder held by another writer (a
    Monitor's ``rank-K``) is refused too, and nothing is removed before every lock is held."""

    def __init__(self, out: Path, force: bool):
        self.out = out
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"--out {out}: cannot write there ({e.strerror or e})") from None
        self.fd: int | None = rd.lock_run_dir(out)  # InputError naming the PID that holds it
        try:
            ranks = rd.rank_folders(out)
            held = rd.existing_run(out) or (f"rank folders {', '.join(p.name for p in ranks)}" if ranks else None)
            if held and not force:
                raise InputError(f"--out {out}: already holds a run ({held}); pass --force to replace it, "
                                 f"or choose another --out")
            if force:
                self._clear(ranks)
        except BaseException:
            self.release()
            raise

    def _clear(self, ranks: list[Path]) -> None:
        if ranks:
            rd.remove_rank_folders(ranks)  # every rank's lock first: a folder another process writes stays
        try:
            for name in (*rd.RECORD_FILES, *OWN_FILES, *rd.summary_temps(self.out)):
                if os.path.lexists(self.out / name):
                    os.unlink(self.out / name)  # a symlink goes, its target stays
            work = self.out / "work"  # a one-process soak's
            if work.is_dir() and not work.is_symlink():
                shutil.rmtree(work)
        except OSError as e:
            raise InputError(f"--out {self.out}: cannot replace the run there ({e.strerror or e})") from None

    def release(self) -> None:
        """Drop the lock, its file removed first while still held (as ``RunDir`` does: a
        writer starting now takes a new file, never one left behind)."""
        if self.fd is None:
            return
        try:
            os.unlink(self.out / rd.LOCK_NAME)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None

    def fresh(self, name: str) -> Path:
        """``OUT/name`` with nothing there (a symlink planted there is removed, never written through)."""
        p = self.out / name
        if os.path.lexists(p):
            os.unlink(p)
        return p


def run_distributed_soak(cfg: SoakConfig, nproc: int, out: str | os.PathLike | None, *, fail_on: str = "warning",
                         progress: bool = True, force: bool = False, timeout_s: float = 60.0):
    """Run the soak on ``nproc`` ranks; return an ``optcheck.drivers.soak.SoakResult`` whose
    summary is the merged one (plus ``crash`` naming the rank, step and signal on a fault,
    ``interrupted_by`` after SIGINT/SIGTERM).

    Raises:
        InputError: ``nproc`` < 2 or beyond this machine's cores or memory, a junk
            ``OPTCHECK_DIST_TIMEOUT``, ``out`` held by another process, or holding a run
            while ``force`` is False (nothing is started).
    """
    from optcheck.drivers.soak import SoakResult, default_out_dir
    from optcheck.drivers.watch import Signals

    if nproc < 2:
        raise InputError(f"--nproc {nproc}: give 2 or more ranks (1 is the ordinary soak)")
    env_timeout_s()
    check_capacity(cfg, nproc)
    out = Path(out) if out is not None else default_out_dir()
    standalone = getattr(sys.modules.get("optcheck.cli"), "STANDALONE", False)
    with Signals(restore=not standalone) as sig:  # before anything is spawned: no signal is lost
        claim = _Claim(out, force)
        try:
            summary, findings = _supervise(cfg, nproc, claim, sig, fail_on, progress, timeout_s)
        finally:
            claim.release()
    return SoakResult(summary=summary, findings=[Finding.from_dict(f) for f in findings],
                      exit_code=summary["exit_code"], out=out)


class _Live:
    """The findings of every rank as they are written: folded (``merge.fold``) and printed
    like a one-process soak's (``step S (phase) CODE symbol [severity]: message``, with
    the rank)."""

    def __init__(self, out: Path, world: int, bar):
        self.out, self.world, self.bar = out, world, bar
        self.seen: set = set()
        self.findings: list[dict] = []
        self.read = [0] * world
        self.size = [-1] * world

    def poll(self) -> None:
        for r in range(self.world):
            try:
                size = (self.out / f"rank-{r}" / "findings.jsonl").stat().st_size
            except OSError:
                continue
            if size == self.size[r]:
                continue
            self.size[r] = size
            found = merge.read_findings(self.out, r)  # notes come with the final merge
            new, self.read[r] = found[self.read[r]:], len(found)
            for f in merge.fold(r, new, self.seen, self.findings):
                self.bar.write(f"step {f.get('step')} ({f.get('phase')}) rank {r} {f.get('code')} {f.get('symbol')} "
                               f"[{f.get('severity')}]: {f.get('message')}")


def _supervise(cfg: SoakConfig, nproc: int, claim: _Claim, sig, fail_on: str, progress: bool,
               timeout_s: float) -> tuple[dict, list[dict]]:
    from optcheck.drivers.worker_process import Progress

    out = claim.out
    cfg_path = claim.fresh("config.json")
    cfg_path.write_text(cfg.to_json(), encoding="utf-8")
    started = utc_now()
    RankRecorder(out, source="soak").write_running(
        {**Summary(run=out.name, backend="pytorch", source="soak", steps_requested=cfg.run.steps, fail_on=fail_on,
                   started=started, out=str(out)).to_dict(), "world": nproc})
    cmd = [sys.executable, "-m", "optcheck.distributed.launch", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "optcheck.distributed.worker",
           "--config", str(cfg_path), "--out", str(out), "--fail-on", fail_on, "--timeout", str(timeout_s)]
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg.run.threads))
    bar = Progress(cfg.run.steps, progress, f"soak pytorch x{nproc} (DDP)")
    live = _Live(out, nproc, bar)
    hung = None
    t0 = time.perf_counter()
    beats: dict[int, Beat] = {}
    with open(claim.fresh("launcher.log"), "w", encoding="utf-8") as log:
        proc = None
        if not sig.count:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        last, last_t = None, time.monotonic()
        try:
            while proc is not None and proc.poll() is None and not sig.count:
                time.sleep(POLL_S)
                beats = {**beats, **heartbeats(out, nproc)}  # a rank's PID stays known once seen
                live.poll()
                if beats:
                    bar.update(min(b.step for b in beats.values()), None, len(live.findings))
                steps = {r: (b.step, b.stage) for r, b in beats.items()}
                if steps != last or len(beats) < nproc or any(b.stage == STARTING for b in beats.values()):
                    last, last_t = steps, time.monotonic()  # the clock starts once every rank has begun step 1
                elif cfg.run.step_timeout_s and time.monotonic() - last_t > cfg.run.step_timeout_s:
                    hung = _hung_rank(beats, nproc)
                    break
        finally:
            if proc is not None:
                _stop(proc, beats, sig)
            bar.close()
    live.poll()
    return _summarise(cfg, nproc, out, proc, sig, hung, started, time.perf_counter() - t0, fail_on)


def _summarise(cfg: SoakConfig, nproc: int, out: Path, proc, sig, hung: dict | None, started: str,
               elapsed: float, fail_on: str) -> tuple[dict, list[dict]]:
    """The merged summary of the ended job, folded and written by the run's recorder with what
    the supervisor saw (a hung or killed rank, a signal to optcheck, the launcher's exit), and its
    findings."""
    log = out / "launcher.log"
    beats = heartbeats(out, nproc)
    returncode = proc.returncode if proc is not None else None
    fault = rank_signal = None
    if hung is not None:
        how = "was stopped (SIGSTOP)" if hung["stopped"] else "made no progress"
        fault = {"rank": hung["rank"], "step": hung["step"] + 1, "exc_type": "Hang",
                 "message": f"rank {hung['rank']} {how} for {cfg.run.step_timeout_s:g} s (--step-timeout) after step "
                            f"{hung['step']}; every rank was stopped"}
    ranks, folded, notes = merge.read_ranks(out, nproc)
    if hung is None and not sig.count and returncode not in (0, None):
        cause = root_cause(log.read_text(encoding="utf-8", errors="replace"), knocked_on_judge(ranks))
        first = ranks[cause["rank"]] if cause is not None and 0 <= cause["rank"] < nproc else None
        if cause is not None and cause["signal"] in ("SIGKILL", "SIGSEGV", "SIGABRT", "SIGBUS"):
            step = beats[cause["rank"]].step if cause["rank"] in beats else 0
            fault = {"rank": cause["rank"], "step": step + 1, "exc_type": cause["signal"], "signal": cause["signal"],
                     "message": f"rank {cause['rank']} was killed by {cause['signal']} in step {step + 1}; "
                                f"torch.distributed.run stopped the other ranks"}
        elif cause is not None and cause["signal"] is not None:  # SIGTERM, SIGINT... to one rank, not to optcheck
            rank_signal = {"rank": cause["rank"], "signal": cause["signal"]}
        elif first is not None and first.get("status") == "interrupted" and first.get("interrupted_by"):
            # the first rank to fail recorded a signal (its Monitor's handler ran, then it exited 1): not the
            # launcher's, which stops ranks only after a failure, nor optcheck's (sig.count is 0)
            rank_signal = {"rank": cause["rank"], "signal": first["interrupted_by"]}
    summary = RankRecorder(out, source="soak", knock_on=merge.knock_on).fold(
        ranks, folded, notes, heartbeats={r: b.step for r, b in beats.items()}, interrupted_by=sig.name,
        fault=fault, rank_signal=rank_signal, launcher_exit=returncode, launcher_log=str(log), elapsed_s=elapsed,
        steps_requested=cfg.run.steps, fail_on=fail_on,
        config={k: v for k, v in cfg.to_wire().items() if k != "inject"}, started=started, finished=utc_now(),
        nproc=nproc, inject=[f"{i.name}@{i.step}" for i in cfg.checks.inject], signals=sig.count)
    return summary, folded


def _hung_rank(beats: dict[int, Beat], world: int) -> dict:
    """The rank to blame when no rank advances: one whose process is stopped (SIGSTOP,
    state ``T``), else the one behind and outside forward/backward (stage 0) — the
    others wait in a collective for it; a rank without a heartbeat at all counts as step 0."""
    stopped = [r for r, b in sorted(beats.items()) if b.pid and lifetime.proc_state(b.pid) in ("T", "t")]
    if stopped:
        return {"rank": stopped[0], "step": beats[stopped[0]].step, "stopped": True}
    full = {r: beats.get(r, Beat(0, 0, None)) for r in range(world)}
    rank = min(full, key=lambda r: (full[r].step + full[r].stage, full[r].stage))
    return {"rank": rank, "step": full[rank].step, "stopped": False}


def _stop(proc: subprocess.Popen, beats: dict[int, Beat], sig) -> None:
    """Stop the launcher and every rank: SIGTERM to the launcher (it sends SIGTERM to its ranks;
    without a launcher, to each rank), SIGCONT to every rank (a stopped one then sees it); after
    :data:`RANK_GRACE_S` (or at a second signal) SIGKILL to the launcher's session and to
    every rank still alive."""
    from optcheck.drivers.watch import GRACE_S as ONE_PROCESS_GRACE_S

    # a rank closes its Monitor (final snapshot, rules, summary) before it exits: under load that can
    # take longer than a one-process worker's goodbye, and a rank killed mid-close leaves its summary
    # `running`. torchrun itself waits 30 s for its workers after forwarding the signal
    # (torch.distributed.elastic's PContext.close); wait as long, a second signal still kills at once.
    GRACE_S = max(ONE_PROCESS_GRACE_S, RANK_GRACE_S)
    pids = [b.pid for b in beats.values() if b.pid and lifetime.is_rank(b.pid)]

    def alive() -> bool:
        return proc.poll() is None or any(lifetime.is_rank(p) for p in pids)

    launcher = proc.poll() is None
    if launcher:
        lifetime.send(proc.pid, signal.SIGTERM)  # it sends SIGTERM to each rank (once: a second one would
    for p in pids:                                # land in the rank's closing writes)
        if not launcher:
            lifetime.send(p, signal.SIGTERM)
        lifetime.send(p, signal.SIGCONT)  # a stopped rank sees its SIGTERM
    first = sig.count
    deadline = time.monotonic() + GRACE_S
    while alive() and time.monotonic() < deadline and not (first and sig.count > first):
        time.sleep(0.1)
    if alive():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for p in pids:
            if lifetime.is_rank(p):
                lifetime.send(p, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + GRACE_S  # a rank killed with its launcher (PR_SET_PDEATHSIG) is gone in
    while any(lifetime.is_rank(p) for p in pids) and time.monotonic() < deadline:  # moments; it must not
        time.sleep(0.05)  # replace OUT/summary.json after the supervisor's
