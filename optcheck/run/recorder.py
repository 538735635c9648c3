"""The run recorder: the one writer of a run directory and the one counter of its ``summary.json``.

Every driver — the soak supervisor (``optcheck/drivers/soak.py``, fed by the worker's
socket), ``optcheck.Monitor`` (in-process), ``optcheck check`` (replaying records) —
records through one :class:`RunRecorder`; a run of several ranks (``--nproc``, rank 0 of a
Monitor under torchrun) folds its ranks' summaries through one :class:`RankRecorder`. Only
they lock the run directory (``optcheck.run.rundir.RunDir``), append records (snapshots
checked by the run's one rule engine, their findings after them; metrics; events), count the
:class:`~optcheck.record.summary.Summary` from what they recorded (last step, losses,
snapshots, peak RSS, findings, costs; a driver adds only what it alone sees, with
:meth:`RunRecorder.set`, :meth:`RunRecorder.reached`), write ``summary.json`` atomically
(``running`` after each snapshot, the final one from the reserve on a full disk) and pick
the status and exit code (``optcheck.run.exitcodes``). ``docs/run-recorder.md`` has the rest.

A record that cannot be written (disk full, ``ulimit -f``, EIO) raises
:class:`~optcheck.errors.RecordError` (``on_record_error="raise"``: the soak stops its
worker) or is kept in :attr:`RunRecorder.record_error`, later writes dropped (``"keep"``:
a Monitor never raises into ``optimizer.step()``); the run ends ``record-failed``, exit 4.
A non-finite training loss in the metrics is OC501's finding at its step, even between
two snapshots.

Over 400 lines: the one writer and counter for one process and for a run of ranks (their
fold), kept together so that both count and decide status the same way.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Callable

from optcheck.engine import RuleEngine
from optcheck.errors import RecordError
from optcheck.findings import Finding, lead_time, severity_rank
from optcheck.record.check import step_number
from optcheck.record.summary import Summary, utc_now
from optcheck.run import exitcodes
from optcheck.run.checker import Checker
from optcheck.run.rundir import RunDir
from optcheck.run.sequencer import Cost, cost_dict

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
        self.recorded_to: int | None = None  # the last step reached when the first record failed
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
        self._fatal = None  # optcheck.run.fatal_log.FatalLog while open

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
        self.recorded_to = self.summary.last_step
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
        ``cost_s``: what taking it cost (seconds, a finite number >= 0), for ``cost.snapshots``."""
        sm = self.summary
        sm.snapshots += 1
        self.reached(snap.get("step"))
        rss = (snap.get("memory") or {}).get("rss_bytes") if isinstance(snap.get("memory"), dict) else None
        if isinstance(rss, (int, float)) and not isinstance(rss, bool) and math.isfinite(rss):
            sm.peak_rss_bytes = max(sm.peak_rss_bytes or 0, int(rss))
        if cost_s is not None:
            self.snapshot_cost.add(cost_s)
        new = self.checker.check(snap)
        if self.rundir is not None and sm.snapshots % self.running_summary_every == 0:
            self.write_running()
        return new

    def reached(self, step: int) -> None:
        """The driver saw the run reach optimizer step ``step`` (steps without a loss or a
        snapshot count too: ``last_step`` is the furthest step reported, recorded or checked).
        A value that is no step number (not a whole number in 0..2**63-1: a damaged worker
        message) is passed over, so the summary never holds what its readers refuse."""
        step = step_number(step)
        if step is not None:
            self.summary.last_step = max(self.summary.last_step, step)

    def resume(self, *, step: int, snapshots: int, loss_first: float | None) -> None:
        """Count on from a resumed run's numbers (``optcheck.Monitor(state=...)``): its steps,
        snapshots and first loss."""
        sm = self.summary
        sm.last_step, sm.snapshots = max(sm.last_step, step), max(sm.snapshots, snapshots)
        sm.loss_first = sm.loss_first if loss_first is None else loss_first

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
        self.reached(steps[-1])
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
                raise AttributeError(f"summary.json has no field {k!r} (optcheck.record.summary.Summary)")
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
        sm.status = status or exitcodes.run_status(running=running, interrupted=interrupted,
                                                   record_failed=self.record_error is not None, crashed=crashed,
                                                   stopped=stopped, exit_code=code)
        fs = self.checker.findings
        by_code: dict[str, int] = {}
        for f in fs:
            by_code[f.code] = by_code.get(f.code, 0) + 1
        sm.findings, sm.findings_by_code = len(fs), by_code
        sm.suppressed = self.engine.suppressed_by_code()
        sm.first_finding = fs[0].to_dict() if fs else None
        sm.lead_time = lead_time([f.to_dict() for f in fs], sm.crash)
        elapsed = time.time() - self._t0 if elapsed_s is None else elapsed_s
        sm.elapsed_s = round(elapsed, 3)
        sm.steps_per_s = round(sm.last_step / elapsed, 2) if elapsed else None
        old = sm.cost or {}  # steps and train CPU: what the driver set
        sm.cost = {**cost_dict(self.snapshot_cost, self.checker.cost), "steps": old.get("steps"),
                   "train_cpu_s": old.get("train_cpu_s"),
                   **{k: v for k, v in old.items() if k not in ("snapshots", "checks", "steps", "train_cpu_s")}}
        # where the records stop: a Monitor trains on after it (recorded in memory), so last_step says nothing
        sm.record_error = (f"{self.record_error}; nothing recorded after step {self.recorded_to}"
                           if self.record_error else sm.record_error)
        if not running:
            sm.finished = sm.finished or utc_now()
        return sm.to_dict()

    def write_running(self, *, first: bool = False) -> None:
        """Rewrite ``summary.json`` with status ``running`` and what is recorded so far.
        Best effort, never raises: when it cannot be written (no inode left for its
        temporary file, a full disk) the previous one stays; the records themselves
        decide whether the run is ``record-failed``, and the final summary has the
        reserve. ``first``: the soak's first one, before its worker starts: RecordError
        is raised then (nothing is started on a disk that takes no summary)."""
        if self.rundir is None or self.finished or self._detached:
            return
        s = self.fill(running=True)
        try:
            self.rundir.summary(s, final=False)
        except RecordError:
            if first:
                raise

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
                summary["record_error"] = f"{e}; nothing recorded after step {self.recorded_to}"
                summary["status"] = "record-failed" if status is None else status
                summary["exit_code"] = self.exit_code = self.exit_code_now(crashed=crashed, interrupted=interrupted)
        return summary

    # -- a fatal signal's stack -------------------------------------------------
    def catch_fatal_signals(self) -> None:
        """Point ``faulthandler`` at ``fatal.log`` in the run directory (``optcheck.run.fatal_log``):
        a segfault, SIGABRT, SIGBUS or SIGFPE (a fused kernel, a native library) writes every
        thread's Python stack there before the process dies. Undone by :meth:`close`."""
        from optcheck.run.fatal_log import FatalLog

        if self.rundir is not None and self._fatal is None:
            self._fatal = FatalLog(self.rundir.path)

    def _release_fatal(self) -> None:
        if self._fatal is not None:
            self._fatal.release(remove_empty=not self._detached)
            self._fatal = None

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


