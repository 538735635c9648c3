"""The one sequencer of a run: when a snapshot is taken, and what goes into it. Torch-free.

Both drivers of a run use it: the soak worker loop (``optcheck/drivers/worker_loop.py``,
one process per backend, PyTorch or TorchSharp) and ``optcheck.Monitor``
(``optcheck/drivers/monitor.py``, inside the user's own PyTorch loop). The order it
keeps, per optimizer step ``n`` (1-based):

1. **pre-step check** (:meth:`Sequencer.pre_step`): the probe's fingerprint —
   parameter and optimizer-member identities, data pointers, eager state keys,
   a few µs — against the one taken with the last snapshot; when it changed, a
   snapshot ``phase="pre-step", trigger="check"`` at step ``n`` *before* the
   step runs, so a finding names the cause at the step it happened;
2. the step itself (the driver's);
3. **post-step** (:meth:`Sequencer.post_step`): a hazard probe that recorded
   events forces a snapshot ``trigger="hazard"``; otherwise every ``every``
   steps ``trigger="cadence"``, and ``trigger="final"`` at the last step;
4. a hazard that stops a step (:meth:`Sequencer.stopped`): a snapshot
   ``phase="pre-step", trigger="hazard"`` carrying the event.

:meth:`Sequencer.take` is the one place a snapshot is built (hook it to add
per-rank fields); it hands the snapshot to the driver's ``emit`` (the worker
sends it to the supervisor, the Monitor checks and writes it:
:class:`optcheck.run.checker.Checker`). What a run cost — seconds spent in
snapshots and in rule checks — is counted in :class:`Cost`, optcheck's own
work per step outside snapshots in :class:`StepCost`; both land in
``summary.json``'s ``cost`` (``docs/summary.md``).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Protocol

from optcheck.record.snapshot import assemble


class Cost:
    """Wall-clock seconds of one kind of work (snapshots, rule checks), one entry per call."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def add(self, seconds: float) -> None:
        self.seconds.append(float(seconds))

    def to_dict(self) -> dict:
        """``{"count", "total_s", "median_s"}`` (seconds; median None when count is 0)."""
        s = self.seconds
        return {"count": len(s), "total_s": round(sum(s), 6),
                "median_s": round(statistics.median(s), 6) if s else None}


class StepCost:
    """optcheck's own per-step work outside snapshots and rule checks, summed in
    nanoseconds (two integers however long the run: no entry per step).

    What a driver times is its own Python code at each step: the pre-step check,
    the post-step bookkeeping and, for a Monitor, the ``backward`` wrapper. The
    per-parameter gradient hooks (``optcheck/pytorch/grad_clear.py``) and the
    optimizer step hooks' dispatch run inside PyTorch and are not timed here
    (timing them would cost about what they do): ``benchmarks/bench_soak.py``
    measures the whole overhead against a loop without optcheck.
    """

    __slots__ = ("ns", "steps")

    def __init__(self) -> None:
        self.ns = 0
        self.steps = 0

    def to_dict(self) -> dict:
        """``{"count": steps, "total_s": seconds, "mean_us": µs per step or None}``."""
        return {"count": self.steps, "total_s": round(self.ns / 1e9, 6),
                "mean_us": round(self.ns / self.steps / 1e3, 2) if self.steps else None}


#: Training steps per block of :class:`CpuBlocks` (the speed check's unit, ``optcheck.judge.baseline``).
CPU_BLOCK_STEPS = 10
#: Most blocks a run keeps: at this many, neighbours are averaged in pairs and blocks are twice as long.
MAX_CPU_BLOCKS = 200


