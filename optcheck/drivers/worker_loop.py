"""The soak loop every worker runs, whatever its backend. Torch-free.

A worker process is ``python -m optcheck.pytorch.worker`` or
``python -m optcheck.torchsharp_bridge.worker``; each builds a :class:`Backend`
and calls :func:`run`. The loop drives the run's one sequencer (``optcheck/run/sequencer.py``, shared with
``optcheck.Monitor``):

1. load the corpus; build model and optimizer (``Backend.setup``);
2. for every step: injections and lifecycle events due at this step; the
   **pre-step check** (``Backend.fingerprint``: refs, data pointers and, where
   the optimizer creates state eagerly, state keys — a few µs); if it changed
   since the last snapshot, a snapshot (``phase="pre-step"``,
   ``trigger="check"``) *before* the step runs, so a finding names the cause at
   the step it happened, ahead of whatever the step then throws;
3. the training step; hazard events force a snapshot at once. A backend with blocks
   (TorchSharp: ``Backend.train_block``) runs the steps up to the next thing the loop
   must do (snapshot, injection, lifecycle event, held-out evaluation, metrics batch) in
   one call that takes the pre-step check after each step itself and ends at the step
   it fires (or an in-step check found something, or :data:`BLOCK_MAX_S` passed); each
   step is still recorded as its own (:meth:`Loop.train_block`);
4. every ``--every`` steps a cadence snapshot, and one at the end.

The worker runs no rules: the supervisor's engine is the run's only one. With
``--stop-on-finding`` a pre-step check snapshot is sent with ``verdict=True``
and the worker waits for the supervisor's verdict (``optcheck/drivers/protocol.py``)
before the step runs; a finding in it stops the worker at that step.

Metrics are sent in batches (every :data:`METRICS_BATCH` steps or
:data:`METRICS_FLUSH_S` seconds, whichever comes first, so the supervisor's
``--step-timeout`` sees progress). A backend may return its losses as device values
(PyTorch: 0-d tensors on the soak's device); the loop keeps them as they are and reads
a batch of them in one go when it sends the batch or takes a snapshot
(``Backend.settle``, with the probes' pending device checks; ``Backend.step_times``
gives device step times): no step that takes no snapshot waits for the device
(docs/gpu.md). On SIGTERM (the supervisor stopping the run)
the worker sends the metrics it still holds before it exits (exit code 143),
so the run's last step is the last step trained.

Over 400 lines: the loop's one-step path and its block path (TorchSharp) are one state
machine over the same sequencer, metrics batch, stream and step counter; split, the block
path would reach into the loop's own fields.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback

from optcheck.config import SoakConfig
from optcheck.data import BatchSchedule, Corpus, load_corpus, val_batches
from optcheck.errors import InputError, StepStopped  # noqa: F401 - StepStopped: caught here, defined there
from optcheck.drivers.protocol import Stream
from optcheck.run.backend import Backend
from optcheck.run.sequencer import Sequencer, StepTimer

METRICS_BATCH = 200
METRICS_FLUSH_S = 1.0
#: Longest stretch of steps one backend call may take (``Backend.train_block``): SIGTERM is acted on after it.
BLOCK_MAX_S = 0.25
#: Exit code of a worker stopped by SIGTERM (128 + 15, as a shell reports it).
TERMINATED = 143


class Terminated(BaseException):
    """SIGTERM reached the worker: stop, flush, exit (a BaseException, so the
    training code's ``except Exception`` does not swallow it)."""


class _GuardedStream:
    """The worker's :class:`Stream` with SIGTERM held off while a message is being
    written: a signal during ``send`` is acted on right after it, so the pipe
    never carries a torn message."""

    def __init__(self, stream: Stream):
        self._stream = stream
        self.sending = False
        self.pending = False
        self.terminating = False

    def send(self, type: str, **payload) -> None:
        self.sending = True
        try:
            self._stream.send(type, **payload)
        finally:
            self.sending = False
        if self.pending and not self.terminating:
            self.terminating = True
            raise Terminated()

    def verdict(self) -> dict:
        return self._stream.verdict()

    @contextlib.contextmanager
    def held(self):
        """SIGTERM held off as during ``send``: acted on when the block ends, unless an exception leaves it
        (the crash report is then what the run sends)."""
        if self.sending:  # nested: the outer one acts on it
            yield
            return
        self.sending = True
        try:
            yield
        except BaseException:
            self.sending = False
            raise
        self.sending = False
        if self.pending and not self.terminating:
            self.terminating = True
            raise Terminated()

    def close(self) -> None:
        self._stream.close()

    def on_sigterm(self, _signum, _frame) -> None:
        if self.terminating:
            return
        if self.sending:
            self.pending = True
            return
        self.terminating = True
        raise Terminated()


class Loop:
    """State of one soak in one worker process (see module docstring)."""

    def __init__(self, backend: Backend, cfg: SoakConfig, stream: Stream):
        self.backend, self.cfg, self.stream = backend, cfg, stream
        self.seq = Sequencer(backend, run_id=cfg.run.run_id, every=cfg.run.every, emit=self._emit, flush=self.flush_metrics)
        self.val_first: float | None = None
        self.val_last: float | None = None
        self.val_steps: list[int] = []   # steps at which the held-out loss was evaluated
        self.metrics: dict[str, list] = {"steps": [], "losses": [], "step_times_s": []}
        self.val_pending: list = []  # held-out losses as the backend returned them (read at the flush)
        self.last_flush_t = time.perf_counter()
        self.block_step_s = 0.0  # the mean step time of the last block (Backend.train_block)
        self.step = 0
        self.timer = StepTimer(self.seq)  # optcheck's own work per step, step times, CPU time per block
        self.step_cost = self.timer.cost  # (summary cost.steps)
        self.cpu_s: float | None = None  # process CPU seconds of the training loop, snapshots included

    def _emit(self, snap: dict, seconds: float) -> str | None:
        """Send a snapshot; with ``--stop-on-finding``, a pre-step check snapshot waits for the
        supervisor's verdict (its rule engine is the run's only one) and returns its reason to stop."""
        ask = self.cfg.checks.stop_on_finding and snap["trigger"] == "check"
        self.stream.send("snapshot", snapshot=snap, cost_s=round(seconds, 6), verdict=ask)
        return self.stream.verdict().get("stop") if ask else None

    def settle(self) -> None:
        """Read the device values held since the last batch — losses, held-out losses and
        the probes' checks — in one go (``Backend.settle``); set the run's loss and held-out
        loss from them."""
        m, vals = self.metrics, self.val_pending
        got = self.backend.settle(m["losses"] + vals)
        self.val_pending = []
        m["losses"] = got[:len(m["losses"])]
        for v in got[len(m["losses"]):]:
            self.seq.val_loss = self.val_last = v
            if self.val_first is None:
                self.val_first = v
        for v in (m["losses"][:1] + m["losses"][-1:]):
            self.seq.loss(v)
        times = self.backend.step_times()
        if times is not None and len(times) == len(m["steps"]):
            m["step_times_s"] = times

    def flush_metrics(self) -> None:
        self.last_flush_t = time.perf_counter()
        self.settle()
        if self.metrics["steps"]:
            self.stream.send("metrics", **self.metrics)
            self.metrics = {"steps": [], "losses": [], "step_times_s": []}

    def event(self, kind: str, step: int, **detail) -> None:
        self.seq.event({"kind": kind, "step": step, "where": None, "count": 1, "detail": detail})
        self.stream.send("lifecycle", step=step, kind=kind, detail=detail)

    # -- the loop ----------------------------------------------------------
    def due_lifecycle(self, step: int) -> list[str]:
        c, due = self.cfg.run, []
        if c.eval_every and step % c.eval_every == 0:
            due.append("eval")
        if c.checkpoint_every and step % c.checkpoint_every == 0:
            due.append("checkpoint")
        if c.resume_at and step == c.resume_at:
            due.append("resume")
        return due

    def run(self, corpus: Corpus) -> int:
        cfg, be, seq = self.cfg, self.backend, self.seq
        sched = BatchSchedule(corpus.train.size, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed)
        # --val-every 0: no held-out loss at all (nor its batches)
        val = val_batches(corpus, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed, max(1, cfg.data.val_batches)) \
            if cfg.data.val_every else None
        self.stream.send("hello", backend=be.name, versions=be.versions(), threads=be.threads(),
                         pid=os.getpid(), corpus=corpus.describe(), config=dict(steps=cfg.run.steps, every=cfg.run.every))
        seq.start(0)
        seq.restart_clock()  # elapsed_s counts training, not set-up
        cpu0, timer = time.process_time(), self.timer
        injections = {}
        for inj in cfg.checks.inject:
            injections.setdefault(inj.step, []).append(inj.name)
        max_block = be.max_block(cfg.data.batch_size, cfg.model.block_size)
        step = 1
        while step <= cfg.run.steps:  # the soak step: what is due, the check, the training, the snapshot
            self.step = first = step
            for name in injections.get(step, ()):
                self.event("inject", step, name=name, **be.inject(name, step))
            for kind in self.due_lifecycle(step):
                self.event("lifecycle", step, name=kind, **be.lifecycle(kind, step))
            timer.start()
            if (stop := seq.pre_step(step)[1]) is not None:  # the pre-step check, and the verdict it asked
                self.stream.send("stopped", step=step, reason=stop)
                return 0
            timer.checked()
            if max_block:  # TorchSharp: steps first..last in one call into .NET
                timer.train()
                step, stop = self.train_block(sched, corpus, step, self.block_end(step, max_block, injections,
                                                                                  val is not None))
                timer.trained()
            else:
                stop = self.train_one(sched, corpus, step)
            if stop is not None:
                return 0
            if val is not None and (step % cfg.data.val_every == 0 or step == cfg.run.steps):
                with timer.also_training():  # (the last step too: "held-out first -> last" spans the run)
                    self.val_pending.append(be.val_loss(val))  # read with the next metrics batch
                self.val_steps.append(step)
            if (len(self.metrics["steps"]) >= METRICS_BATCH
                    or time.perf_counter() - self.last_flush_t >= METRICS_FLUSH_S):
                self.flush_metrics()  # before the post-step: a device check read now can force its snapshot
            seq.post_step(step, hazard=be.has_events(), last=step == cfg.run.steps)
            timer.end(first, step)
            step += 1
        self.cpu_s = time.process_time() - cpu0
        self.flush_metrics()
        self.stream.send("done", step=cfg.run.steps, val_loss_first=self.val_first, val_loss_last=self.val_last,
                         val_step_first=self.val_steps[0] if self.val_steps else None,
                         val_step_last=self.val_steps[-1] if self.val_steps else None,
                         step_cost=self.step_cost.to_dict(), train_cpu_s=round(self.cpu_s, 3),
                         train_cpu_block_s=timer.blocks.per_step_s, **self.hazard_stats())
        return 0

    def train_one(self, sched: BatchSchedule, corpus: Corpus, step: int) -> str | None:
        """Step ``step`` through ``Backend.train_step``, its loss and training time into the metrics.
        Returns the reason it stopped the run (a hazard, an in-step finding with
        ``--stop-on-finding``: already sent to the supervisor), else None."""
        x, y = sched.batch(corpus.train, step)
        self.timer.train()
        try:
            loss = self.backend.train_step(step, x, y)
        except StepStopped as e:
            self.seq.stopped(step, e.event)
            self.stream.send("stopped", step=step, reason=str(e), **self.hazard_stats())
            return str(e)
        except BaseException:
            self.in_step_snapshot(step)  # what the in-step check saw before the step's exception
            raise
        seconds = self.timer.trained()
        if (stop := self.in_step_snapshot(step)) is not None:
            self.stream.send("stopped", step=step, reason=stop)
            return stop
        self.metrics["steps"].append(step)
        self.metrics["losses"].append(loss)
        self.metrics["step_times_s"].append(seconds)
        return None

    def block_end(self, step: int, max_block: int, injections: dict, val: bool) -> int:
        """The last step of the block that starts at ``step``: the steps after ``step`` up to it have nothing
        due before them (injection, lifecycle event) and the steps before it nothing after them (cadence or
        final snapshot, held-out evaluation, a full metrics batch); at most ``max_block`` steps."""
        c, every = self.cfg.run, self.seq.every
        last = min(c.steps, step + max_block - 1, step + max(0, METRICS_BATCH - len(self.metrics["steps"]) - 1),
                   -(-step // every) * every)
        if val:
            last = min(last, -(-step // self.cfg.data.val_every) * self.cfg.data.val_every)
        for n in (c.eval_every, c.checkpoint_every):
            if n:
                last = min(last, (step // n + 1) * n - 1)
        if c.resume_at and c.resume_at > step:
            last = min(last, c.resume_at - 1)
        for s in injections:
            if step < s <= last:
                last = s - 1
        return last

    def train_block(self, sched: BatchSchedule, corpus: Corpus, first: int, last: int) -> tuple[int, str | None]:
        """Steps ``first``..``last`` in one backend call (``Backend.train_block``): they end early after a step
        whose fingerprint moved from the last snapshot's (the next step's pre-step check then fires), after a
        step with an in-step finding, or after the time left to the next metrics batch, so that progress keeps
        arriving within ``METRICS_FLUSH_S`` (``--step-timeout``). Records every step done as a step of its own
        (metrics: loss and step time); SIGTERM during the block is acted on once they are recorded. A step's
        exception propagates with the steps before it recorded and :attr:`step` set to it. Returns (the last
        step done, the supervisor's reason to stop at it or None)."""
        be, cfg = self.backend, self.cfg
        budget = max(0.0, min(BLOCK_MAX_S, METRICS_FLUSH_S - (time.perf_counter() - self.last_flush_t)))
        count = last - first + 1
        if self.block_step_s > 0:  # no more batches than the budget will let run (real TorchSharp: ~20 ms a step)
            count = max(1, min(count, int(budget / self.block_step_s) + 1))
        xs, ys = be.block_inputs(count, cfg.data.batch_size, cfg.model.block_size)
        sched.fill(corpus.train, first, xs, ys)
        ref = self.seq.reference
        try:
            with self.stream.held():
                try:
                    done = be.train_block(first, count, cfg.data.batch_size, cfg.model.block_size,
                                          ref if ref is not None else 0, budget)
                except BaseException:
                    done = be.block_done()
                    self.record_block(first, done)
                    self.step = first + done
                    raise
                self.record_block(first, done)
        except Terminated:
            raise
        except BaseException:
            self.in_step_snapshot(self.step)  # what the in-step check saw before the step's exception
            raise
        step = self.step = first + done - 1
        if (stop := self.in_step_snapshot(step)) is not None:
            self.stream.send("stopped", step=step, reason=stop)
        return step, stop

    def record_block(self, first: int, done: int) -> None:
        """The metrics of the first ``done`` steps of a block that started at ``first``."""
        if done:
            losses, seconds = self.backend.block_results(done)
            m = self.metrics
            m["steps"].extend(range(first, first + done))
            m["losses"].extend(losses)
            m["step_times_s"].extend(round(v, 6) for v in seconds)
            self.block_step_s = sum(seconds) / done

    def in_step_snapshot(self, step: int) -> str | None:
        """When the backend's in-step check found something inside step ``step`` (TorchSharp: the
        guarded optimizer's ``zero_grad()``/``step()``), send the body it read then as snapshot
        ``phase="in-step"``; returns the supervisor's reason to stop (``--stop-on-finding``), else None.
        Never raises: the step's own exception, if any, is what the run reports next."""
        try:
            if not self.backend.in_step():
                return None
            return self.seq.take(step, "in-step", "check")
        except Exception as e:  # noqa: BLE001
            print(f"optcheck: the in-step snapshot of step {step} could not be sent: {e}", file=sys.stderr)
            return None

    def checks_before_crash(self) -> None:
        """The step's device checks read at the crash (``flush_metrics``) found something —
        a NaN a few steps before the exception — : send it in a snapshot ahead of the crash,
        so its finding is the crash's lead time. Nothing when that snapshot cannot be taken."""
        try:
            if self.step and self.backend.has_events():
                self.seq.take(self.step, "pre-step", "hazard")
        except Exception:  # noqa: BLE001 - the crash itself is what must be reported
            pass

    def hazard_stats(self) -> dict:
        """``{"hazards": ...}`` for the done/stopped message: the hazard probes' arming
        (``summary.json``'s ``hazards``), when the backend has probes that report it."""
        value = self.backend.hazard_stats()
        return {"hazards": value} if value else {}


def run(backend: Backend, cfg: SoakConfig, stream: Stream) -> int:
    """Run a soak in this process, reporting on ``stream``; return the process exit code.

    Exit codes: 0 finished or stopped on purpose; 2 bad input (an InputError,
    reported as a crash message with ``exc_type="InputError"``); 1 an exception
    out of the training code (reported as a crash message with the exception's
    type — the .NET type for TorchSharp —, message, stack and the step); 143
    stopped by SIGTERM, after sending the metrics it held.
    """
    guarded = _GuardedStream(stream)
    loop = Loop(backend, cfg, guarded)
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, guarded.on_sigterm)
    try:
        corpus = load_corpus(cfg.data.path, cfg.model.vocab_size)
        backend.setup(cfg, corpus)
        return loop.run(corpus)
    except Terminated:
        guarded.terminating = True
        loop.flush_metrics()
        return TERMINATED
    except InputError as e:
        guarded.terminating = True
        stream.send("crash", step=loop.step, exc_type="InputError", message=str(e), stack="", input_error=True)
        return 2
    except BaseException as e:  # noqa: BLE001 - everything out of the training code is reported
        guarded.terminating = True
        loop.flush_metrics()
        loop.checks_before_crash()
        try:
            info = backend.exception_info(e)
        except Exception:
            info = {}
        info.setdefault("exc_type", f"{type(e).__module__}.{type(e).__qualname__}".removeprefix("builtins."))
        info.setdefault("message", str(e))
        info.setdefault("stack", "".join(traceback.format_exception(e)))
        stream.send("crash", step=loop.step, **info)
        print(info["stack"], file=sys.stderr)
        return 1
    finally:
        guarded.terminating = True
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        stream.close()