class _Sink:
    """What :class:`Checker` writes through: the recorder's guarded writes."""

    def __init__(self, rec: RunRecorder):
        self._rec = rec

    def snapshot(self, snap: dict) -> None:
        self._rec.snapshot(snap)

    def finding(self, finding: dict) -> None:
        self._rec.finding(finding)


class RankRecorder:
    """The recorder of a run of several ranks (``optcheck soak --nproc``, a Monitor under
    ``torchrun``): the only writer of ``OUT/summary.json`` there, and, through
    :func:`optcheck.run.rank_fold.fold_ranks`, the only counter of its numbers (each rank's
    own run directory ``OUT/rank-K`` has its :class:`RunRecorder`).

    Args:
        out: the run directory holding ``rank-0`` .. ``rank-(world-1)``.
        source: "soak" (the ``--nproc`` supervisor) or "monitor" (rank 0 at its close).
        knock_on: ``knock_on(crash) -> bool``: a crash a peer's end caused (a collective's
            "Connection closed by peer"), so that a rank's own exception is named first.
    """

    def __init__(self, out: str | os.PathLike, *, source: str, knock_on: Callable[[dict], bool] | None = None):
        self.out, self.source, self.knock_on = Path(out), source, knock_on

    def write_running(self, summary: dict) -> None:
        """The supervisor's first ``summary.json`` (status ``running``). Raises RecordError."""
        self._write(summary)

    def fold(self, ranks: list[dict | None], findings: list[dict], notes: list[str], *, attempts: int = 1,
             **supervisor) -> dict:
        """Count the merged summary (:func:`optcheck.run.rank_fold.fold_ranks`, ``supervisor`` its
        keyword arguments), write it atomically (from the reserve on a full disk) and return it.
        ``attempts`` > 1: tried that many times (a full disk may free up as another rank's fold
        takes the reserve), then the last error is told on stderr, in one line naming the file, and
        the counted summary returned (never dropped silently; never raised into the user's loop);
        with 1, RecordError is raised."""
        from optcheck.run.rank_fold import fold_ranks

        s = fold_ranks(ranks, findings, notes, out=self.out, source=self.source, knock_on=self.knock_on, **supervisor)
        for attempt in range(1, attempts + 1):
            try:
                self._write(s)
                return s
            except RecordError as e:
                if attempts == 1:
                    raise
                if attempt == attempts:
                    try:
                        sys.stderr.write(f"optcheck: the ranks' summary was not written ({attempts} tries): {e}\n")
                    except (OSError, ValueError):
                        pass
                else:
                    time.sleep(0.05 * attempt)
        return s

    def _write(self, s: dict) -> None:
        from optcheck.run.rundir import RESERVE_NAME, write_summary

        try:
            write_summary(self.out, s)
        except RecordError:
            try:
                os.unlink(self.out / RESERVE_NAME)  # the reserve set aside for the last summary
            except FileNotFoundError:  # another rank's fold took it (ranks fold OUT's summary in turn)
                pass
            write_summary(self.out, s)  # a RecordError again: fold() tries again
