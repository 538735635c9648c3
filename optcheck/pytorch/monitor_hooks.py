"""What ``optcheck.Monitor`` (``optcheck/drivers/monitor.py``) is built from besides the
run's sequencer: its probe over the user's model and optimizer, its warning and
exception types, and the process-wide hooks — the ``backward`` wrappers and the
``sys.excepthook`` installed while a monitor is open.

``torch.Tensor.backward`` and ``torch.autograd.backward`` are replaced while at
least one Monitor is open, and put back when the last one closes. Every open
Monitor (newest first) is told before and after each backward pass, through the
public interface :class:`BackwardListener` (nothing here reads a Monitor's
private names): two Monitors over one model (one per optimizer, or two on one
optimizer) each record the loss and the gradients of the passes their optimizer
steps on. ``Tensor.backward`` calls ``torch.autograd.backward`` itself
(``torch/_tensor.py``), so the inner call passes straight through and each pass
is seen once.

``torch.nn.utils.clip_grad_norm_`` is wrapped the same way: the total norm the
user's clipping computed is handed to every open Monitor (``clipped``, kept in a :class:`ClipNorm`), so
its NaN/Inf check of the gradients before ``optimizer.step()`` (OC501) reads that
one number instead of every gradient again (a ``torch._foreach_norm`` over all of
them: 0.5 ms a step on a 0.8 M-parameter GPT, one thread). A loop that imported
the function by name before the Monitor was created (``from torch.nn.utils import
clip_grad_norm_``) calls the original: the Monitor then reads the gradients itself.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Protocol

import torch

from optcheck.findings import Finding
from optcheck.pytorch import census, probe
from optcheck.pytorch import device as devices
from optcheck.pytorch.dynamo_safe import eager_call, traced_as
from optcheck.pytorch.guard import Notes, raised_by_signal_handler
from optcheck.pytorch.train import CENSUS_EVERY

log = logging.getLogger("optcheck")

#: open monitors, newest last (each a BackwardListener)
_ACTIVE: list = []
#: the original ``Tensor.backward`` ("tensor") and ``torch.autograd.backward`` ("autograd") while wrapped
_ORIG: dict[str, Any] = {}
_IN_BACKWARD: list[bool] = []
_PREV_EXCEPTHOOK: list = []


class OptcheckWarning(UserWarning):
    """A finding, shown as a warning (``Monitor(on_finding="warn")``)."""


class FindingError(RuntimeError):
    """A finding, raised (``Monitor(on_finding="raise")``).

    ``.finding`` is the first finding at or above ``fail_on`` of the snapshot,
    ``.findings`` all of that snapshot's (every one already written to
    ``findings.jsonl`` and ``summary.json``). ``.step_ran`` says whether the
    optimizer step of ``finding.step`` was taken: False for a "pre-step" finding
    (raised from the step pre-hook, before ``optimizer.step()`` changed anything),
    True for a "post-step" one (raised from the post-hook, after it).
    """

    def __init__(self, finding: Finding, findings: list[Finding] | None = None):
        self.findings = list(findings or [finding])
        more = f" (+{len(self.findings) - 1} more finding(s) in findings.jsonl)" if len(self.findings) > 1 else ""
        super().__init__(f"step {finding.step}: {finding.code} {finding.symbol}: {finding.message}{more}")
        self.finding = finding
        self.step_ran = finding.phase != "pre-step"


class BackwardListener(Protocol):
    """What the backward and ``clip_grad_norm_`` wrappers and the ``sys.excepthook`` of this
    module call on the newest open listener (:class:`optcheck.Monitor` implements it).

    Per backward pass, in this order: :meth:`before_backward`; the pass itself; on an
    exception from it :meth:`backward_failed` (then the exception goes on to the user);
    :meth:`backward_ended` whatever happened; :meth:`after_backward` when it returned.
    None of them raises into the user's loop except :class:`optcheck.errors.StepStopped`
    and :class:`FindingError`, which are meant for it."""

    def before_backward(self, roots: list[torch.Tensor], grads=None) -> None:
        """A backward pass from ``roots`` (:func:`backward_roots`) with ``grads`` (its
        ``grad_tensors``/``gradient`` argument, or None) is about to run."""

    def backward_failed(self, exc: BaseException) -> None:
        """The pass raised ``exc`` (PyTorch's version check among others); may raise
        ``StepStopped`` from it."""

    def backward_ended(self) -> None:
        """The pass is over, returned or raised (saved-tensor hooks may be popped now)."""

    def after_backward(self) -> None:
        """The pass returned: its gradients are written."""

    def clipped(self, params: list, total) -> None:
        """``clip_grad_norm_`` over ``params`` (a list of tensors) returned ``total``."""

    def record_crash(self, exc: BaseException) -> None:
        """``exc`` ends the process (``sys.excepthook``): the run's crash."""

    def close(self) -> dict:
        """End the run; idempotent."""


class TorchProbe:
    """The sequencer's probe (``optcheck.run.sequencer.Probe``) over the user's model and optimizer."""

    name = "pytorch"

    def __init__(self, model, optimizer, hazards, grad_clear, notes: Notes | None = None):
        self.model, self.optimizer, self.hazards, self.grad_clear = model, optimizer, hazards, grad_clear
        self.snapshots = 0
        self.notes = notes if notes is not None else Notes()  # what could not be read

    def fingerprint(self):
        return probe.fingerprint(self.model, self.optimizer)

    def snapshot_body(self) -> dict:
        census = self.snapshots % CENSUS_EVERY == 0
        self.snapshots += 1
        norms = probe.Norms() if self.hazards.wants_norms else None  # one read of every tensor
        body = probe.snapshot_body(self.model, self.optimizer, census=census, norms=norms)
        try:
            events = self.hazards.drain(norms)
        except Exception as e:  # noqa: BLE001 - never out of the user's step (optcheck/pytorch/guard.py)
            if raised_by_signal_handler(e):
                raise
            events = []
            body["notes"].append(f"hazard drain failed ({type(e).__name__}: {str(e)[:120]}); its checks skipped")
        body["events"] = events + self.grad_clear.drain()
        for note in body["notes"]:
            self.notes.add(note)
        watched, arrived = self.grad_clear.arrival()  # grad_arrived: a gradient reached it during backward
        for rec in body["params"]:
            if rec["ref"] in watched:
                rec["grad_arrived"] = rec["ref"] in arrived
        return body

    def versions(self) -> dict:
        """Library versions and the model's device (``optcheck.pytorch.device.describe``)."""
        return {**probe.versions(), **devices.describe(devices.model_device(self.model))}

    def threads(self) -> int:
        return torch.get_num_threads()


def backward_roots(tensors) -> list[torch.Tensor]:
    """The tensors a backward pass starts from: ``tensors`` itself, or the Tensors of a
    sequence (``torch.autograd.backward([l1, l2])``; other items such as a
    ``GradientEdge`` are left out). Empty for anything else."""
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    if isinstance(tensors, (list, tuple)):
        return [t for t in tensors if isinstance(t, torch.Tensor)]
    return []


def backward_loss(roots: list[torch.Tensor], grads=None) -> torch.Tensor | None:
    """The loss of a backward pass from ``roots`` (:func:`backward_roots`), detached, on
    its device (no sync): the root itself for one; Σ gᵢ·lᵢ for several, over the
    one-element roots, gᵢ their one-element ``grad_tensors`` entry (else 1). None
    when no root has one element (a non-scalar ``backward(gradient)``). Detached: a
    Monitor holds it to the step's end, and must not hold a graph kept with
    ``retain_graph=True`` that the user let go of."""
    if grads is None and len(roots) == 1:  # loss.backward(): the common case, two C calls
        r = roots[0]
        return r.detach() if r.numel() == 1 else None
    gs = list(grads) if isinstance(grads, (list, tuple)) else [grads] * len(roots)
    terms = [r.detach() if not (isinstance(g, torch.Tensor) and g.numel() == 1)
             else r.detach().reshape(()) * g.detach().reshape(())
             for r, g in zip(roots, gs) if r.numel() == 1]
    if not terms:
        return None
    return terms[0] if len(roots) == 1 else torch.stack([t.float().reshape(()) for t in terms]).sum()


def _watched(key: str):
    """A wrapper of ``torch.Tensor.backward`` (key "tensor") or ``torch.autograd.backward``
    ("autograd") that tells every open :class:`BackwardListener` before and after (newest
    first). A listener that raises (``StepStopped``, ``FindingError``) does not keep the
    others from being told; the first exception raised goes on to the user."""

    def backward(tensors, *args, **kwargs):
        if not _ACTIVE or _IN_BACKWARD:
            return _ORIG[key](tensors, *args, **kwargs)
        listeners = _ACTIVE[::-1]  # a copy: a listener may close inside
        roots = backward_roots(tensors)
        if not roots:
            return _ORIG[key](tensors, *args, **kwargs)
        # the grad_tensors (torch.autograd.backward) or gradient (Tensor.backward) argument, as given
        grads = args[0] if args else kwargs.get("gradient" if key == "tensor" else "grad_tensors")
        try:
            _tell(listeners, "before_backward", roots, grads)
        except BaseException:
            _tell(listeners, "backward_ended")
            raise
        _IN_BACKWARD.append(True)
        try:
            out = _ORIG[key](tensors, *args, **kwargs)
        except RuntimeError as e:  # PyTorch's version check on an unarmed step: StepStopped (OC301) from it
            _tell(listeners, "backward_failed", e)
            raise
        finally:
            _IN_BACKWARD.pop()
            _tell(listeners, "backward_ended")
        _tell(listeners, "after_backward")
        return out

    return backward


def _tell(listeners, method: str, *args) -> None:
    """Call ``method`` on each listener; the first exception is raised once all were told."""
    if len(listeners) == 1:  # one Monitor: the common case
        getattr(listeners[0], method)(*args)
        return
    first = None
    for listener in listeners:
        try:
            getattr(listener, method)(*args)
        except BaseException as e:  # noqa: BLE001 - raised below, after the others
            first = first or e
    if first is not None:
        raise first


class ClipNorm:
    """The last total gradient norm ``clip_grad_norm_`` returned since the last backward
    pass, with the parameters it covered (see the module docstring).

    :meth:`covers` says whether it stands for the gradients of ``params``: it was
    taken after their last backward and over all of them (by ``id``)."""

    def __init__(self, on_record=None):
        self.total: torch.Tensor | None = None
        self._ids: frozenset = frozenset()
        self._params: list = []  # the parameters of the last record (their ids are _ids)
        self._covered: tuple = (None, [], False)  # (_ids, the parameters covers() was last asked about, its answer)
        self.on_record = on_record  # f(ids of params, total) after each record (the gradient-flow probe's OC207)

    def record(self, params: list, total) -> None:
        if isinstance(total, torch.Tensor) and total.numel() == 1:
            if not probe.same_objects(params, self._params):  # (per step the same parameters: their id set is kept)
                self._params, self._ids = params, frozenset(map(id, params))
            self.total = total.detach() if total.requires_grad else total  # (clip_grad_norm_ runs under no_grad: no op)
        else:
            self.total = None
        if self.on_record is not None:
            self.on_record(self._ids, self.total)

    def clear(self) -> None:
        """A backward pass ran: gradients may have changed since."""
        self.total = None

    def covers(self, params: list) -> bool:
        """The last total stands for the gradients of every one of ``params`` (same objects)."""
        if self.total is None:
            return False
        ids, asked, answer = self._covered
        if ids is not self._ids or (params is not asked and not probe.same_objects(params, asked)):
            answer = self._ids.issuperset(map(id, params))  # (C-level: no frame per parameter)
            self._covered = (self._ids, params, answer)
        return answer


def _clip_watched(orig):
    """A wrapper of ``clip_grad_norm_`` that hands its total norm to every open listener."""

    def clip_grad_norm_(parameters, *args, **kwargs):
        if not _ACTIVE:
            return orig(parameters, *args, **kwargs)
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        total = orig(params, *args, **kwargs)
        for mon in list(_ACTIVE):
            try:
                mon.clipped(params, total)
            except Exception as e:  # never into the user's loop
                if raised_by_signal_handler(e):
                    raise
                log.debug("optcheck: clip_grad_norm_ not recorded", exc_info=True)
        return total

    clip_grad_norm_.__wrapped__ = orig
    clip_grad_norm_.__doc__ = orig.__doc__
    return clip_grad_norm_


#: the backward wrappers, made once (``torch.compiler.disable``: run outside Dynamo)
_WRAPPED = {key: eager_call(_watched(key)) for key in ("tensor", "autograd")}
_CLIP: dict = {}  # id(original clip_grad_norm_) -> (it, its wrapper): one registration with Dynamo each


def _clip_safe(orig):
    """:func:`_clip_watched` of ``orig``, traced by Dynamo as ``orig`` itself (made once per ``orig``)."""
    have = _CLIP.get(id(orig))
    if have is None or have[0] is not orig:
        have = _CLIP[id(orig)] = (orig, traced_as(_clip_watched(orig), orig))
    return have[1]


def _excepthook(exc_type, exc, tb) -> None:
    """``sys.excepthook`` while a Monitor is open: the exception that ends the process
    is recorded as the crash of every open monitor (as ``with Monitor`` records it),
    which then closes, before the previous hook prints the traceback."""
    for mon in list(_ACTIVE):
        try:
            mon.record_crash(exc)
            mon.close()
        except Exception:  # never hide the user's traceback behind ours
            log.exception("optcheck: could not record the crash")
    prev = _PREV_EXCEPTHOOK[0] if _PREV_EXCEPTHOOK else sys.__excepthook__
    prev(exc_type, exc, tb)


def open_listeners() -> int:
    """How many listeners (Monitors) are open."""
    return len(_ACTIVE)


def install(mon: BackwardListener) -> None:
    """Register ``mon`` as the newest open listener; wrap backward and the excepthook once."""
    _ACTIVE.append(mon)
    if not _ORIG:
        _ORIG["tensor"], _ORIG["autograd"] = torch.Tensor.backward, torch.autograd.backward
        # run eagerly even from a compiled frame (a compiled train step): Dynamo breaks its graph at
        # backward() without optcheck too; clip_grad_norm_ traced as torch's own (dynamo_safe.py)
        torch.Tensor.backward = _WRAPPED["tensor"]
        torch.autograd.backward = _WRAPPED["autograd"]
        _ORIG["clip"] = torch.nn.utils.clip_grad_norm_
        torch.nn.utils.clip_grad_norm_ = torch.nn.utils.clip_grad.clip_grad_norm_ = _clip_safe(_ORIG["clip"])
    if not _PREV_EXCEPTHOOK:
        _PREV_EXCEPTHOOK.append(sys.excepthook)
        sys.excepthook = _excepthook


def remove(mon: BackwardListener) -> None:
    """Unregister ``mon``; with no monitor left open, put backward and the excepthook back."""
    if mon in _ACTIVE:
        _ACTIVE.remove(mon)
    if _ACTIVE:
        return
    census.release()  # the census froze the objects alive at its first run: unfreeze them
    if _ORIG:
        torch.Tensor.backward, torch.autograd.backward = _ORIG.pop("tensor"), _ORIG.pop("autograd")
        torch.nn.utils.clip_grad_norm_ = torch.nn.utils.clip_grad.clip_grad_norm_ = _ORIG.pop("clip")
    if _PREV_EXCEPTHOOK:
        prev = _PREV_EXCEPTHOOK.pop()
        if sys.excepthook is _excepthook:  # someone chained after us: leave theirs (ours passes through)
            sys.excepthook = prev
