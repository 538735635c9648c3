"""OC301: a tensor saved for backward written in place (mixin of :class:`HazardProbes`).

Saved-tensor pack/unpack hooks record and compare version counters; the write itself is
seen by the ``__torch_function__`` mode of ``writes.py`` (op, frame, module, phase), and
module boundaries, ``check_loss`` and unpack catch what it cannot see. See docs/hazards.md."""

from __future__ import annotations

import re
import sys
from typing import Any

import torch

from optcheck.pytorch.dynamo_safe import saved_by_compiled_graph
from optcheck.pytorch.hazards._tensors import _VERSION, _parameter_like, _ptr, _safe, _storage_ptr
from optcheck.pytorch.hazards.checkpoints import NON_REENTRANT, kept_inputs, recompute_kind
from optcheck.pytorch.hazards.source import _frame_text, _internal, _line_text, _user_frames, _where
from optcheck.pytorch.hazards.writes import op_name, targets, unmoded
from optcheck.wording import describe_inplace
from optcheck.pytorch.guard import raised_by_signal_handler

_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
graph_task_id = torch._C._current_graph_task_id
MAX_WRITES = 4096  # storages whose in-place writes are logged per step (writes.py)


def _pytorch_inplace_message(t: torch.Tensor, saved_version: int, made: str | None) -> str:
    """The text PyTorch's version check raises for ``t`` (``saved_variable.cpp``); ``made``: the
    type name of the node that made ``t`` when it was saved (PyTorch names it without ``Backward0``)."""
    try:
        tname = t.type()
    except Exception as caught:  # noqa: BLE001 - meta / exotic tensors
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        tname = f"torch.{t.dtype}"
    shape = ", ".join(str(s) for s in t.shape)
    which = ""
    if made is not None:
        which = f", which is output {t.output_nr} of {re.sub(r'Backward[0-9]*$', '', made)},"
    return (f"one of the variables needed for gradient computation has been modified by an inplace operation: "
            f"[{tname} [{shape}]]{which} is at version {t._version}; expected version {saved_version} instead.")


def _is_recompute_pack(pack) -> bool:
    """The pack hook ``torch.utils.checkpoint`` pushes while a non-reentrant checkpoint
    re-runs its function in backward (``_recomputation_hook``; torch/utils/checkpoint.py)."""
    fn = getattr(pack, "__wrapped__", pack)  # it is wrapped in torch._dynamo.disable
    return getattr(fn, "__module__", None) == "torch.utils.checkpoint" and \
        getattr(fn, "__qualname__", "").startswith("_recomputation_hook.")


def _kept_key(t: torch.Tensor):
    """A checkpoint input's key: its storage, offset and shape (a detached alias shares them)."""
    ptr = _storage_ptr(t)
    return (ptr, t.storage_offset(), tuple(t.shape)) if ptr else None


