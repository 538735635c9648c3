"""``optcheck soak --nproc N``: the built-in GPT soak under DDP with N ranks on this
machine. Torch-free supervisor.

It starts ``python -m torch.distributed.run --nproc-per-node N -m
optcheck.distributed.worker`` (gloo, CPU; a free port from the OS) in a new
session, shows the usual progress bar from the ranks' heartbeats, and when the job
ends writes the merged ``OUT/summary.json`` over every ``OUT/rank-K/`` (each rank's
own stream, the same layout as a one-process soak's run directory).

Faults (exit code 3, every rank's records left readable):

- a rank killed (SIGKILL, the OOM killer): ``torch.distributed.run`` sees the
  worker die and stops the others; its "Root Cause" report names the rank and
  signal, the heartbeat the step;
- a rank that hangs: with ``--step-timeout S``, when no rank has advanced for S
  seconds the job is stopped; the hung rank is the one behind that is not inside
  forward/backward (its heartbeat stage is 0; the others wait in a collective);
- without ``--step-timeout`` the other ranks' collectives fail after the process
  group's timeout (``--timeout`` of the worker, 60 s here; gloo's own default is
  30 min), and the Monitor's exchange records OC707.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from optcheck import exitcodes
from optcheck.config import SoakConfig
from optcheck.distributed import merge
from optcheck.errors import InputError
from optcheck.findings import Finding

POLL_S = 0.5


def free_port() -> int:
    """A TCP port the OS has just handed out on 127.0.0.1 (bind to port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def heartbeats(out: Path, world: int) -> dict[int, tuple[int, int]]:
    """``{rank: (step, stage)}`` from ``OUT/rank-K/heartbeat`` (ranks without one left out)."""
    beats = {}
    for r in range(world):
        try:
            step, stage = (out / f"rank-{r}" / "heartbeat").read_text().split()
            beats[r] = (int(step), int(stage))
        except (OSError, ValueError):
            continue
    return beats


def root_cause(log: str) -> dict | None:
    """The failed rank and its exit code from ``torch.distributed.run``'s "Root Cause"
    report (``torch/distributed/elastic/multiprocessing/errors``): ``{"rank", "exitcode",
    "signal"}`` or None."""
    part = log.split("Root Cause", 1)
    if len(part) < 2:
        return None
    rank = re.search(r"rank\s*:\s*(\d+)", part[1])
    code = re.search(r"exitcode\s*:\s*(-?\d+)", part[1])
    if not (rank and code):
        return None
    exitcode = int(code.group(1))
    sig = signal.Signals(-exitcode).name if exitcode < 0 and -exitcode in signal.valid_signals() else None
    return {"rank": int(rank.group(1)), "exitcode": exitcode, "signal": sig}


def _prepare(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not force:
            raise InputError(f"--out {out}: a run is already there (remove it, or pass --force to replace it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def run_distributed_soak(cfg: SoakConfig, nproc: int, out: str | os.PathLike | None, *, fail_on: str = "warning",
                         progress: bool = True, force: bool = False, timeout_s: float = 60.0):
    """Run the soak on ``nproc`` ranks; return an ``optcheck.soak.SoakResult`` whose
    summary is the merged one (plus ``crash`` naming the rank, step and signal on a fault).

    Raises:
        InputError: ``nproc`` < 2, or ``out`` holds a run and ``force`` is False.
    """
    from optcheck.session_process import Progress
    from optcheck.soak import SoakResult, default_out_dir

    if nproc < 2:
        raise InputError(f"--nproc {nproc}: give 2 or more ranks (1 is the ordinary soak)")
    out = Path(out) if out is not None else default_out_dir()
    _prepare(out, force)
    cfg_path = out / "config.json"
    cfg_path.write_text(cfg.to_json())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "optcheck.distributed.worker",
           "--config", str(cfg_path), "--out", str(out), "--fail-on", fail_on, "--timeout", str(timeout_s)]
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg.threads))
    bar = Progress(cfg.steps, progress, f"soak pytorch x{nproc} (DDP)")
    hung = None
    t0 = time.perf_counter()
    with open(out / "launcher.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        last, last_t = None, time.monotonic()
        try:
            while proc.poll() is None:
                time.sleep(POLL_S)
                beats = heartbeats(out, nproc)
                if beats:
                    bar.update(min(s for s, _ in beats.values()), None, _count_lines(out / "rank-0" / "findings.jsonl"))
                if beats != last or len(beats) < nproc:  # the clock starts once every rank has begun step 1
                    last, last_t = beats, time.monotonic()
                elif cfg.step_timeout_s and time.monotonic() - last_t > cfg.step_timeout_s:
                    hung = _hung_rank(beats, nproc)
                    _stop(proc)
                    break
        except KeyboardInterrupt:
            _stop(proc)
            raise
        finally:
            bar.close()
        proc.wait()
    text = (out / "launcher.log").read_text(encoding="utf-8", errors="replace")
    summary = merge.merged(out, nproc)
    beats = heartbeats(out, nproc)
    for entry in summary["ranks"]:  # a rank stopped from outside never wrote its final summary: its heartbeat says how far
        if entry["status"] == "running" and entry["rank"] in beats:
            entry.update(status="stopped", last_step=beats[entry["rank"]][0])
    steps = [e["last_step"] for e in summary["ranks"] if isinstance(e["last_step"], int)]
    summary["last_step"] = min(steps) if steps else 0
    fault = None
    if hung is not None:
        fault = {"rank": hung["rank"], "step": hung["step"] + 1, "exc_type": "Hang",
                 "message": f"rank {hung['rank']} made no progress for {cfg.step_timeout_s:g} s "
                            f"(--step-timeout) after step {hung['step']}; the job was stopped"}
    elif proc.returncode != 0:
        cause = root_cause(text)
        if cause is not None and cause["signal"] in ("SIGKILL", "SIGSEGV", "SIGABRT", "SIGBUS"):
            step = beats.get(cause["rank"], (0, 0))[0]
            fault = {"rank": cause["rank"], "step": step + 1, "exc_type": cause["signal"], "signal": cause["signal"],
                     "message": f"rank {cause['rank']} was killed by {cause['signal']} in step {step + 1}; "
                                f"torch.distributed.run stopped the other ranks"}
    if fault is not None:
        summary.update(status="crashed", exit_code=exitcodes.CRASHED, crash=fault)
    elif proc.returncode != 0 and summary["exit_code"] < exitcodes.CRASHED:
        summary.update(status="crashed", exit_code=exitcodes.CRASHED,
                       crash=summary.get("crash") or {"message": f"torch.distributed.run exited {proc.returncode}; "
                                                                 f"see {out / 'launcher.log'}"})
    elapsed = time.perf_counter() - t0
    rank0 = merge.read_rank(out, 0) or {}
    summary.update(steps_requested=cfg.steps, loss_first=rank0.get("loss_first"), loss_last=rank0.get("loss_last"),
                   versions=rank0.get("versions"), peak_rss_bytes=rank0.get("peak_rss_bytes"))
    summary.update(elapsed_s=round(elapsed, 3), steps_per_s=round(summary["last_step"] / elapsed, 2) if elapsed else None,
                   nproc=nproc, inject=[{"name": i.name, "step": i.step} for i in cfg.inject])
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, out / "summary.json")
    findings = [Finding.from_dict(f) for r in range(nproc) for f in merge.read_findings(out, r)
                if r == 0 or not str(f.get("code", "")).startswith("OC70")]
    return SoakResult(summary=summary, findings=findings, exit_code=summary["exit_code"], out=out)


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _hung_rank(beats: dict[int, tuple[int, int]], world: int) -> dict:
    """The rank behind and outside forward/backward (stage 0) — the others wait in a
    collective for it; a rank without a heartbeat at all counts as step 0."""
    full = {r: beats.get(r, (0, 0)) for r in range(world)}
    rank = min(full, key=lambda r: (full[r][0] + full[r][1], full[r][1]))
    return {"rank": rank, "step": full[rank][0]}


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's session (it forwards to the ranks), SIGKILL after 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
