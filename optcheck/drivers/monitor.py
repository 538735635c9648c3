"""``optcheck.Monitor``: the soak's probes and rules inside your own PyTorch loop.

Adding it to an existing loop takes two or three lines::

    mon = optcheck.Monitor(model, optimizer, every=50, out="runs/mine")   # 1
    for x, y in batches:                                                  #   your loop, unchanged
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    mon.close()                                                           # 2

or ``with optcheck.Monitor(model, optimizer, out=...) as mon:`` around the loop,
which also records an exception that ends it. Steps are counted by the
optimizer (``register_step_post_hook``); the loss is taken from the tensor
``backward()`` is called on (``mon.step(loss)`` records one explicitly).

Optimizers that step inside backward (PyTorch's optimizer-in-backward recipe with
a dict of per-parameter optimizers, torchtune's ``optimizer_in_bwd``, optimi's
``gradient_release``, LOMO) are watched too: there a training step is a backward
pass that moves the parameters (``optcheck/pytorch/in_backward.py``), the pre-step
check runs before that pass and the post-step snapshot after it.

How it watches (all hooks, nothing copied), in the soak's own order
(``optcheck/run/sequencer.py``: pre-step check, cadence, hazard-forced and final
snapshots; ``optcheck/run/recorder.py``: the rule check and ``summary.json``):

- ``optimizer.step()`` pre- and post-hooks (``register_step_pre_hook``): the
  identity check before, a snapshot at once if it changed; after, every
  ``every`` steps, or at once when a hazard probe saw something new;
- around forward and backward: the autograd hazard probes
  (``optcheck/pytorch/hazards/``): an in-place write to a saved tensor or a loss
  without ``grad_fn`` is recorded, then raised as
  :class:`optcheck.errors.StepStopped` (PyTorch would fail at ``backward()``
  naming neither module nor line); ``Tensor.backward`` and
  ``torch.autograd.backward`` (a tensor or a sequence, with ``grad_tensors``)
  are wrapped while a monitor is open (``optcheck/pytorch/monitor_hooks.py``);
- gradients left from the previous step (``optcheck/pytorch/grad_clear.py``);
- under ``torch.compile`` in any form (the model, a function calling it, ``optimizer.step``, a
  whole train step) every hook runs eagerly outside Dynamo and is traced as nothing
  (``optcheck/pytorch/dynamo_safe.py``); a step a compiled region hides is counted at the next
  eager point (the next ``backward()`` or ``close()``; docs/hazards.md, "`torch.compile`").

Findings go to ``out/findings.jsonl`` as they happen and, by default, are shown
as an :class:`OptcheckWarning` attributed to the user's own line
(``optcheck/userframe.py``; ``on_finding="warn"``); "raise" raises
:class:`FindingError` once every finding of the snapshot is written, "log" logs
to the ``optcheck`` logger, "ignore" only records. Accepted findings
(``ignore=``, ``optcheck/suppress.py``) are only counted. While a monitor is open
a ``sys.excepthook`` in front of the user's records the exception that ends the
process as the run's crash, as ``with`` does.

Optimizer wrappers (accelerate, Lightning) and DDP/DataParallel models are
unwrapped (``optcheck/pytorch/unwrap.py``); the Lightning and Trainer callbacks
are in ``optcheck/integrations/``. How a run that does not reach ``close()`` ends
(signals, a thread's death, fork) is ``optcheck/drivers/monitor_end.py``; what it writes,
``optcheck/run/recorder.py``.

(Over 400 lines: the Monitor object and its hook methods share its state; the rest is already apart: monitor_hooks, monitor_end, pytorch/guard, pytorch/step_hooks, recorder.)
"""

from __future__ import annotations

import atexit
import functools
import logging
import sys
import threading
import time
import warnings
import weakref
from pathlib import Path

import torch

from optcheck import distributed

from optcheck.drivers import monitor_end
from optcheck.engine import RuleEngine
from optcheck.findings import SEVERITIES, Finding, severity_rank
from optcheck.pytorch import monitor_hooks, step_hooks
from optcheck.pytorch.deferred import DeviceLedger
from optcheck.pytorch.dynamo_safe import HIDDEN_STEP_NOTE, HiddenSteps
from optcheck.pytorch.grad_clear import GradClearProbe
from optcheck.pytorch.in_backward import BackwardSteps
from optcheck.pytorch.guard import Notes, guarded
from optcheck.pytorch.monitor_hooks import ClipNorm, FindingError, OptcheckWarning, TorchProbe, backward_loss
from optcheck.pytorch.null_hazards import NullHazards
from optcheck.pytorch.names import fsdp1_hidden
from optcheck.pytorch.unwrap import ZeroOptimizer, unwrap_model, unwrap_optimizer
from optcheck.run.recorder import RunRecorder
from optcheck.rules import RuleConfig
from optcheck.run.sequencer import Sequencer, StepCost
from optcheck.record.summary import Summary, utc_now
from optcheck.suppress import resolve
from optcheck.userframe import user_stacklevel
from optcheck.errors import StepStopped

