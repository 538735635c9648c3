"""OC301: a tensor saved for backward written in place (mixin of :class:`HazardProbes`).

Saved-tensor pack/unpack hooks record and compare version counters; module boundaries
bracket the write; the write site is located in the source. See docs/hazards.md."""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from optcheck.pytorch.hazards._tensors import _VERSION, _parameter_like, _ptr, _safe, _storage_ptr
from optcheck.pytorch.hazards.source import (_aliases, _code_of, _function_span, _inplace_candidates, _internal,
                                             _line_text, _targets, _user_frame, _where)
from optcheck.wording import describe_inplace
from optcheck.pytorch.guard import raised_by_signal_handler

_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks


def _pytorch_inplace_message(t: torch.Tensor, saved_version: int) -> str:
    """The text PyTorch's version check raises for ``t`` (``saved_variable.cpp``)."""
    try:
        tname = t.type()
    except Exception as caught:  # noqa: BLE001 - meta / exotic tensors
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        tname = f"torch.{t.dtype}"
    shape = ", ".join(str(s) for s in t.shape)
    which = ""
    if t.grad_fn is not None:
        which = f", which is output {t.output_nr} of {type(t.grad_fn).__name__},"
    return (f"one of the variables needed for gradient computation has been modified by an inplace operation: "
            f"[{tname} [{shape}]]{which} is at version {t._version}; expected version {saved_version} instead.")


def _is_recompute_pack(pack) -> bool:
    """The pack hook ``torch.utils.checkpoint`` pushes while a non-reentrant checkpoint
    re-runs its function in backward (``_recomputation_hook``; torch/utils/checkpoint.py)."""
    fn = getattr(pack, "__wrapped__", pack)  # it is wrapped in torch._dynamo.disable
    return getattr(fn, "__module__", None) == "torch.utils.checkpoint" and \
        getattr(fn, "__qualname__", "").startswith("_recomputation_hook.")


