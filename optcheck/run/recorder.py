"""The run recorder: where a run directory is written and its ``summary.json`` filled.

Every driver of a run — the soak supervisor (``optcheck/drivers/soak.py``, fed by the
worker's socket), ``optcheck.Monitor`` (in-process), the ``--nproc`` launcher
(folding each rank's summary, :func:`fold_rank_summaries`) and ``optcheck check``
(replaying records) — writes through one :class:`RunRecorder`. It is the only
code that

* creates and locks the run directory (``optcheck.run.rundir.RunDir``: one
  writer, no silent overwrite, no symlink followed, no torn line);
* appends records: snapshots (checked by the run's one rule engine, their
  findings written after them), metrics, events;
* fills the :class:`~optcheck.run.summary.Summary` from what it recorded
  (last step, first/last loss, snapshots, peak RSS, findings, costs) plus what
  the driver adds with :meth:`RunRecorder.set`;
* writes ``summary.json`` atomically — ``running`` at the start and after each
  snapshot, the final one at :meth:`RunRecorder.finish`, from the reserve on a
  full disk;
* picks the status and the exit code (``optcheck.run.exitcodes.run_exit_code``, and
  :func:`optcheck.run.exitcodes.worst` over several runs).

A record that cannot be written (disk full, ``ulimit -f``, EIO) either raises
:class:`~optcheck.errors.RecordError` (``on_record_error="raise"``: the soak stops
its worker) or is kept in :attr:`RunRecorder.record_error` and every later write
is dropped (``"keep"``: a Monitor never raises into the user's ``optimizer.step()``);
the run then ends ``record-failed``, exit 4.

A non-finite training loss in the metrics is the finding of the rule owning
non-finite values (OC501) at its step, even between two snapshots.

Adding a field to ``summary.json``: the :class:`Summary` dataclass, filled here.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Callable

from optcheck.run import exitcodes
from optcheck.engine import RuleEngine
from optcheck.errors import RecordError
from optcheck.findings import Finding, severity_rank
from optcheck.run.rundir import FATAL_LOG, RunDir, open_record_file
from optcheck.run.sequencer import Cost
from optcheck.run.summary import Checker, Summary, run_status, utc_now

#: The rule that owns non-finite values (a NaN/inf loss in the metrics is its finding).
NONFINITE_RULE = "OC501"


class RunRecorder:
    """The one writer of a run (see the module docstring).

    Args:
        out: the run directory, or None to keep everything in memory.
        summary: the run's :class:`Summary` (its identity fields filled by the driver).
        engine: the run's one rule engine.
        append: add to the records already in ``out`` (a resumed job).
        force: replace the records of a run already in ``out``.
        report: ``report(finding)`` for every new finding, after it is written.
        checked: ``checked(snapshot)`` once the rules ran on it.
        on_record_error: "raise" (a write that fails raises RecordError) or "keep"
            (it is kept in :attr:`record_error`; later writes are dropped).
        running_summary_every: rewrite the ``running`` summary after every this many
            snapshots (1: each), so a process killed without closing leaves its last step.
        on_fill: ``on_fill(summary)`` before the summary is written: the driver sets
            what it tracks itself (a Monitor's step count, its snapshot sequencer's numbers).
        on_failure: ``on_failure(error)`` once, when the first record fails (a Monitor warns).

    Raises:
        optcheck.errors.InputError: as ``RunDir`` (busy, holds a run, symlink...).
        RecordError: the disk is full already.
    """

    def __init__(self, out: str | os.PathLike | None, summary: Summary, *, engine: RuleEngine,
                 append: bool = False, force: bool = False, report: Callable[[Finding], None] | None = None,
                 checked: Callable[[dict], None] | None = None, on_record_error: str = "raise",
                 running_summary_every: int = 1, on_fill: Callable[[Summary], None] | None = None,
                 on_failure: Callable[[RecordError], None] | None = None, reuse_hint: str = "",
                 option: str = "--out "):
        if on_record_error not in ("raise", "keep"):
            raise ValueError(f"on_record_error must be 'raise' or 'keep', got {on_record_error!r}")
        self.summary = summary
        self.engine = engine
        self.on_record_error = on_record_error
        self.on_fill, self.on_failure = on_fill, on_failure
        self.record_error: RecordError | None = None
        self.rundir = (RunDir(out, append=append, force=force, reuse_hint=reuse_hint, option=option)
                       if out is not None else None)
        if self.rundir is not None:
            summary.out = str(self.rundir.path)
        self.checker = Checker(engine, _Sink(self) if self.rundir is not None else None, report=report,
                               checked=checked)
        self.snapshot_cost = Cost()
        self.running_summary_every = max(1, int(running_summary_every))
        self.exit_code: int | None = None
        self.finished = False
        self._t0 = time.time()
        self._nonfinite_step: int | None = None
        self._detached = False
        self._fatal: tuple[int, bool] | None = None

    @property
    def path(self) -> Path | None:
        """The run directory, None in memory."""
        return self.rundir.path if self.rundir is not None else None

    # -- writing records -------------------------------------------------------
    def _write(self, fn, *args) -> None:
        if self.rundir is None or self._detached:
            return
        if self.record_error is not None:
            if self.on_record_error == "raise":
                raise self.record_error
            return
        try:
            fn(*args)
        except RecordError as e:
            self._failed(e)
            if self.on_record_error == "raise":
                raise

    def _failed(self, e: RecordError) -> None:
        if self.record_error is not None:
            return
        self.record_error = e
        if self.on_failure is not None:
            self.on_failure(e)

    def write_file(self, name: str, text: str) -> Path | None:
        """Write a whole small file (``config.json``) in the run directory."""
        if self.rundir is None:
            return None
        out: list[Path] = []
        self._write(lambda: out.append(self.rundir.write_file(name, text)))
        return out[0] if out else None

    def check(self, snap: dict, cost_s: float | None = None) -> list[Finding]:
        """Write snapshot ``snap``, run the rules on it; write, report and return the new findings.
        ``cost_s``: what taking it cost (seconds), for ``cost.snapshots``."""
        sm = self.summary
        sm.snapshots += 1
        step = snap.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            sm.last_step = max(sm.last_step, step)
        rss = (snap.get("memory") or {}).get("rss_bytes") if isinstance(snap.get("memory"), dict) else None
        if isinstance(rss, (int, float)) and not isinstance(rss, bool) and math.isfinite(rss):
            sm.peak_rss_bytes = max(sm.peak_rss_bytes or 0, int(rss))
        if seconds(cost_s) is not None:
            self.snapshot_cost.add(cost_s)
        new = self.checker.check(snap)
        if self.rundir is not None and sm.snapshots % self.running_summary_every == 0:
            self.write_running()
        return new

    def metrics(self, steps: list[int], losses: list, step_times_s: list | None = None) -> list[Finding]:
        """Append one ``metrics.jsonl`` line per step (one ``write(2)``); the first
        non-finite loss is an OC501 finding at its step. Returns the new findings."""
        if not steps:
            return []
        self._write(self.rundir.metrics if self.rundir is not None else None, steps, losses, step_times_s)
        sm = self.summary
        if sm.loss_first is None:
            sm.loss_first = losses[0]
        sm.loss_last = losses[-1]
        sm.last_step = max(sm.last_step, steps[-1])
        if self._nonfinite_step is None:
            for s, v in zip(steps, losses):
                if isinstance(v, float) and not math.isfinite(v):
                    self._nonfinite_step = s
                    return self._nonfinite_loss(s, v)
        return []

    def _nonfinite_loss(self, step: int, loss: float) -> list[Finding]:
        record = {"step": step, "phase": "post-step", "loss": loss, "params": [], "events": [],
                  "backend": self.summary.backend, "run": self.summary.run}
        new = self.engine.feed(record, only=(NONFINITE_RULE,))
        for f in new:
            self.finding(f.to_dict())
            if self.checker.report is not None:
                self.checker.report(f)
        return new

    def event(self, event: dict) -> None:
        """Append one ``events.jsonl`` record."""
        self._write(self.rundir.event if self.rundir is not None else None, event)

    def snapshot(self, snap: dict) -> None:
        """Append one ``snapshots.jsonl`` record (unchecked: :meth:`check` checks)."""
        self._write(self.rundir.snapshot if self.rundir is not None else None, snap)

    def finding(self, finding: dict) -> None:
        """Append one ``findings.jsonl`` record."""
        self._write(self.rundir.finding if self.rundir is not None else None, finding)

    @property
    def worker_log(self):
        return self.rundir.worker_log if self.rundir is not None else None

    # -- the summary -----------------------------------------------------------
    def set(self, **fields) -> None:
        """Set summary fields the driver knows (crash, versions, hazards...).

        Raises:
            AttributeError: a field ``Summary`` does not have.
        """
        for k, v in fields.items():
            if not hasattr(self.summary, k):
                raise AttributeError(f"summary.json has no field {k!r} (optcheck.run.summary.Summary)")
            setattr(self.summary, k, v)

    @property
    def findings(self) -> list[Finding]:
        return self.checker.findings

    def exit_code_now(self, *, crashed: bool = False, interrupted: bool = False) -> int:
        """The exit code the run would end with now (``optcheck.run.exitcodes``)."""
        return exitcodes.run_exit_code(crashed=crashed, interrupted=interrupted,
                                       worst_rank=self.checker.worst_rank(),
                                       fail_on_rank=severity_rank(self.summary.fail_on),
                                       record_failed=self.record_error is not None)

    def fill(self, *, status: str | None = None, crashed: bool = False, interrupted: bool = False,
             stopped: bool = False, running: bool = False, elapsed_s: float | None = None) -> dict:
        """Fill the summary's derived fields (findings, status, exit code, timing) and return it as a dict."""
        sm = self.summary
        if self.on_fill is not None:
            self.on_fill(sm)
        code = self.exit_code_now(crashed=crashed, interrupted=interrupted)
        sm.exit_code = code  # while running: what it would be now
        sm.status = status or run_status(running=running, interrupted=interrupted,
                                         record_failed=self.record_error is not None, crashed=crashed,
                                         stopped=stopped, exit_code=code)
        sm.fill_findings(self.checker)
        steps_cost, cpu = (sm.cost or {}).get("steps"), (sm.cost or {}).get("train_cpu_s")
        sm.fill_timing(time.time() - self._t0 if elapsed_s is None else elapsed_s, self.snapshot_cost,
                       self.checker.cost)
        sm.cost["steps"], sm.cost["train_cpu_s"] = steps_cost, cpu
        sm.record_error = str(self.record_error) if self.record_error else sm.record_error
        if not running:
            sm.finished = sm.finished or utc_now()
        return sm.to_dict()

    def write_running(self) -> None:
        """Rewrite ``summary.json`` with status ``running`` and what is recorded so far.
        Best effort, never raises: when it cannot be written (no inode left for its
        temporary file, a full disk) the previous one stays; the records themselves
        decide whether the run is ``record-failed``, and the final summary has the
        reserve."""
        if self.rundir is None or self.finished or self._detached:
            return
        s = self.fill(running=True)
        try:
            self.rundir.summary(s, final=False)
        except RecordError:
            pass

    def finish(self, *, crashed: bool = False, interrupted: bool = False, stopped: bool = False,
               status: str | None = None, elapsed_s: float | None = None) -> dict:
        """The final summary: status and exit code picked, ``summary.json`` written
        (from the reserve on a full disk). Sets :attr:`exit_code`; returns the summary.
        When even the reserve cannot take it, ``summary_error`` says so and the run is
        ``record-failed`` (exit 4). Never raises RecordError."""
        summary = self.fill(status=status, crashed=crashed, interrupted=interrupted, stopped=stopped,
                            elapsed_s=elapsed_s)
        self.finished = True
        self.exit_code = summary["exit_code"]
        if self.rundir is None or self._detached:
            return summary
        try:
            self.rundir.summary(summary)
        except RecordError as e:
            summary["summary_error"] = str(e)
            if self.record_error is None:
                self._failed(e)
                summary["record_error"] = str(e)
                summary["status"] = "record-failed" if status is None else status
                summary["exit_code"] = self.exit_code = self.exit_code_now(crashed=crashed, interrupted=interrupted)
        return summary

    # -- a fatal signal's stack -------------------------------------------------
    def catch_fatal_signals(self) -> None:
        """Point ``faulthandler`` at ``fatal.log`` in the run directory: a segfault,
        SIGABRT, SIGBUS or SIGFPE (a fused kernel, a native library) writes every
        thread's Python stack there before the process dies. Undone by :meth:`close`
        (``faulthandler`` back on stderr if it was on before)."""
        import faulthandler

        if self.rundir is None or self._fatal is not None:
            return
        try:
            self._fatal = (open_record_file(self.rundir.path / FATAL_LOG), faulthandler.is_enabled())
            faulthandler.enable(file=self._fatal[0], all_threads=True)
        except (OSError, ValueError, RuntimeError):
            self._fatal = None

    def _release_fatal(self) -> None:
        import faulthandler

        if self._fatal is None:
            return
        fd, was_enabled = self._fatal
        self._fatal = None
        try:
            faulthandler.disable()
            if was_enabled:
                faulthandler.enable()
            empty = os.fstat(fd).st_size == 0
            os.close(fd)
            if empty and not self._detached:
                os.unlink(self.rundir.path / FATAL_LOG)
        except (OSError, ValueError, RuntimeError):
            pass

    # -- closing ---------------------------------------------------------------
    def close(self) -> None:
        """Close the run directory's files and release its lock. Idempotent."""
        self._release_fatal()
        if self.rundir is not None and not self._detached:
            self.rundir.close()

    def discard(self) -> None:
        """Close and remove what this recorder created (a run that never started)."""
        if self.rundir is not None and not self._detached:
            self.rundir.close()
            self.rundir.discard_created()

    def detach(self) -> None:
        """In a forked child: close this process's copies of the run's files without
        touching the run (no lock file removed, no summary written; the parent owns it)."""
        if self.rundir is None or self._detached:
            return
        self._detached = True
        self._release_fatal()  # the child's stacks go where they went before (its fd copy closed, no unlink)
        self.rundir.abandon()


