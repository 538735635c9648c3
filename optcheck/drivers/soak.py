"""The supervisor: runs one soak in a worker subprocess, reads its stream, applies
the rules as snapshots arrive and writes the run directory. Torch-free.

The worker is ``python -m optcheck.<backend>.worker --config FILE --stream-fd N``
in a new session (so a Ctrl-C reaches optcheck, which then stops the worker
cleanly: ``optcheck.drivers.watch``; a second signal kills it). A crash of the worker —
an exception, SIGKILL, SIGABRT from .NET's ``Environment.FailFast``, a segfault
in libtorch — or no step for ``--step-timeout`` seconds ends the run with exit
code 3 and leaves every line written so far readable
(``optcheck.run.rundir``). A run directory that stops taking writes (disk
full) stops the worker and ends the run with exit code 4 (``optcheck.run.exitcodes``).
Over 400 lines: the supervisor's every exit path (clean, findings, crash, hang, signal, record failure) writes the same summary; kept together so no path is missed.
"""

from __future__ import annotations

import collections
import datetime as _dt
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from optcheck.run import exitcodes
from optcheck import scenarios as scenario_catalogue
from optcheck.config import SoakConfig
from optcheck.data import load_corpus
from optcheck.engine import RuleEngine
from optcheck.errors import InputError, RecordError
from optcheck.findings import Finding, severity_rank
from optcheck.drivers.protocol import read_messages, seconds, send_verdict, step_cost
from optcheck.run.recorder import RunRecorder
from optcheck.run.rundir import check_space
from optcheck.rules import RuleConfig, warm_up
from optcheck.drivers.worker_process import (STDERR_TAIL_LINES, WORKER_MODULES, Progress, drain_stderr, signal_name,
                                      worker_command, worker_env)
from optcheck.record.summary import Summary
from optcheck.drivers.watch import GRACE_S, Signals, Watchdog

@dataclass
class SoakResult:
    """What :func:`run_soak` returns.

    Attributes:
        summary: the ``summary.json`` content.
        findings: every finding, in order.
        exit_code: per ``optcheck.run.exitcodes``.
        out: the run directory.
    """

    summary: dict
    findings: list[Finding]
    exit_code: int
    out: Path


@dataclass
class _State:
    """What the supervisor keeps of the worker's messages (the records are the recorder's)."""

    hello: dict = field(default_factory=dict)
    crash: dict | None = None
    stopped: dict | None = None
    done: dict | None = None
    garbled: int = 0
    hazards: dict | None = None


def default_out_dir() -> Path:
    """``runs/<UTC timestamp>`` under the current directory."""
    return Path("runs") / _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")


def validate(cfg: SoakConfig) -> dict:
    """Check everything the user gave before anything runs; returns the corpus description.

    Raises:
        InputError: bad option value, unknown scenario, missing/empty/corrupt data.
    """
    if cfg.run.backend not in WORKER_MODULES:
        raise InputError(f"--backend {cfg.run.backend!r}: one of {', '.join(WORKER_MODULES)}")
    cfg.validate()
    for inj in cfg.checks.inject:
        scenario_catalogue.get(inj.name, cfg.run.backend)
    python = cfg.run.python
    if python is not None and not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise InputError(f"--python {python}: not an executable file (give a venv's bin/python)")
    if cfg.run.backend == "pytorch":
        from optcheck import torch_version

        if python is None:
            torch_version.require()  # torch >= 2.1, read from its metadata: torch is not imported here
        else:
            _require_torch_in(python)
    ts = cfg.torchsharp
    if cfg.run.backend == "torchsharp" and not ts.assembly:
        # builds (or reuses) the TorchSharp worker for --torchsharp VERSION|PATH; InputError names the fix
        from optcheck.torchsharp_bridge.build import built_worker

        ts.version, ts.assembly, ts.trainer = built_worker(ts.version)
    corpus = load_corpus(cfg.data.path, cfg.model.vocab_size)
    if corpus.train.size <= cfg.model.block_size + 1 or corpus.val.size <= cfg.model.block_size + 1:
        raise InputError(f"--data {corpus.source}: too short for --block-size {cfg.model.block_size}")
    return corpus.describe()


_TORCH_PROBE = ("import importlib.util, json, sys\n"
                "try:\n    from importlib.metadata import version; v = version('torch')\n"
                "except Exception:\n    v = None\n"
                "print(json.dumps([v, importlib.util.find_spec('torch') is not None, sys.version_info[:2]]))")