class InplaceProbe:
    """In-place writes to saved tensors (OC301): the ``inplace_on_saved`` event."""

    def _pack(self, t: torch.Tensor):
        # hot path: runs once per tensor autograd saves (tens to thousands per step). The walk to the
        # user's frame reads one dict per frame (code object -> inside torch or optcheck), no string
        # work; a parameter (or a view of one) is left out of the eager version check
        f = first = sys._getframe(1)
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
        rec = (t, v, self._cur, code, f.f_lineno)
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

    def _unpack(self, rec):
        t, v = rec[0], rec[1]
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
        t, v, call, code, line = rec
        if id(t) in self._reported:
            if self.allow_inplace:
                return
        self._reported.add(id(t))
        saved_where = _where(code, line)
        written = self._locate_write(rec, detected_at)
        op = self._saving_op(t)
        tensor = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                  "type": _safe(lambda: t.type()), "grad_fn": type(t.grad_fn).__name__ if t.grad_fn else None,
                  "requires_grad": t.requires_grad}
        detail = {
            "tensor": tensor, "saved_version": v, "version": t._version,
            "saved_by": {"op": op, "module": self._calls[call] if 0 <= call < len(self._calls) else None,
                         "where": saved_where, "code": _line_text(code, line)},
            "written": written,
            "phase": ("between forward and backward" if detected_at.startswith("unpack") else
                      "backward (recompute)" if self._in_backward else "forward"),
            "stopped": not self.allow_inplace,
            "pytorch_error": _pytorch_inplace_message(t, v),
        }
        if self._pushed:  # saved by a non-reentrant checkpoint's recompute: PyTorch checks no version there
            detail.update(checkpoint="non-reentrant", pytorch_error=None)
        if _parameter_like(t):  # checked at unpack only: an optimizer step or a weight load in between
            base = t._base if t._base is not None else t
            detail["parameter"] = self._param_names.get(id(base)) or f"a parameter {list(base.shape)}"
        event = {"kind": "inplace_on_saved", "step": self._step,
                 "where": written.get("where") or saved_where, "count": 1, "detail": detail}
        msg = f"step {self._step}: {describe_inplace(event)}"
        if self.allow_inplace:
            self._record(event, key=("inplace_on_saved", saved_where, written.get("where")))
            return
        self._stop(msg, event)

    def _locate_write(self, rec, detected_at: str) -> dict:
        """Where the write happened: the module whose own code ran since the last
        boundary at which the versions still matched, the frame running it and the
        nearest in-place-looking line of that code (a candidate, from the source)."""
        kind, idx = self._last
        out: dict[str, Any] = {"detected_at": detected_at}
        since = {"pre": lambda: f"the start of {self._calls[idx]}'s forward",
                 "post": lambda: f"the return of {self._calls[idx]}",
                 "loss": lambda: "check_loss", "start": lambda: "the start of the step"}[kind]()
        if detected_at == "pre-hook":
            # the write ran in the caller of the module now entering (alive on the stack)
            parent = self._calls[self._stack[-1]] if self._stack else None
            out["module"] = parent or "(code outside the model)"
            out["between"] = f"{since} and the call of {self._entering}"
            frame = _user_frame(sys._getframe(1))
            if frame is not None:
                self._candidate(out, frame.f_code, _function_span(frame.f_code)[0], frame.f_lineno - 1,
                                pick_last=True, aliases=_aliases(frame, rec[0]))
                out["frame"] = _where(frame.f_code, frame.f_lineno)
        elif detected_at == "post-hook":
            # no boundary since `since`: the write ran in this module's own forward code
            name = self._calls[self._cur_post] if 0 <= self._cur_post < len(self._calls) else None
            out["module"] = name
            out["between"] = f"{since} and the return of {name}"
            code = _code_of(self._leaving) if self._leaving is not None else None
            internal = code is not None and _internal(code.co_filename)
            if internal:
                code = None  # torch's own module code (nn.Sequential, nn.ReLU, ...) has no user line
            if code is not None:
                first, last = _function_span(code)
                start = rec[4] if rec[3] is code else first
                if not self._candidate(out, code, start, last, pick_last=False):
                    self._candidate(out, code, first, last, pick_last=True)
                out["frame"] = _where(code, first)
            elif internal and self._last == ("pre", self._cur_post) and \
                    next(self._leaving.children(), None) is None:
                # a torch module without children wrote, inside its own call (nn.ReLU(inplace=True)):
                # the statement that called it
                frame = _user_frame(sys._getframe(1))
                if frame is not None:
                    out["where"], out["code"] = (_where(frame.f_code, frame.f_lineno),
                                                 _line_text(frame.f_code, frame.f_lineno))
            if not out.get("where") and rec[3] is not None and not _internal(rec[3].co_filename):
                # the user code that saved the tensor (a function, or a module without hooks): the
                # write usually follows the save in the same function
                caller = _user_frame(sys._getframe(1))
                last = caller.f_lineno if caller is not None and caller.f_code is rec[3] else \
                    _function_span(rec[3])[1]  # still running: not past the line running now
                self._candidate(out, rec[3], rec[4], last, pick_last=False)
        else:  # check_loss or unpack: after the last module boundary
            out["module"] = None
            out["between"] = f"{since} and {detected_at.split(' ')[0]}: code outside the model's modules"
            frame = _user_frame(sys._getframe(1))
            if frame is not None and detected_at.startswith("check_loss"):
                self._candidate(out, frame.f_code, _function_span(frame.f_code)[0], frame.f_lineno - 1,
                                pick_last=True, aliases=_aliases(frame, rec[0]))
                out["frame"] = _where(frame.f_code, frame.f_lineno)
            if not out.get("where") and detected_at.startswith("check_loss") and rec[3] is not None \
                    and not _internal(rec[3].co_filename):
                # a function that returned before check_loss saved it (a loss hook): the write usually
                # follows the save there
                self._candidate(out, rec[3], rec[4], _function_span(rec[3])[1], pick_last=False)
        return out

    @staticmethod
    def _candidate(out: dict, code, first: int, last: int, pick_last: bool = True,
                   aliases: set[str] | None = None) -> bool:
        """Put the last (or first) in-place-looking line of ``code`` in [first, last] into
        ``out``; lines writing one of ``aliases`` (names of the mutated tensor) first."""
        cands = _inplace_candidates(code.co_filename, first, last)
        if not cands:
            return False
        if aliases:
            cands = [c for c in cands if _targets(c[1]) & aliases] or cands
        n, text = cands[-1] if pick_last else cands[0]
        out["where"], out["code"] = f"{os.path.basename(code.co_filename)}:{n}", text
        out["file"] = code.co_filename
        return True

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