def seconds(value) -> float | None:
    """A duration a worker reported, when it is one: a finite number >= 0 (else None)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def step_cost(value) -> dict | None:
    """The worker's ``step_cost`` (``optcheck.run.sequencer.StepCost.to_dict``) when it has that
    shape (count, total_s, mean_us: numbers >= 0, mean_us may be None), else None."""
    if not isinstance(value, dict):
        return None
    count, total, mean = value.get("count"), value.get("total_s"), value.get("mean_us")
    if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0) or seconds(total) is None \
            or (mean is not None and seconds(mean) is None):
        return None
    return value


class _Sink:
    """What :class:`Checker` writes through: the recorder's guarded writes."""

    def __init__(self, rec: RunRecorder):
        self._rec = rec

    def snapshot(self, snap: dict) -> None:
        self._rec.snapshot(snap)

    def finding(self, finding: dict) -> None:
        self._rec.finding(finding)


def fold_rank_summaries(out: str | os.PathLike, world: int, merged: dict) -> dict:
    """Write a ``--nproc``/torchrun run's merged summary (``optcheck.distributed.merge.merged``)
    to ``out/summary.json`` as every recorder does (atomic, never through a symlink,
    ``summary_version`` and ``schema`` set; from the reserve on a full disk), with its
    exit code taken by :func:`optcheck.run.exitcodes.worst` over the ranks'. Returns it.

    Raises:
        RecordError: it could not be written.
    """
    from optcheck.run.rundir import RESERVE_NAME, write_summary

    s = dict(merged)
    codes = [r.get("exit_code") for r in s.get("ranks") or [] if isinstance(r, dict)]
    if s.get("missing_ranks"):
        codes.append(exitcodes.CRASHED)
    s["exit_code"] = exitcodes.worst(c for c in codes if isinstance(c, int))
    s.setdefault("world", world)
    try:
        write_summary(out, s)
    except RecordError:
        try:
            os.unlink(Path(out) / RESERVE_NAME)
        except OSError:
            raise
        write_summary(out, s)
    return s