def _require_torch_in(python: str) -> None:
    """Check that interpreter ``python`` (``--python``) has a torch the PyTorch worker can
    run, before anything runs: its metadata and ``find_spec``, torch not imported.

    Raises:
        InputError: not a Python interpreter, no torch, or a torch too old (one line).
    """
    import json

    from optcheck import torch_version

    try:
        res = subprocess.run([python, "-I", "-c", _TORCH_PROBE], capture_output=True, text=True, errors="replace",
                             timeout=120, stdin=subprocess.DEVNULL)
        version, importable, _ = json.loads(res.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, TypeError) as e:
        why = (getattr(e, "strerror", None) or "it does not run as a Python interpreter")
        raise InputError(f"--python {python}: {why} (give a venv's bin/python)") from None
    problem = torch_version.problem(version, bool(importable))
    if problem:
        raise InputError(f"--python {python}: {problem.replace('--backend pytorch needs', 'the worker needs')}")


def estimate_bytes(cfg: SoakConfig) -> int:
    """What a soak of ``cfg`` writes to its run directory, roughly (bytes): ~75 per
    metrics line and ~0.65 KB per parameter tensor per snapshot (measured on the
    built-in GPT: 4 + 12 x n_layer tensors)."""
    tensors = 4 + 12 * cfg.model.n_layer
    snapshots = cfg.run.steps // cfg.run.every + 2 + 2 * len(cfg.checks.inject)
    return cfg.run.steps * 75 + snapshots * (2_000 + 650 * tensors) + 64 * 1024


def run_soak(cfg: SoakConfig, out: str | os.PathLike | None = None, *, fail_on: str = "warning",
             rule_config: RuleConfig | None = None, progress: bool = True,
             on_finding=None, force: bool = False, signals: Signals | None = None,
             ignore: list | None = None) -> SoakResult:
    """Run a soak to the end (or crash, or interrupt) and write the run directory.

    Args:
        cfg: the soak configuration (validated here, before anything is created).
        out: run directory (default: ``runs/<timestamp>``).
        fail_on: lowest severity that makes the exit code 1 ("info" | "warning" | "error").
        rule_config: rule knobs (memory budget, grad-starved window...).
        progress: show a progress bar on stderr.
        on_finding: optional callback ``f(Finding)`` called as each finding arrives.
        force: replace a run already in ``out``.
        signals: handlers already installed by the caller (the command line, or
            :func:`run_backends` for all its runs); default: installed for this
            run and restored after it. Once one has been received no worker is
            started.
        ignore: accepted findings (``optcheck.suppress.resolve``): counted in the
            summary's ``suppressed``, not in ``findings`` nor the exit code.

    Returns:
        The result; ``exit_code`` 4 (``summary["status"] == "record-failed"``,
        ``summary["record_error"]`` the line) when the run directory stopped
        taking writes: the worker was stopped then.

    Raises:
        InputError: bad input (nothing is run, no run directory is left behind).
        RecordError: ``out`` has no room for a run at all (nothing is run).
    """
    fail_rank = severity_rank(fail_on)
    with signals or Signals() as sig:  # before anything is spawned: no signal is lost
        corpus = validate(cfg)
        out = Path(out) if out is not None else default_out_dir()
        warning = check_space(out, estimate_bytes(cfg))
        if warning:
            print(f"optcheck: warning: {warning}", file=sys.stderr)
        cfg.run.run_id = cfg.run.run_id or out.name
        base = Summary(run=cfg.run.run_id, backend=cfg.run.backend, source="soak", fail_on=fail_on,
                       steps_requested=cfg.run.steps, corpus=corpus,
                       config={k: v for k, v in cfg.to_wire().items() if k != "inject"},
                       inject=[f"{i.name}@{i.step}" for i in cfg.checks.inject], out=str(out))
        bar = Progress(cfg.run.steps, progress and not sig.count, f"soak {cfg.run.backend}")
        # the run's one rule engine (ignore: accepted findings, optcheck.suppress); the worker runs none
        rec = RunRecorder(out, base, engine=RuleEngine(rule_config, ignore=ignore), force=force,
                          report=lambda f: _report(f, bar, on_finding))
        try:
            return _supervise(cfg, out, rec, bar, sig)
        finally:
            bar.close()
            rec.close()