class CpuBlocks:
    """The process's CPU time per training step, block by block (at least :data:`CPU_BLOCK_STEPS`
    steps each, snapshots included): what the speed check compares, with the spread of the blocks
    as its noise (``optcheck.judge.baseline.speed_check``). One ``time.process_time()`` per block;
    at most :data:`MAX_CPU_BLOCKS` kept however long the run (longer blocks then).
    """

    def __init__(self, steps: int = CPU_BLOCK_STEPS) -> None:
        self.size = steps
        self.per_step_s: list[float] = []  # CPU seconds per step of each block
        self._t = time.process_time()
        self._step = 0

    def tick(self, step: int) -> None:
        """Step ``step`` (1-based; a block of the TorchSharp backend may advance several) is done."""
        if step - self._step >= self.size:
            now = time.process_time()
            self.per_step_s.append(round((now - self._t) / (step - self._step), 7))
            self._t, self._step = now, step
            if len(self.per_step_s) >= MAX_CPU_BLOCKS:
                b = self.per_step_s
                self.per_step_s = [round((b[i] + b[i + 1]) / 2, 7) for i in range(0, len(b) - 1, 2)]
                self.size *= 2


class StepTimer:
    """The clock of a soak loop's steps (``optcheck/drivers/worker_loop.py``), in one place:
    optcheck's own work per step (:attr:`cost`, a :class:`StepCost`: the pre-step check and the
    bookkeeping after the step, snapshots left out), each step's training time (the metrics'
    ``step_time_s``) and the CPU time per block (:attr:`blocks`, :class:`CpuBlocks`).

    Per step: :meth:`start`, :meth:`checked` (the pre-step check is done), :meth:`train` /
    :meth:`trained` around the training (:meth:`also_training` around other training work, a
    held-out pass), :meth:`end`.
    """

    def __init__(self, seq: "Sequencer") -> None:
        self.seq, self.cost, self.blocks = seq, StepCost(), CpuBlocks()
        self._t0 = self._t1 = self._ts = self._te = self._busy = 0

    def start(self) -> None:
        self._t0, self._busy = time.perf_counter_ns(), self.seq.busy_ns

    def checked(self) -> None:
        self._t1 = time.perf_counter_ns()

    def train(self) -> None:
        self._ts = time.perf_counter_ns()

    def trained(self) -> float:
        """The training's seconds since :meth:`train` (a step's ``step_time_s``)."""
        self._te = time.perf_counter_ns()
        return round((self._te - self._ts) / 1e9, 6)

    @contextlib.contextmanager
    def also_training(self):
        """Time inside counts as training, not as optcheck's own work."""
        t = time.perf_counter_ns()
        try:
            yield
        finally:
            self._te += time.perf_counter_ns() - t

    def end(self, first: int, step: int) -> None:
        """Steps ``first``..``step`` are done (a block's steps each count)."""
        now = time.perf_counter_ns()
        self.cost.ns += (self._t1 - self._t0) + (now - self._te) - (self.seq.busy_ns - self._busy)
        self.cost.steps += step - first + 1
        self.blocks.tick(step)


def cost_dict(snapshots: Cost, checks: Cost) -> dict:
    """The summary's ``cost``: ``{"snapshots": {...}, "checks": {...}}``, each :meth:`Cost.to_dict`."""
    return {"snapshots": snapshots.to_dict(), "checks": checks.to_dict()}


class Probe(Protocol):
    """What the sequencer needs from a backend (``optcheck.run.backend.Backend`` has it)."""

    name: str

    def fingerprint(self) -> Any:
        """A cheap, comparable value that changes when parameters or optimizer members change identity."""

    def snapshot_body(self) -> dict:
        """params, groups, state, optimizer, memory, events (drained), notes."""

    def versions(self) -> dict[str, str]:
        """Library versions for the snapshot."""

    def threads(self) -> int:
        """Intra-op threads in use."""