log = logging.getLogger("optcheck")
ON_FINDING = ("warn", "raise", "log", "ignore")
NO_STEP_BACKWARDS = 32  # backward() calls without optimizer.step() before OC206 (or 2x every)
NO_STEP_AT_CLOSE = 8  # at close, fewer are enough when the optimizer never stepped at all



def check_state(state) -> None:
    """Raise ValueError (one line) unless ``state`` is what :meth:`Monitor.state_dict`
    returns: a dict with ``step`` (a whole number >= 0) and optionally ``snapshots``
    (>= 0), ``every`` (>= 1) and ``loss_first`` (a number or None)."""
    def whole(v, low):
        return isinstance(v, int) and not isinstance(v, bool) and v >= low

    if not isinstance(state, dict) or not whole(state.get("step"), 0):
        raise ValueError(f"state must be a Monitor.state_dict() (a dict with 'step', a whole number >= 0), "
                         f"got {str(state)[:80]}")
    for key, low in (("snapshots", 0), ("every", 1)):
        if key in state and not whole(state[key], low):
            raise ValueError(f"state[{key!r}] must be a whole number >= {low}, got {state[key]!r}")
    lf = state.get("loss_first")
    if lf is not None and (not isinstance(lf, (int, float)) or isinstance(lf, bool)):
        raise ValueError(f"state['loss_first'] must be a number or None, got {lf!r}")