def _supervise(cfg: SoakConfig, out: Path, rec: RunRecorder, bar: Progress, sig: Signals) -> SoakResult:
    work = out / "work"
    if work.is_symlink():
        raise InputError(f"{work}: is a symbolic link; optcheck never writes through one (remove it)")
    st = _State()
    base = rec.summary
    record_error: RecordError | None = None
    proc = None
    tail: collections.deque = collections.deque(maxlen=STDERR_TAIL_LINES)
    watchdog = None
    try:
        work.mkdir(exist_ok=True)
        cfg.run.work_dir = str(work)
        config_path = rec.write_file("config.json", cfg.to_json())
        base.config["work_dir"] = cfg.run.work_dir
        rec.write_running(first=True)
    except RecordError as e:
        record_error = e
    except OSError as e:
        record_error = RecordError(work, e)
    if record_error is None and not sig.count:
        ours, theirs = socket.socketpair()  # the stream, and the verdicts back (optcheck/drivers/protocol.py)
        w = theirs.fileno()
        env = worker_env(cfg)
        try:
            proc = subprocess.Popen(worker_command(cfg, config_path, w), pass_fds=(w,), stdin=subprocess.DEVNULL,
                                    stdout=rec.worker_log, stderr=subprocess.PIPE, env=env,
                                    start_new_session=True)
        finally:
            theirs.close()
        sig.attach(proc)
        threading.Thread(target=warm_up, name="optcheck-warm-up", daemon=True).start()  # while the worker starts
        err_thread = threading.Thread(target=drain_stderr, args=(proc.stderr, rec.worker_log, tail), daemon=True)
        err_thread.start()
        watchdog = Watchdog(proc, sig, cfg.run.step_timeout_s)
        watchdog.start()
        try:
            with ours, os.fdopen(os.dup(ours.fileno()), encoding="utf-8", errors="replace") as stream:
                for msg in read_messages(stream):
                    watchdog.progress()
                    if msg["type"] == "hello":
                        watchdog.started()
                    stop = None
                    try:
                        with watchdog.paused():  # the supervisor's time is not the worker's silence
                            stop = _handle(msg, st, rec, bar)
                        if msg["type"] in ("done", "stopped", "crash"):
                            watchdog.finished()
                    except RecordError as e:  # the disk is full: stop the worker, keep reading to its end
                        if record_error is None:
                            record_error = e
                            watchdog.request_stop()
                    finally:
                        if msg.get("verdict"):  # the worker waits for it (--stop-on-finding)
                            send_verdict(ours, stop)
            try:
                returncode = proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:  # it closed the pipe but does not exit
                proc.kill()
                returncode = proc.wait()
        finally:
            watchdog.stop()
            bar.close()
        err_thread.join(timeout=5)
    else:
        bar.close()
        returncode = None
    interrupted = bool(sig.count)

    crashed = False
    hung = watchdog is not None and watchdog.hung_after is not None
    if proc is not None and (hung or (not interrupted and record_error is None and st.done is None
                                      and st.stopped is None)):
        crashed = True
        crash = dict(st.crash or {})
        crash.setdefault("step", base.last_step)
        crash["exit_code"] = returncode
        crash["signal"] = signal_name(returncode)
        if hung:
            crash["exc_type"] = "StepTimeout"
            crash["message"] = (f"no step for {watchdog.hung_after:.0f} s after step {base.last_step} "
                                f"(--step-timeout {cfg.run.step_timeout_s:g}): the worker was killed")
        elif not st.crash:
            crash["exc_type"] = crash["signal"] or f"exit code {returncode}"
            crash["message"] = "the worker died without reporting an exception"
        crash["stderr_tail"] = list(tail)
        st.crash = crash
        if crash.get("input_error") and not st.hello:  # the run never started: leave nothing behind
            rec.discard()
            raise InputError(crash["message"])
        try:
            rec.event({"kind": "crash", **{k: v for k, v in crash.items() if k != "stderr_tail"}})
        except RecordError as e:
            record_error = record_error or e
    done = st.done or {}
    if record_error is not None:
        rec.record_error = rec.record_error or record_error
    cost = dict(base.cost)
    cost["steps"], cost["train_cpu_s"] = step_cost(done.get("step_cost")), seconds(done.get("train_cpu_s"))
    blocks = [seconds(v) for v in done.get("train_cpu_block_s") or []]
    cost["train_cpu_block_s"] = blocks if blocks and None not in blocks else None
    rec.set(crash=st.crash, stopped=st.stopped, hazards=st.hazards, cost=cost,
            versions=st.hello.get("versions") or {}, threads=st.hello.get("threads"),
            interrupted_by=sig.name, signals=sig.count, garbled_lines=st.garbled,
            **{k: done.get(k) for k in ("val_loss_first", "val_loss_last", "val_step_first", "val_step_last")})
    summary = rec.finish(crashed=crashed, interrupted=interrupted, stopped=st.stopped is not None)
    return SoakResult(summary, rec.findings, summary["exit_code"], out)