class InplaceProbe:
    """In-place writes to saved tensors (OC301): the ``inplace_on_saved`` event."""

    @unmoded
    def _pack(self, t: torch.Tensor):
        # hot path: runs once per tensor autograd saves (tens to thousands per step). The walk to the
        # user's frame reads one dict per frame (code object -> inside torch or optcheck), no string
        # work; a parameter (or a view of one) is left out of the eager version check
        f = first = sys._getframe(1)
        if saved_by_compiled_graph(first):  # a compiled graph's tensors: its versions are no evidence
            self._compiled_saves += 1
            return (t if t.grad_fn is None else t.detach(), None)
        internal_code = self._internal_code
        while f is not None:
            code = f.f_code
            internal = internal_code.get(code)
            if internal is None:
                internal = internal_code[code] = _internal(code.co_filename)
            if not internal:
                break
            f = f.f_back
        if f is None:  # no frame outside torch and optcheck: the one that saved it
            f = first
            code = f.f_code
        v = t._version
        made = t.grad_fn  # the node that made it, as PyTorch's own error names it (not kept: a name)
        # the record (which the graph keeps) holds a detached alias of a tensor made by an op: same
        # storage, same version counter, no grad_fn. The tensor itself would close a loop the cycle
        # collector cannot see when the op saving it is the one that made it (tanh, exp, softmax save
        # their output): graph -> record -> tensor -> grad_fn -> graph, and a graph kept by
        # backward(retain_graph=True) would then outlive the user's last reference (docs/hazards.md)
        held = t if made is None else t.detach()
        rec = (held, v, self._cur, code, f.f_lineno, type(made).__name__ if made is not None else None)
        if self._eval_ptrs:  # the output of a no-grad pass, saved by an op: that pass feeds a graph
            p = self._eval_ptrs.get(_storage_ptr(t))
            if p is not None:
                self._fed.add(p)
        base = t._base
        if base is None:
            base = t
        if base.is_leaf and (base.requires_grad or isinstance(base, torch.nn.Parameter)):
            return rec  # _parameter_like(t): checked at unpack only
        if id(t) not in self._live_ids:
            self._live_ids.add(id(t))
            self._live.append(t)
            self._live_rec.append(rec)
            self._vsum += v
        return rec

    @unmoded
    def _unpack(self, rec):
        if self._pending is not None and not self._introspecting:
            self._raise_pending()
        t, v = rec[0], rec[1]
        if v is None:  # saved by a compiled graph (_pack)
            return t
        if t._version != v and not self._introspecting:
            self._mutated(rec, detected_at="unpack in backward (the saved tensor was needed)")
        return t

    def _check_versions(self, detected_at: str) -> None:
        if self._live and sum(map(_VERSION, self._live)) != self._vsum:
            for rec in self._live_rec:
                if rec[0]._version != rec[1] and id(rec[0]) not in self._reported:
                    self._mutated(rec, detected_at=detected_at)
            self._vsum = sum(map(_VERSION, self._live))  # allow_inplace: accept the write, report it once

    def _mutated(self, rec, detected_at: str) -> None:
        t, v, call, code, line, made = rec
        if id(t) in self._reported:
            if self.allow_inplace:
                return
        self._reported.add(id(t))
        saved_where = _where(code, line)
        written = self._writer(rec, detected_at)
        kept = self._kept.get(_kept_key(t)) if self._kept else None
        op = None if kept else self._saving_op(t)
        tensor = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                  "type": _safe(lambda: t.type()),  # (the record holds a detached alias: grad_fn from it)
                  "grad_fn": made if made is not None else type(t.grad_fn).__name__ if t.grad_fn else None,
                  "requires_grad": made is not None or t.requires_grad}
        detail = {
            "tensor": tensor, "saved_version": v, "version": t._version,
            "saved_by": {"op": op, "module": self._calls[call] if 0 <= call < len(self._calls) else None,
                         "where": saved_where, "code": _line_text(code, line)},
            "written": written,
            "phase": written.get("phase") or ("between forward and backward" if detected_at.startswith("unpack")
                                              else "backward (recompute)" if self._in_backward else "forward"),
            "stopped": not self.allow_inplace,
            "pytorch_error": _pytorch_inplace_message(t, v, made),
        }
        if kept:  # an input a checkpoint keeps for its recompute (checkpoints.py)
            detail["saved_by"].update(op=None, kept_by=f"a {kept['checkpoint']} checkpoint",
                                      argument=kept["argument"], function=kept["function"])
            detail["checkpoint"] = kept["checkpoint"]
            if not kept["versioned"]:  # a keyword / bound tensor: no version counter compared by PyTorch
                detail["pytorch_error"] = None
        elif self._pushed:  # saved by a non-reentrant checkpoint's recompute: PyTorch checks no version there
            detail.update(checkpoint=NON_REENTRANT, pytorch_error=None)
        elif self._in_backward and str(detail["phase"]).startswith("backward"):
            # the kind read from the checkpoint running the write (or now), never guessed
            kind = written.get("checkpoint") or recompute_kind(sys._getframe())
            if kind is not None:
                detail["checkpoint"] = kind
        if _parameter_like(t):  # checked at unpack only: an optimizer step or a weight load in between
            base = t._base if t._base is not None else t
            detail["parameter"] = self._param_names.get(id(base)) or f"a parameter {list(base.shape)}"
        event = {"kind": "inplace_on_saved", "step": self._step,
                 "where": written.get("where") or saved_where, "count": 1, "detail": detail}
        msg = f"step {self._step}: {describe_inplace(event)}"
        if self.allow_inplace:
            self._record(event, key=("inplace_on_saved", saved_where, written.get("where")))
            return
        if detected_at == "write":  # inside the mode's call: stopped at the next hook (writes.py: ModeSlot)
            self._pending = self._pending or (event, t)
            return
        self._stop(msg, event)

    def _raise_pending(self, outputs=()) -> None:
        """A write seen by the mode stops the step here, at the first hook after it; the op that
        saved the tensor is looked up now, from the graph up to ``outputs`` (the module output
        or inputs at this hook), when it was not found at the write."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        event, t = pending
        saved = event["detail"]["saved_by"]
        if saved.get("op") is None and not self._pushed:
            self._roots.extend(o.grad_fn for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn is not None)
            saved["op"] = self._saving_op(t)
        self._stop(f"step {event['step']}: {describe_inplace(event)}", event)

    # -- the writer ------------------------------------------------------------------------
    def _seen_write(self, func, kind, args, kwargs, frame) -> None:
        """The mode ran an in-place call (``writes.py``): log it by the storage it wrote, then
        compare the saved tensors' versions (a write to one of them is found right here)."""
        ts = targets(func, kind, args, kwargs)
        if not ts:
            return
        frames = _user_frames(frame, self._internal_code, stop=self._replay_code if self._replaying else None)
        kind = None
        if graph_task_id() != -1:
            phase = "backward (recompute)" if self._stack else "backward"
            kind = recompute_kind(frame) if self._stack else None  # which checkpoint re-runs the forward
        elif self._stack:
            phase = "forward"
        else:
            phase = "after the forward, before backward()" if self._calls else "before the forward"
        module = self._calls[self._cur] if self._stack and 0 <= self._cur < len(self._calls) else None
        entry = (op_name(func, kwargs), frames, module, phase, kind)
        log = self._writes
        for t in ts:
            ptr = _storage_ptr(t)
            if ptr and (ptr in log or len(log) < MAX_WRITES):
                seen = log.setdefault(ptr, [])
                if len(seen) < 8:
                    seen.append((t._version, *entry))
        if self._live and sum(map(_VERSION, self._live)) != self._vsum:
            self._check_versions("write")

    def _writer(self, rec, detected_at: str) -> dict:
        """The write of ``rec``'s tensor: the first in-place call the mode logged on its storage
        that moved its version past the saved one, or, not seen, the window it happened in."""
        t, v = rec[0], rec[1]
        now = t._version
        for ver, op, frames, module, phase, kind in self._writes.get(_storage_ptr(t), ()):
            if v < ver <= now:
                code, line = frames[0] if frames else (None, None)
                out = {"op": op, "where": _where(code, line), "file": code.co_filename if code else None,
                       "code": _line_text(code, line), "stack": [_frame_text(c, n) for c, n in frames],
                       "module": module, "phase": phase, "seen": True, "detected_at": detected_at}
                if kind is not None:
                    out["checkpoint"] = kind
                return out
        return self._window(detected_at)

    def _window(self, detected_at: str) -> dict:
        """A write the mode did not see (an op outside torch's Python API, a tensor hook or a
        custom Function's backward in backward(), an unarmed step): the window it ran in."""
        kind, idx = self._last
        out: dict[str, Any] = {"detected_at": detected_at, "seen": False, "where": None}
        since = {"pre": lambda: f"the start of {self._calls[idx]}'s forward",
                 "post": lambda: f"the return of {self._calls[idx]}",
                 "loss": lambda: "backward() starting", "start": lambda: "the start of the step"}[kind]()
        if detected_at == "pre-hook":
            out["module"] = self._calls[self._stack[-1]] if self._stack else None
            out["between"] = f"{since} and the call of {self._entering}"
        elif detected_at == "post-hook":
            name = self._calls[self._cur_post] if 0 <= self._cur_post < len(self._calls) else None
            out["module"] = name
            out["between"] = f"{since} and the return of {name}"
        elif detected_at == "write":
            out["module"] = self._calls[self._cur] if self._stack else None
            out["between"] = f"{since} and an in-place call on another tensor"
        else:  # check_loss or unpack: after the last module boundary
            out["module"] = None
            out["between"] = f"{since} and {detected_at.split(' ')[0]}"
        return out

    def _saving_op(self, t: torch.Tensor) -> str | None:
        """Name of the autograd node that saved ``t`` (a walk of the graph from the
        module outputs seen this step; rare path, on detection only)."""
        if self._pushed:
            # inside a non-reentrant checkpoint's recompute: reading a node's saved tensors
            # would run the unpack hooks of other checkpointed segments (recomputing them)
            return None
        key = (_ptr(t), tuple(t.shape), t.stride())

        def same(v) -> bool:  # unpacking re-wraps the tensor: compare address, shape, strides
            return isinstance(v, torch.Tensor) and (_ptr(v), tuple(v.shape), v.stride()) == key

        self._introspecting = True
        try:
            seen, todo = set(), [r for r in reversed(self._roots) if r is not None]
            while todo and len(seen) < 20000:
                node = todo.pop()
                if node in seen:
                    continue
                seen.add(node)
                for attr in dir(node):
                    if not attr.startswith("_saved_"):
                        continue
                    try:
                        val = getattr(node, attr)
                    except Exception as caught:  # noqa: BLE001 - freed buffers, unsupported types
                        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
                            raise
                        continue
                    vals = val if isinstance(val, (tuple, list)) else (val,)
                    if any(same(v) for v in vals):
                        return type(node).__name__
                for nxt, _ in getattr(node, "next_functions", ()):
                    if nxt is not None and nxt not in seen:
                        todo.append(nxt)
        finally:
            self._introspecting = False
        return None

    def _checkpoint_inputs(self, kind: str, marker, start) -> None:
        """A checkpoint's forward runs (``marker``: its ``_CheckpointFrame`` or the reentrant
        ``CheckpointFunction.forward`` frame, once per call): tag the inputs its recompute
        re-reads, and record for the version check those no one else compares (keyword
        arguments, tensors bound in the function): a write to one before the recompute is an
        OC301 event at the write (``checkpoints.py``)."""
        if id(marker) in self._ck_seen:
            return
        self._ck_seen[id(marker)] = marker  # held for the step: the graph holds it anyway
        try:
            versioned, unversioned, what, site = kept_inputs(kind, start)
        except Exception as caught:  # noqa: BLE001 - another torch's frames: said once, never raised
            if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
                raise
            note = (f"checkpoint inputs unreadable ({type(caught).__name__}: {str(caught)[:120]}); a write to "
                    f"a keyword input of a checkpoint before its recompute is not checked")
            if note not in self.faults:
                self.faults.append(note)
            return
        while site is not None and _internal(site.f_code.co_filename):  # the line calling checkpoint()
            site = site.f_back
        code, line = (site.f_code, site.f_lineno) if site is not None else (None, None)
        for is_versioned, pairs in ((True, versioned), (False, unversioned)):
            for label, t in pairs:
                key = _kept_key(t)
                if key is None or key in self._kept or _parameter_like(t):
                    continue
                self._kept[key] = {"checkpoint": kind, "argument": label, "function": what,
                                   "versioned": is_versioned}
                if not is_versioned and id(t) not in self._live_ids:
                    made = t.grad_fn
                    held = t if made is None else t.detach()
                    rec = (held, t._version, self._cur, code, line, type(made).__name__ if made is not None else None)
                    self._live_ids.add(id(t))
                    self._live.append(t)
                    self._live_rec.append(rec)
                    self._vsum += t._version
        if unversioned:  # PyTorch compares no version of these: only the armed probes can
            self._stay_armed(f"checkpoint ({kind}) keyword inputs")

    def _compose(self, module, pack, unpack) -> None:
        """Inside a non-reentrant checkpoint's recompute (in backward), torch.utils.checkpoint's
        own saved-tensor hooks shadow ours: push a pair that records each saved tensor for the
        version check and hands it on to theirs; popped when ``module`` returns or raises."""
        probes = self

        def cpack(t):
            inner = pack(t)  # may raise to stop the recompute early: nothing recorded then
            probes._pack(t)
            return inner

        cpack.optcheck = True
        torch._C._autograd._push_saved_tensors_default_hooks(cpack, unpack)
        self._pushed.append((module,))