class Monitor:
    """Watch a user's PyTorch model and optimizer; same probes, rules and run
    directory as ``optcheck soak``.

    Args:
        model: the ``nn.Module`` being trained (inside ``DistributedDataParallel`` /
            ``DataParallel`` is fine: the inner module is watched).
        optimizer: its ``torch.optim.Optimizer`` (torch ≥ 2.0: step hooks), a
            wrapper holding one in ``.optimizer``, ``.base_optimizer``, ``.base``,
            ``.wrapped_optimizer`` or ``.optim`` (accelerate, Lightning, SAM, Lookahead,
            schedule-free's ``ScheduleFreeWrapper``), an object with
            ``param_groups``, ``state`` and ``step``, or a dict or list of optimizers
            stepped in backward (one per parameter; torchtune's
            ``OptimizerInBackwardWrapper``) (``optcheck/pytorch/unwrap.py``,
            ``docs/optimizers.md``).
        every: a snapshot every this many optimizer steps.
        out: run directory (``snapshots.jsonl``, ``findings.jsonl``,
            ``metrics.jsonl``, ``summary.json``); None keeps everything in memory.
        hazards: autograd hazard probes (in-place writes to saved tensors, cut
            graphs, non-leaf ``.grad`` reads, non-finite values): True or "auto" (module
            and saved-tensor hooks armed on the steps that need them, docs/hazards.md),
            "always" (armed on every step: the write site of a one-off in-place write),
            False (off).
        allow_inplace: record an in-place write to a saved tensor and let the step
            go on instead of raising ``StepStopped``.
        on_finding: "warn" | "raise" | "log" | "ignore". "raise" raises
            :class:`FindingError` after every finding of the snapshot is written;
            its ``step_ran`` says whether that optimizer step was taken.
        fail_on: lowest severity counted by :attr:`exit_code`.
        rule_config: rule knobs (``optcheck.rules.RuleConfig``).
        run_id: name of the run in snapshots (default: the ``out`` folder's name).
        append: append to an existing run directory (a resumed job) instead of
            starting it anew.
        state: a :meth:`state_dict` of the monitor of the run being resumed: step
            numbers and snapshot cadence continue from it.
        ignore: accepted findings, ``CODE`` or ``CODE:PATTERN`` (fnmatch on
            parameter names), e.g. ``["OC205:lm_head.*"]`` (``optcheck/suppress.py``):
            counted in the summary's ``suppressed``, not reported.
        ignore_config: also read ``[tool.optcheck] ignore`` from the nearest
            ``pyproject.toml`` (True), from this file (a path), or not (False).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or ``optimizer`` is none of
            the above (one line naming what was looked for).
        ValueError: ``on_finding`` or ``fail_on`` unknown, ``every`` < 1, a bad
            ``ignore`` entry, ``hazards`` not one of True, False, "auto", "always".
        optcheck.errors.InputError: ``out`` cannot be written.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, every: int = 100,
                 out: str | None = None, hazards: bool | str = True, allow_inplace: bool = False,
                 on_finding: str = "warn", fail_on: str = "warning", rule_config: RuleConfig | None = None,
                 run_id: str | None = None, append: bool = False, state: dict | None = None,
                 ignore: list[str] | None = None, ignore_config: str | bool = True):
        # this rank's side of a torchrun job (optcheck.distributed.watch.RankWatch), a NoRankWatch outside one
        self.rank_watch = distributed.attach(model, optimizer, every)
        out, run_id = self.rank_watch.locate(out, run_id)  # under torchrun: this rank's stream in out/rank-K
        model, optimizer = unwrap_model(model), unwrap_optimizer(optimizer)
        if on_finding not in ON_FINDING:
            raise ValueError(f"on_finding must be one of {ON_FINDING}, got {on_finding!r}")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"every must be a whole number >= 1, got {every!r}")
        if state is not None:
            check_state(state)
        if hazards not in (True, False, "auto", "always"):
            raise ValueError(f"hazards must be True, False, 'auto' or 'always', got {hazards!r}")
        self._fail_on, self._fail_rank = fail_on, severity_rank(fail_on)
        # torch.compile(model) returns an OptimizedModule keeping the model as _orig_mod: watch the model
        compiled = type(model).__name__ == "OptimizedModule"
        model = model._orig_mod if compiled else model  # (names without "_orig_mod.")
        self.model, self.optimizer, self.on_finding_policy = model, optimizer, on_finding
        # every input checked before the run directory is locked: a refused Monitor() leaves it free
        self.engine = RuleEngine(rule_config, ignore=resolve(ignore, ignore_config))
        self._interrupted: str | None = None
        self._started = utc_now()
        base = Summary(run=run_id or (Path(out).name if out is not None else "monitor"), backend="pytorch",
                       source="monitor", fail_on=fail_on, started=self._started)
        # the run's one writer (optcheck/run/recorder.py); a full disk is kept, reported, never raised into step()
        self.rec = RunRecorder(out, base, engine=self.engine, append=append, report=self._report,
                               checked=self.on_snapshot, on_record_error="keep", on_fill=self._fill_summary,
                               on_failure=self._record_failed,
                               reuse_hint="choose another out=, remove the folder, or pass append=True to add "
                                          "to its records (a resumed run)", option="out=")
        self.rundir = self.rec.rundir
        self.run_id = base.run
        self.checker = self.rec.checker
        self.step_count = 0
        self.closed = False
        self._losses: list[tuple[int, object]] = []  # (step, its loss as DeviceLedger.keep kept it)
        self._loss: torch.Tensor | None = None
        self._loss_before: torch.Tensor | None = None
        self._crash: dict | None = None
        self._stopped: dict | None = None
        self._may_raise = True
        self._backwards = 0  # backward() calls since the last optimizer step
        self._no_step_reported = False
        self._urgent = False  # an event of the Monitor's own wants a snapshot at this step
        self._switches = {id(optimizer)}  # ids of the optimizers watched so far (step_hooks: a swap)
        self._switch_event: tuple | None = None  # (old, new) switched at the step under way
        self.step_cost = StepCost()  # the hooks' own time per step, snapshots left out (summary cost.steps)
        self.notes = Notes()  # what could not be read, and optcheck's own errors (summary not_checked)
        if isinstance(optimizer, ZeroOptimizer):  # DeepSpeed ZeRO: what its partitions hide from the checks
            for line in optimizer.hidden:
                self.notes.add(line)
        for line in fsdp1_hidden(list(model.named_parameters())):  # FSDP1's flat parameters, likewise
            self.notes.add(line)
        self.hazards = NullHazards(optimizer)
        # the probes' device checks, read with the losses at each snapshot: no host sync on other steps
        self._ledger = DeviceLedger()
        if hazards:
            from optcheck.pytorch.hazards import HazardProbes

            self.hazards = HazardProbes(model, optimizer, allow_inplace=allow_inplace, compiled=compiled,
                                        mode="always" if hazards == "always" else "auto", ledger=self._ledger,
                                        grad_check_every=0,  # gradients: before the step writes them (_pre_step)
                                        hook_wrap=self._own_step_hook)
            self.hazards.on_stop = self._on_stop
        self.grad_clear = GradClearProbe(optimizer, ledger=self._ledger, per_backward=True,  # told by before_backward
                                         hook_wrap=self._own_step_hook)
        self.hazards.arrival_source = self.grad_clear  # one map of the gradients per backward pass, not two
        # the user's clip_grad_norm_ total (monitor_hooks): the NaN check's shortcut, and OC207's (grad_clear)
        self.clip_norm = ClipNorm(on_record=self.grad_clear.clipped)
        # steps taken inside backward (optimizer-in-backward, gradient release, LOMO): which pass was a step
        self.in_backward = BackwardSteps(optimizer, on_active=self.grad_clear.steps_in_backward)
        self.seq = Sequencer(TorchProbe(model, optimizer, self.hazards, self.grad_clear, self.notes), run_id=self.run_id,
                             every=every, emit=self._emit, flush=self._flush_losses)
        self._handles = step_hooks.register(optimizer, self._pre_step, self._post_step)  # once per training step
        # steps whose hooks a compiled region hides (a compiled optimizer.step or train step): stand-ins run at
        # the next eager point (optcheck/pytorch/dynamo_safe.py)
        self.hidden = HiddenSteps(optimizer, lambda: step_hooks.watch(self.optimizer).unpaired)
        self._standing_in = False  # the pre-step hooks run as stand-ins now
        self._pre_stood_in = False  # they ran for the step under way
        # another optimizer's step() over these parameters is the training step too (SAM's second_step); one
        # swapped in mid-run becomes the watched optimizer (optcheck/pytorch/step_hooks.py)
        self.follow = step_hooks.watch(optimizer).follow(self._switched)
        self._handles.append(self.follow)
        self._handles.append(step_hooks.watch(optimizer).on_inner(self.in_backward.inner))
        monitor_hooks.install(self)
        self._in_step = False  # a step entered on the hazard probes (_enter_step)
        if state is not None:
            self.load_state_dict(state)
        self._enter_step()
        self._snapshot("start")
        self.rec.write_running()
        self.rec.catch_fatal_signals()
        ref = weakref.ref(self)
        self._atexit = lambda: (ref() is not None and not ref().closed and ref().close())
        atexit.register(self._atexit)
        self._threads = {threading.get_ident()}  # the loop's threads: one dying is this run's crash
        monitor_end.opened(self)
        self._signals = monitor_end.SignalChain(self) if threading.current_thread() is threading.main_thread() \
            else None

    @property
    def every(self) -> int:
        """A snapshot every this many optimizer steps."""
        return self.seq.every

    @every.setter
    def every(self, value: int) -> None:
        self.seq.every = int(value)

    @property
    def snapshots(self) -> int:
        """Snapshots taken so far (with those of the run resumed from), as the recorder counted them."""
        return self.rec.summary.snapshots

    # -- hooks for subclasses (Lightning-style: no-ops by default) ------------
    def on_snapshot(self, snapshot: dict) -> None:
        """Called after each snapshot is taken and checked (``snapshot`` is schema 1)."""

    def on_finding(self, finding: Finding) -> None:
        """Called when a rule reports a new finding, before the ``on_finding`` policy applies."""

    def on_step_end(self, step: int) -> None:
        """Called after ``optimizer.step()`` of step ``step`` (1-based) and any snapshot of it."""

    def on_close(self, summary: dict) -> None:
        """Called by :meth:`close` with the final summary."""

    # -- public API -------------------------------------------------------------
    def step(self, loss: torch.Tensor | float | None = None) -> None:
        """Record the loss of the current step (optional: the loss is otherwise taken
        from the tensor ``backward()`` was called on). Call it before or after
        ``optimizer.step()``; steps are counted by the optimizer either way."""
        if loss is not None:
            self._loss = loss.detach() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))

    @property
    def findings(self) -> list[Finding]:
        """Every finding so far, in order."""
        return self.engine.findings

    @property
    def exit_code(self) -> int:
        """``optcheck.run.exitcodes`` policy: 130 if the loop was interrupted (KeyboardInterrupt,
        SIGINT, SIGTERM), 4 if the run directory stopped taking writes, 3 if the loop
        died inside the monitor (an exception, its thread's death), 1 if a finding
        reached ``fail_on``, else 0."""
        return self.rec.exit_code_now(crashed=self._crash is not None, interrupted=self._interrupted is not None)

    @property
    def record_error(self):
        """The first write the run directory refused (``optcheck.errors.RecordError``), or None."""
        return self.rec.record_error

    def state_dict(self) -> dict:
        """What a resumed job needs to keep the step count and snapshot cadence."""
        return {"step": self.step_count, "snapshots": self.snapshots, "every": self.every,
                "loss_first": self.rec.summary.loss_first}

    def load_state_dict(self, state: dict) -> None:
        """Continue counting from a :meth:`state_dict` (prefer ``Monitor(..., state=...)``:
        called later, the snapshots already written keep their step numbers).
        ValueError (one line) for anything but such a dict."""
        check_state(state)
        self.step_count = int(state["step"])
        self.seq.last_snap_step = self.step_count
        self.rec.resume(step=self.step_count, snapshots=int(state.get("snapshots", self.snapshots)),
                        loss_first=state.get("loss_first"))
        self.every = int(state.get("every", self.every))
        self.hazards.arm("resume")
        if self._in_step:
            self._exit_step()
            self._enter_step()

    def close(self) -> dict:
        """Final snapshot, summary, hooks removed; returns the summary. Idempotent."""
        if self.closed:
            return self.summary()
        self._hidden_step()
        self.closed = True
        if self._backwards >= NO_STEP_AT_CLOSE and self.step_count == 0:
            self._no_step_event()
        self._exit_step()
        if self._signals is not None:
            self._signals.restore()
        if self._interrupted is not None:  # stopped mid-step maybe: its losses, no snapshot of half a step
            self._guard(self._flush_losses)
        elif self._crash is None and self._stopped is None and (self.step_count > self.seq.last_snap_step
                                                                 or self._losses):
            self._guard(self._snapshot, "final")
        elif self._crash is not None:  # the losses of the steps taken before it, and the checks still unread
            if len(self._ledger):
                self._checks_before_crash()
            self._guard(self._flush_losses)
        for h in self._handles:
            h.remove()
        self.hazards.remove()
        self.grad_clear.remove()
        self.in_backward.remove()
        monitor_hooks.remove(self)
        monitor_end.closed(self)
        atexit.unregister(self._atexit)
        summary = self.rec.finish(**self._ending())
        self.rec.close()
        self.rank_watch.close(summary)  # under torchrun: rank 0 folds the ranks' summaries (RankRecorder)
        self.on_close(summary)
        return summary

    def _checks_before_crash(self) -> None:
        """The loop crashed with device checks still unread (docs/gpu.md): read them, and
        snapshot what they found (a NaN before the exception is the crash's lead time)."""
        self._may_raise = False
        try:
            self._ledger.read()
            if self.hazards.has_events() or self.grad_clear.has_events():
                self.seq.take(self.step_count, "post-step", "hazard")
        except Exception:  # noqa: BLE001 - the crash is what is reported
            log.warning("optcheck: the checks pending at the crash could not be read", exc_info=True)
        finally:
            self._may_raise = True

    def summary(self) -> dict:
        """The run so far: ``summary.json``'s fields (``optcheck.record.summary.Summary``,
        filled by ``optcheck.run.recorder.RunRecorder``)."""
        if self.closed and self.rec.finished:
            return self.rec.summary.to_dict()
        return self.rec.fill(running=not self.closed, **self._ending())

    def _ending(self) -> dict:
        return {"crashed": self._crash is not None, "interrupted": self._interrupted is not None,
                "stopped": self._stopped is not None, "elapsed_s": time.perf_counter() - self.seq.t0}

    def _fill_summary(self, sm: Summary) -> None:
        """The recorder's ``on_fill``: what only the Monitor sees (the recorder counts the rest:
        snapshots, losses, peak RSS, their cost): the optimizer steps taken, how the loop ended."""
        self.rec.reached(self.step_count)  # steps without a loss or a snapshot count too
        sm.versions, sm.threads = self.seq.probe.versions(), torch.get_num_threads()
        sm.crash, sm.stopped, sm.config = self._crash, self._stopped, {"every": self.every}
        if self.in_backward.active:  # the training step was a backward pass (optcheck/pytorch/in_backward.py)
            sm.config["steps_in"] = "backward"
        sm.not_checked = list(self.hazards.not_checked) + list(self.notes)
        sm.hazards = self.hazards.stats()
        sm.interrupted_by, sm.signals = self._interrupted, int(self._interrupted is not None)
        sm.cost = {**(sm.cost or {}), "steps": self.step_cost.to_dict(), "train_cpu_s": None}  # (CPU: a worker's)

    def _record_failed(self, error) -> None:
        """The recorder's ``on_failure``: said once; the training goes on, recorded in memory."""
        warnings.warn(f"optcheck: {error}: the run directory takes no more records; training goes on, "
                      f"the summary says record-failed", OptcheckWarning, stacklevel=user_stacklevel())

    def _guard(self, fn, *args) -> None:
        """Run a closing step that must not keep the summary from being written."""
        try:
            fn(*args)
        except FindingError:
            pass
        except Exception as e:  # noqa: BLE001 - never lose the summary to a probe's error
            log.warning("optcheck: %s at close: %s", type(e).__name__, e)

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.closed or self._stopped is not None:  # mon.close() in the block, or a hazard stopped the step
            self.close()
            return False
        if exc is not None and not isinstance(exc, (GeneratorExit, FindingError)):
            self.record_crash(exc)
        self.close()
        return False

    def record_crash(self, exc: BaseException) -> None:
        """Record ``exc``, the exception that ended the loop, as the run's crash (``crash``
        in the summary: the step about to run, the exception's type and message; status
        ``crashed``, exit code 3) — for a loop that catches its own exception and calls
        :meth:`close` itself. ``with``, ``sys.excepthook``, a dying thread and the
        framework callbacks call it for you. A :class:`FindingError` is the monitor's own
        stop, not a crash; a KeyboardInterrupt is an interruption (SIGINT); ``sys.exit(0)``
        (or ``sys.exit()``) a normal end. Only the first crash counts; nothing after
        :meth:`close`. Never raises."""
        if self._crash is not None or self.closed or isinstance(exc, FindingError):
            return
        if isinstance(exc, KeyboardInterrupt):
            self._interrupted = self._interrupted or "SIGINT"
            return
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return
        if self._interrupted is not None:  # a SIGTERM handler's sys.exit(1): the interruption, not a crash
            return
        self._crash = {"step": self.step_count + 1, "exc_type": type(exc).__qualname__, "message": str(exc)}
        self.rec.event({"kind": "crash", **self._crash})

    # -- internals --------------------------------------------------------------
    def _enter_step(self) -> None:
        self.hazards.begin_step(self.step_count + 1)  # (the step context without an object per step)
        self._in_step = True

    def _exit_step(self) -> None:
        if self._in_step:
            self._in_step = False
            self.hazards.finish_step()

    def _own_step_hook(self, hook):
        """A probe's optimizer step hook (``hook(optimizer, args, kwargs)``) run as the Monitor's own:
        its time counted in ``cost.steps``, an internal error in it a note (:func:`guarded`)."""

        @guarded(FindingError, StepStopped, timed=True)
        @functools.wraps(hook)
        def run(mon, optimizer, args, kwargs):
            return hook(optimizer, args, kwargs)

        return functools.partial(run, self)

    @guarded(FindingError, StepStopped)
    def _snapshot(self, which: str) -> None:
        """The start or final snapshot (an error in it is a note, not the user's exception)."""
        (self.seq.start if which == "start" else self.seq.final)(self.step_count)

    # -- what optcheck's own hooks call (the BackwardListener of optcheck/pytorch/monitor_hooks.py and the
    #    RunEnd of optcheck/drivers/monitor_end.py): public so no module reaches into the Monitor's privates;
    #    a training loop has no reason to call them
    @guarded(FindingError, StepStopped, timed=True)
    def before_backward(self, roots: list[torch.Tensor], grads=None) -> None:
        """Before a backward pass from ``roots`` (one tensor, or the tensors of
        ``torch.autograd.backward([l1, l2], grad_tensors)``): the hazard checks on each;
        the step's loss is Σ gᵢ·lᵢ over the one-element roots (gᵢ their one-element
        ``grad_tensors``, else 1), kept on the device until the next snapshot."""
        self._hidden_step()  # the last step, when a compiled region hid its hooks: counted before this pass
        loss = backward_loss(roots, grads)  # (a detach, no write: nothing for the hazards' write log to record)
        for t in roots:  # first of the probes: its end takes the hazards' write log off (hazards/writes.py)
            # (one root: its NaN check reads the detached loss kept below, one copy in the ledger for both)
            self.hazards.check_loss(t, self.step_count + 1, loss if len(roots) == 1 else None)
        self.clip_norm.clear()
        self.grad_clear.before_backward()  # (lazy modules materialised in their first forward are adopted there)
        ib = self.in_backward
        if not ib.retired:
            ib.before()
            if ib.active:  # this pass is the training step: the pre-step check, before it moves anything
                self.seq.pre_step(self.step_count + 1)
        if self.rank_watch.before_backward(self.step_count):  # under torchrun: the ranks differ
            self.seq.take(self.step_count + 1, "pre-step", "check")
        self._loss_before = self._loss  # (back to it when the pass reaches none of this optimizer's parameters)
        if loss is not None:
            self._loss = loss

    @guarded(FindingError, StepStopped, timed=True)
    def clipped(self, params: list, total) -> None:
        """``clip_grad_norm_`` over ``params`` returned ``total`` (after the backward pass, before
        the step): handed to :attr:`clip_norm`, timed as the Monitor's own work."""
        self.clip_norm.record(params, total)

    @guarded(FindingError, StepStopped, timed=True)
    def after_backward(self) -> None:
        """After a backward pass that returned: its gradients are written. With several Monitors
        open, a pass that reached none of the watched parameters (another Monitor's model) leaves
        this step's loss as it was."""
        if self.grad_clear.after_backward() is False and monitor_hooks.open_listeners() > 1:
            self._loss = self._loss_before
        self.hazards.after_backward(self.step_count + 1)
        if not self.in_backward.retired and self.in_backward.after():  # the pass moved the parameters: a step
            self.grad_clear.step_ended()
            self.hazards.step_ended(self.step_count + 1)
            self.step_cost.steps += 1
            self._end_step()
            self.on_step_end(self.step_count)
            return
        self._backwards += 1
        if (ev := self.rank_watch.after_backward(self.step_count + 1)) is not None:  # under torchrun
            for e in ev:
                self.seq.event(e)
            self.seq.take(self.step_count + 1, "pre-step", "hazard")
        if self.follow.stepping:  # a closure's backward inside step() (LBFGS, SAM): its gradients, now
            self.hazards.check_grads_now(self.step_count + 1)
        if self._backwards == max(NO_STEP_BACKWARDS, 2 * self.seq.every):
            self._no_step_event()
        if self.hidden.after_backward(sys._getframe(1)):  # steps run compiled: the pre-step hooks stand in now
            self._pre_stood_in = self._standing_in = True
            try:
                step_hooks.watch(self.optimizer).hidden_pre()
            finally:
                self._standing_in = False

    @guarded(FindingError, StepStopped)
    def _hidden_step(self) -> None:
        """An optimizer step ran where its hooks could not (inside a compiled region;
        :class:`HiddenSteps`): its post-step hooks now (the step counted, its loss kept, a
        snapshot when due); the pre-step check too when no stand-in ran before it (the first one)."""
        if not self.hidden.stepped():
            return
        self.notes.add(HIDDEN_STEP_NOTE)
        if not self._pre_stood_in:  # (the gradient checks of the pre-step hooks need the gradients: not now)
            self.seq.pre_step(self.step_count + 1)
        self._pre_stood_in = False
        step_hooks.watch(self.optimizer).hidden_post()

    def _no_step_event(self) -> None:
        """Many backward passes and no optimizer step: record it once and snapshot."""
        if self._no_step_reported or self._backwards < 2:
            return
        self._no_step_reported = True
        self.seq.event({"kind": "no_optimizer_step", "step": self.step_count + 1, "where": None,
                        "count": self._backwards, "detail": {}})
        self.seq.take(self.step_count, "post-step", "hazard")

    def _on_stop(self, exc: StepStopped) -> None:
        """A hazard stops the step: record it, then stop watching (the exception ends
        the user's loop; leaving saved-tensor hooks installed would switch off
        PyTorch's own version check for whatever runs next)."""
        # no FindingError here: StepStopped (raised by the probe after this) is the stop
        self._may_raise = False
        try:
            self.seq.stopped(self.step_count + 1, exc.event)
        finally:
            self._may_raise = True
        self._stopped = {"step": self.step_count + 1, "reason": str(exc)}
        if torch._C._current_graph_task_id() != -1:
            # inside backward (a write found when backward unpacked a saved tensor, or in a
            # checkpoint recompute): the autograd engine runs on a copy of the thread's
            # saved-tensor hooks and restores the original when backward ends, so the hooks
            # can only be popped after that (the backward wrapper, __exit__ or close() do it)
            return
        self.close()

    def backward_failed(self, exc: BaseException) -> None:
        """The backward pass raised ``exc``: PyTorch's own version check (an in-place write
        to a saved tensor on an unarmed step) becomes OC301 and ``StepStopped`` from it."""
        self.hazards.backward_failed(exc, self.step_count + 1)

    def backward_ended(self) -> None:
        """A backward pass is over (returned or raised): a step a hazard stopped inside it
        is closed now, its saved-tensor hooks popped (see :meth:`_on_stop`)."""
        if self._stopped is not None and not self.closed and torch._C._current_graph_task_id() == -1:
            self.close()

    def record_signal(self, name: str) -> None:
        """SIGINT/SIGTERM (``name``) reached the process, before the user's handler runs."""
        self._interrupted = self._interrupted or name

    def ran_in(self, thread_ident: int) -> bool:
        """Whether thread ``thread_ident`` ran this loop (created the Monitor, or stepped its optimizer)."""
        return thread_ident in self._threads

    def write_running(self) -> None:
        """Put the ``running`` summary on disk now (best effort, never raises)."""
        self.rec.write_running()

    def detach_fork(self) -> None:
        """In an ``os.fork()`` child: the run is the parent's; write nothing to it."""
        self.rec.detach()
        self.rundir = None
        if self._signals is not None:
            self._signals.restore()
            self._signals = None

    @guarded(FindingError, StepStopped, timed=True)
    def _pre_step(self, optimizer, args, kwargs) -> None:
        if not self._standing_in:
            self.hidden.hook_ran()
        self.hazards.check_grads_before_step(self.step_count + 1, kwargs, self.clip_norm)
        self.seq.pre_step(self.step_count + 1)

    @guarded(FindingError, StepStopped)
    def _switched(self, new, old) -> None:
        """The watched optimizer changed (``step_hooks.StepWatch``: ``new``, built mid-run
        over the watched parameters, steps them): snapshots, probes and rules read ``new``
        from this step on. The event (OC209) is recorded at the end of the step, unless the
        switch was undone within it (``new`` turned out to be a wrapper calling ``old``)."""
        self.optimizer = self.seq.probe.optimizer = self.hazards.optimizer = new
        self.grad_clear.adopt(new)
        self.hidden.optimizer = new
        self.in_backward.adopt(new)
        first = id(new) not in self._switches  # else: back to one watched before (two used in turn, or undone)
        self._switches.add(id(new))
        self._switch_event = (old, new) if first else None

    def _switch_done(self) -> None:
        """At the end of the step that switched optimizers: the event, and a snapshot at once."""
        old, new = self._switch_event
        self._switch_event = None
        if new is not self.optimizer:
            return
        n = len({id(p) for g in new.param_groups for p in g["params"]})
        self.seq.event({"kind": "optimizer_switched", "step": self.step_count, "where": None, "count": 1,
                        "detail": {"watched": type(old).__name__, "stepping": type(new).__name__,
                                   "params": n, "steps_before": self.step_count - 1}})
        self._urgent = True

    def _post_step(self, optimizer, args, kwargs) -> None:
        self.in_backward.retire()  # the ordinary contract: nothing to track in backward from now on
        self._step_done()
        self.on_step_end(self.step_count)

    @guarded(FindingError, StepStopped, timed=True, step_end=True)
    def _step_done(self) -> None:
        self._end_step()

    def _end_step(self) -> None:
        """The training step ends (after ``optimizer.step()``, or the backward pass that was the step)."""
        self._threads.add(threading.get_ident())
        self._backwards = 0
        self.step_count += 1
        step = self.step_count
        self._exit_step()
        if self._loss is not None:
            self._losses.append((step, self._ledger.keep(self._loss)))  # (DeviceLedger.keep: no CPU tensor held)
            self._loss = None
        self._loss_before = None  # (the step's tensors are let go at its end)
        try:
            if self._switch_event is not None:
                self._switch_done()
            urgent, self._urgent = self._urgent, False
            self.seq.post_step(step, hazard=self.hazards.has_events() or self.grad_clear.has_events() or urgent)
        finally:  # a FindingError caught by the user: the next step is still watched
            self._enter_step()

    def _flush_losses(self) -> None:
        """Read the losses kept since the last snapshot and the probes' device checks, in one
        transfer per device (the snapshot's only sync; docs/gpu.md)."""
        values = [v[0] for v in self._ledger.read([t for _, t in self._losses])]
        if not self._losses:
            return
        steps = [s for s, _ in self._losses]
        self._losses = []
        self.seq.last_loss = values[-1]  # the next snapshot's loss
        self.rec.metrics(steps, values)  # the steps since the last snapshot, one write(2); the recorder counts them

    def _emit(self, snap: dict, seconds: float) -> list[Finding]:
        """The sequencer's ``emit``: check and write the snapshot (``on_snapshot``, then each
        new finding); raise :class:`FindingError` once all are written (``on_finding="raise"``)."""
        self.rank_watch.annotate(snap)  # under torchrun: the cross-rank table (rules OC701-OC707)
        new = self.rec.check(snap, seconds)  # written, checked, counted; summary.json rewritten "running"
        failing = [f for f in new if severity_rank(f.severity) >= self._fail_rank]
        if self.on_finding_policy == "raise" and failing and self._may_raise:
            raise FindingError(failing[0], new)
        return new

    def _report(self, f: Finding) -> None:
        self.on_finding(f)
        text = f"optcheck: step {f.step} ({f.phase}) {f.code} {f.symbol}: {f.message}"
        if self.on_finding_policy == "warn":
            # the user's optimizer.step()/backward() line, not this one (as torch's own warnings)
            warnings.warn(text, OptcheckWarning, stacklevel=user_stacklevel())
        elif self.on_finding_policy == "log":
            log.warning(text)


__all__ = ["Monitor", "OptcheckWarning", "FindingError", "SEVERITIES"]