def _handle(msg: dict, st: _State, rec: RunRecorder, bar: Progress) -> str | None:
    """Record one worker message (decoded by ``optcheck.drivers.protocol.read_messages``: its
    numbers are numbers, non-finite ones floats); for a snapshot, check it. Returns the
    reason to stop the worker (``--stop-on-finding``: the first new finding of a
    snapshot that asks a verdict).

    Raises:
        RecordError: the run directory stopped taking writes.
    """
    kind = msg["type"]
    if kind == "metrics":
        rec.metrics(msg["steps"], msg["losses"], msg["step_times_s"])  # the worker's batch: one write(2)
        if msg["steps"]:
            bar.update(rec.summary.last_step, rec.summary.loss_last, len(rec.findings))
    elif kind == "snapshot":
        snap = msg["snapshot"]
        new = rec.check(snap, seconds(msg.get("cost_s")))
        if new and msg.get("verdict"):
            return f"{new[0].code} {new[0].symbol} before step {snap.get('step')} (--stop-on-finding)"
    elif kind == "lifecycle":
        rec.event({"kind": msg.get("kind"), "step": msg.get("step"), **(msg.get("detail") or {})})
    elif kind == "hello":
        st.hello = msg
        rec.event({"kind": "hello", **{k: v for k, v in msg.items() if k != "type"}})
    elif kind == "crash":
        st.crash = {k: v for k, v in msg.items() if k != "type"}
    elif kind == "stopped":
        st.hazards = msg.get("hazards")
        st.stopped = {k: v for k, v in msg.items() if k not in ("type", "hazards")}
        rec.reached(msg.get("step"))
        rec.event({"kind": "stopped", **st.stopped})
    elif kind == "done":
        st.done = msg
        st.hazards = msg.get("hazards")
        rec.reached(msg.get("step"))
        bar.update(rec.summary.last_step, rec.summary.loss_last, len(rec.findings))
    elif kind == "garbled":
        st.garbled += 1
    return None


def _report(f: Finding, bar: Progress, on_finding) -> None:
    bar.write(f"step {f.step} ({f.phase}) {f.code} {f.symbol} [{f.severity}]: {f.message}")
    if on_finding is not None:
        on_finding(f)


def export_same_init(cfg: SoakConfig, out: Path) -> Path:
    """Export the PyTorch GPT's initial weights for ``cfg`` into ``out/init`` (in a
    subprocess: it imports torch, the supervisor never does) for the TorchSharp
    worker's ``--same-init``.

    Raises:
        InputError: the export failed (its last stderr line is in the message).
    """
    init = out / "init"
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "init-config.json"
    cfg_path.write_text(cfg.to_json())
    proc = subprocess.run([sys.executable, "-m", "optcheck.pytorch.export_init", "--config", str(cfg_path),
                           "--out", str(init)], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"--same-init: exporting the PyTorch initial weights failed: {last}")
    return init


def run_backends(cfg: SoakConfig, backends: list[str], out: str | os.PathLike | None, *, same_init: bool = False,
                 **kwargs) -> tuple[list[SoakResult], int]:
    """Run the same soak on several backends, one after the other, into ``out/<backend>``.

    With ``same_init`` the TorchSharp worker starts from the PyTorch GPT's initial
    weights, and both read the same batches (same ``--seed``), so their loss
    trajectories can be compared step by step (``optcheck compare``).

    Returns the results and the worst exit code (crash > findings > clean).
    Raises InputError as :func:`run_soak`.
    """
    out = Path(out) if out is not None else default_out_dir()
    for b in backends:  # validate every backend before running any
        validate(_for_backend(cfg, b))
    init = export_same_init(cfg, out) if same_init else None
    results = []
    with kwargs.pop("signals", None) or Signals() as sig:  # an interrupt stops the runs still to come too
        for b in backends:
            c = _for_backend(cfg, b)
            if init is not None and b == "torchsharp":
                c.torchsharp.same_init = str(init)
            c.run.run_id = f"{out.name}-{b}"
            results.append(run_soak(c, out / b, signals=sig, **kwargs))
    return results, exitcodes.worst(r.exit_code for r in results)


def _for_backend(cfg: SoakConfig, backend: str) -> SoakConfig:
    c = cfg.copy()
    c.run.backend = backend
    return c