class Sequencer:
    """Cadence, pre-step check, hazard-forced and final snapshots of one run.

    Args:
        probe: the backend (:class:`Probe`).
        run_id: the snapshots' ``run``.
        every: a cadence snapshot every this many optimizer steps (≥ 1).
        emit: ``emit(snapshot, seconds)`` gets every snapshot and the seconds its
            body took; its return value is what :meth:`take` returns.
        flush: called first thing in :meth:`take` (send or write the losses
            held so far, so they precede the snapshot and set :attr:`last_loss`).
        step: the step the run starts after (a resumed Monitor), 0 otherwise.

    It counts nothing the summary reports (snapshots, losses, peak RSS, their cost): the
    run's recorder counts those from what ``emit`` hands it (``optcheck.run.recorder``).
    """

    def __init__(self, probe: Probe, *, run_id: str, every: int, emit: Callable[[dict, float], Any],
                 flush: Callable[[], None] | None = None, step: int = 0):
        self.probe, self.run_id, self.every, self.emit, self.flush = probe, run_id, every, emit, flush
        self.t0 = self.last_snap_t = time.perf_counter()
        self.last_snap_step = step
        self.last_loss: float | None = None  # the loss the next snapshot carries
        self.val_loss: float | None = None   # held-out loss not yet put in a snapshot
        self.pending_events: list[dict] = []
        self.busy_ns = 0  # nanoseconds inside take(), emit included: what a driver's StepCost leaves out
        self._fp: Any = None

    # -- bookkeeping the driver feeds ------------------------------------------
    def event(self, event: dict) -> None:
        """An event (schema-1 ``events`` item) for the next snapshot."""
        self.pending_events.append(event)

    def loss(self, value: float) -> None:
        """The loss of the step just taken (the next snapshot carries it)."""
        self.last_loss = value

    def restart_clock(self) -> None:
        """``elapsed_s`` counts from now (the soak: training, not set-up)."""
        self.t0 = self.last_snap_t = time.perf_counter()

    # -- the sequence -------------------------------------------------------------
    def start(self, step: int = 0) -> Any:
        """The snapshot before anything trains (``trigger="start"``)."""
        return self.take(step, "pre-step", "start")

    def changed(self) -> bool:
        """The pre-step check: True when the fingerprint moved since the last snapshot."""
        return self.probe.fingerprint() != self._fp

    @property
    def reference(self) -> Any:
        """The fingerprint the pre-step check compares against (taken with the last snapshot; None before it)."""
        return self._fp

    def pre_step(self, step: int) -> tuple[bool, Any]:
        """Before step ``step`` runs: ``(True, emit's result)`` when the check fired a snapshot."""
        if self.changed():
            return True, self.take(step, "pre-step", "check")
        return False, None

    def post_step(self, step: int, *, hazard: bool, last: bool = False) -> tuple[bool, Any]:
        """After step ``step``: a hazard, cadence or final snapshot when one is due;
        ``(taken, emit's result)``."""
        if hazard:
            return True, self.take(step, "post-step", "hazard")
        if step % self.every == 0 or last:
            return True, self.take(step, "post-step", "final" if last else "cadence")
        return False, None

    def stopped(self, step: int, event: dict) -> Any:
        """A hazard stopped step ``step`` before harm was done: a snapshot with its event."""
        self.event(event)
        return self.take(step, "pre-step", "hazard")

    def final(self, step: int) -> Any:
        """The closing snapshot (``trigger="final"``) of a run that ended between cadences."""
        return self.take(step, "post-step", "final")

    def take(self, step: int, phase: str, trigger: str) -> Any:
        """Build snapshot ``step``/``phase``/``trigger`` and hand it to ``emit`` — the one
        place a snapshot is made."""
        t_in = time.perf_counter_ns()
        try:
            if self.flush is not None:
                self.flush()
            t = time.perf_counter()
            body = self.probe.snapshot_body()
            events, self.pending_events = self.pending_events, []
            n = step - self.last_snap_step
            snap = assemble(backend=self.probe.name, run=self.run_id, step=step, phase=phase, trigger=trigger,
                            body=body, events=events, loss=None if trigger == "start" else self.last_loss,
                            val_loss=self.val_loss, elapsed_s=t - self.t0,
                            step_time_s=(t - self.last_snap_t) / n if n > 0 else None,
                            versions=self.probe.versions(), threads=self.probe.threads())
            self._fp = self.probe.fingerprint()
            seconds = time.perf_counter() - t
            self.val_loss = None
            self.last_snap_t, self.last_snap_step = t, step
            return self.emit(snap, seconds)
        finally:
            self.busy_ns += time.perf_counter_ns() - t_in
