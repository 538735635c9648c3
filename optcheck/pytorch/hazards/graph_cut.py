"""OC203: graph cuts (mixin of :class:`HazardProbes`).

Module outputs that lost ``grad_fn`` are recorded per forward pass and judged only when
the pass reaches a backward or the loss: an evaluation forward is no cut. See docs/hazards.md."""

from __future__ import annotations

import linecache
import os
import sys

import torch

from optcheck.pytorch.hazards._tensors import MAX_SAMPLES, _float_tensors, _ptr, _tensors
from optcheck.pytorch.hazards.source import (_CUTTING, _backward_caller, _code_of, _function_span, _line_text,
                                             _user_frame, _where)

MAX_EVAL_PASSES = 4  # cut records kept for this many finished passes whose output needs no grad


class GraphCutProbe:
    """Graph cuts (OC203): the ``graph_cut`` event."""

    def _forget_cuts(self) -> None:
        """Drop the cut records (after a backward judged them, or at a new step). Nothing to do
        when there are none (every unarmed step, issue 34: no new containers per step)."""
        if getattr(self, "_cut_passes", None) == {} and not (self._cut or self._pass_out or self._judged
                                                              or self._fed or self._eval_ptrs):
            return
        self._cut: list[dict] = []  # modules whose floating outputs lost grad_fn, since the last backward
        self._cut_passes: dict[int, int] = {}  # pass (call index) -> number of its cut records
        self._pass_out: dict[int, tuple] = {}  # finished pass with cut records -> (output requires grad, grad_fns)
        self._judged: set[int] = set()  # passes whose output reached a backwarded loss through its graph
        self._fed: set[int] = set()  # no-grad passes whose output an op saved for backward
        self._eval_ptrs: dict[int, int] = {}  # storage address of a finished no-grad pass's output -> pass

    def _add_cut(self, rec: dict) -> None:
        """Keep a cut record of the current pass. Records of passes whose output did not
        require grad (evaluation, generation, a teacher forward) are kept for the last
        ``MAX_EVAL_PASSES`` such passes only: they matter only if the loss comes from one."""
        rec["pass"] = self._pass
        if self._pass not in self._cut_passes:
            done = [p for p in self._cut_passes if p in self._pass_out and not self._pass_out[p][0]]
            if len(done) >= MAX_EVAL_PASSES:
                drop = set(done[:len(done) - MAX_EVAL_PASSES + 1])
                self._cut = [c for c in self._cut if c["pass"] not in drop]
                for p in drop:
                    del self._cut_passes[p]
                    self._pass_out.pop(p, None)
                self._eval_ptrs = {k: p for k, p in self._eval_ptrs.items() if p not in drop}
        self._cut_passes[self._pass] = self._cut_passes.get(self._pass, 0) + 1
        self._cut.append(rec)

    def _detached_input(self, idx: int, src: int | None) -> None:
        """A module's first input is a float tensor without grad although autograd is
        recording and earlier outputs of this step required grad: the graph was cut
        before it. Confirmed (or dropped) in :meth:`after_backward`."""
        frame = _user_frame(sys._getframe(2))
        where = code = None
        if frame is not None:
            where, code = _where(frame.f_code, frame.f_lineno), _line_text(frame.f_code, frame.f_lineno)
            first, _ = _function_span(frame.f_code)
            for n in range(frame.f_lineno, max(first, frame.f_lineno - 200) - 1, -1):  # the cutting line
                text = linecache.getline(frame.f_code.co_filename, n).split("#", 1)[0]
                if _CUTTING.search(text):
                    where, code = f"{os.path.basename(frame.f_code.co_filename)}:{n}", text.strip()
                    break
        how = (f"its input shares memory with the output of {self._calls[src]}, which requires grad, but does "
               f"not require grad itself (a .detach() or .data between them)" if src is not None else
               "its input does not require grad although earlier outputs of this step did: the graph was cut "
               "before it (.detach(), .data, a NumPy round trip, or an op under torch.no_grad())")
        self._add_cut({"module": self._calls[idx], "call": idx, "how": "detached-input", "grad_enabled": True,
                          "source_module": self._calls[src] if src is not None else None,
                          "where": where, "code": code, "why": how})

    def _maybe_cut(self, module, args, idx: int, out=None) -> None:
        """A module's floating output needs no grad: a cut when an input or one of its own
        parameters required grad; otherwise its output is data (a frozen embedding's), and a
        later module taking it is no detached input (:meth:`_detached_input`)."""
        inputs_rg = any(t.requires_grad for t in _tensors(args))
        own = [p for p in module.parameters() if p.requires_grad]
        if not inputs_rg and not own:
            for t in _float_tensors(out):
                self._clean_ptrs.setdefault(_ptr(t), t)  # (the reference keeps the address from being reused)
            return
        frame = _user_frame(sys._getframe(1))
        code = _code_of(module)
        self._add_cut({
            "module": self._calls[idx] if 0 <= idx < len(self._calls) else self._names.get(id(module)),
            "call": idx, "how": "output-lost-grad_fn", "grad_enabled": torch.is_grad_enabled(),
            "inputs_require_grad": inputs_rg, "params_require_grad": len(own),
            "where": _where(frame.f_code, frame.f_lineno) if frame else None,
            "code": _line_text(frame.f_code, frame.f_lineno) if frame else None,
            "forward": _where(code, code.co_firstlineno) if code is not None else None,
            "why": ("autograd was not recording (torch.is_grad_enabled() is False) when it ran"
                    if not torch.is_grad_enabled() else
                    "its forward detached the result or ran part of it under torch.no_grad()")})

    def _check_loss_graph(self, loss: torch.Tensor) -> None:
        """A loss without ``grad_fn`` (stop), a leaf loss (record); passes reaching the loss."""
        if loss.grad_fn is not None:
            if self._cut_passes and any(self._pass_out.get(p, (True,))[0] for p in self._cut_passes
                                        if p not in self._judged):
                self._judged |= self._passes_reaching(loss.grad_fn)
        elif not loss.requires_grad:
            self._stop(*self._full_cut(loss))
        elif loss.is_leaf and not any(loss is p for _, p in self._trainable()):
            _, event = self._full_cut(loss)
            event["detail"].update(pytorch_error=None, loss_is_leaf=True)
            self._record(event, key=("graph_cut", "leaf-loss"))

    def _full_cut(self, loss: torch.Tensor) -> tuple[str, dict]:
        trainable = [n for n, _ in self._trainable()]
        first = self._first_cut()
        grad_on = torch.is_grad_enabled()
        if first is not None:
            where = first.get("where")
            what = f"the first module whose output lost grad_fn is {first['module']} ({where}): {first['why']}"
        else:
            where = _backward_caller()  # the line that called backward(): the loss is made just above it
            what = ("no module output lost grad_fn: the loss was computed from a detached tensor "
                    "(.detach(), .item(), .data, numpy) after the model's forward")
            if not self.armed and not self.compiled and not (loss.requires_grad and loss.is_leaf):
                first = {"module": "a module not known", "call": -1, "how": "unarmed", "grad_enabled": None,
                         "where": where, "code": None,
                         "why": ("optcheck's module hooks were not armed on this step (Monitor(hazards=\"always\") "
                                 "or soak --hazards always names the module)")}
                what = f"the module that lost grad_fn is not known: {first['why']}"
            if not self._calls and self.compiled:
                first = {"module": "the model's compiled forward", "call": -1, "how": "compiled",
                         "grad_enabled": None, "where": where, "code": None,
                         "why": ("torch.compile runs it without optcheck's module hooks, so the module is not "
                                 "known; it ran under torch.no_grad(), or the loss was computed from a "
                                 "detached output")}
                what = f"{first['module']} lost grad_fn: {first['why']}"
            if loss.requires_grad and loss.is_leaf:
                what = ("no module output lost grad_fn: the loss is a new leaf tensor that requires grad "
                        "(e.g. torch.tensor(loss.item(), requires_grad=True)), not connected to the model")
        detail = {"cut": "full", "loss_requires_grad": loss.requires_grad, "grad_enabled_at_loss": grad_on,
                  "armed": self.armed,
                  "first_module": first,
                  "modules_without_grad_fn": [c["module"] for c in self._judged_cuts(full=True)][:MAX_SAMPLES],
                  "n_params_without_grad": len(trainable), "params_without_grad": trainable[:MAX_SAMPLES],
                  "pytorch_error": "element 0 of tensors does not require grad and does not have a grad_fn"}
        event = {"kind": "graph_cut", "step": self._step, "where": where, "count": 1, "detail": detail}
        msg = f"step {self._step}: the loss has no grad_fn, backward() would raise; {what}"
        return msg, event

    def _passes_reaching(self, root) -> set[int]:
        """Passes with cut records whose output's ``grad_fn`` is reached from ``root`` (the
        loss's) through ``next_functions``; a pass still running counts as reaching it.
        Runs only when such records exist (a real cut, or an evaluation forward that kept
        grad on); cost: one walk of the loss's graph."""
        out = {p for p in self._cut_passes if p not in self._pass_out}
        want = {}
        for p, (rg, fns, _) in self._pass_out.items():
            for fn in fns if rg else ():
                want.setdefault(fn, set()).add(p)
        seen, todo = set(), [root]
        while todo and want and len(seen) < 200_000:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            hit = want.pop(node, None)
            if hit:
                out |= hit
            todo.extend(n for n, _ in getattr(node, "next_functions", ()))
        return out

    def _judged_cuts(self, full: bool, fed: bool = False) -> list[dict]:
        """The cut records that can explain a cut. A loss without ``grad_fn``: those of the
        last pass whose output did not require grad (the loss came from it). Otherwise: those
        of passes whose output reached a loss that was backwarded (through its graph, or saved
        by one of its ops, as a generator's no-grad output is by the discriminator), the last
        such pass first. A forward whose output never reaches a backward (validation,
        generation, an EMA or teacher forward) is evaluation, not a cut."""
        if full:
            done = [p for p in self._cut_passes if not self._pass_out.get(p, (False,))[0]]
            return [c for c in self._cut if c["pass"] == done[-1]] if done else []
        passes = sorted((p for p in self._cut_passes if p in self._judged or (fed and p in self._fed)), reverse=True)
        return [c for p in passes for c in self._cut if c["pass"] == p]

    def _first_cut(self, cuts: list[dict] | None = None) -> dict | None:
        cuts = self._judged_cuts(full=True) if cuts is None else cuts
        if not cuts:
            return None
        for c in cuts:  # a cut made while autograd was recording is the informative one
            if c["grad_enabled"] and (c.get("inputs_require_grad") or c["how"] == "detached-input"):
                return c
        return cuts[0]

    def _judge_at_backward(self, trainable: list[tuple[str, torch.Tensor]]) -> None:
        """Passes connected to this loss by its graph: judged now, then forgotten."""
        cuts = self._judged_cuts(full=False) if self._cut else []
        if cuts:
            starved = [(n, p) for n, p in trainable if p.grad is None]
            if starved:
                self._partial_cut(starved, cuts)
            done = {c["pass"] for c in cuts}
            self._cut = [c for c in self._cut if c["pass"] not in done]
            for p in done:
                self._cut_passes.pop(p, None)
                self._pass_out.pop(p, None)

    def _after_step(self, optimizer, args, kwargs) -> None:
        """Optimizer step post-hook: a no-grad forward whose output an op saved for backward
        (a generator run under ``no_grad`` whose output the discriminator's loss uses) is
        judged at the step of the watched optimizer, not at that backward (the discriminator's
        step legitimately leaves the generator without gradients): a partial cut when optimizer
        parameters at or before one of its cuts have no gradient when the optimizer steps."""
        if torch.compiler.is_compiling() or self._removed:
            return
        cuts = self._judged_cuts(full=False, fed=True) if self._cut else []
        self._forget_cuts()
        if cuts:
            starved = [(n, p) for n, p in self._trainable() if p.grad is None]
            if starved:
                self._partial_cut(starved, cuts)

    def _partial_cut(self, starved: list[tuple[str, torch.Tensor]], cuts: list[dict]) -> None:
        first_call = {}
        start = min(c["pass"] for c in cuts)  # the judged passes' calls only (not an earlier evaluation)
        for i in range(max(start, 0), len(self._calls)):
            first_call.setdefault(self._calls[i], i)

        def call_of(param_name: str) -> int | None:
            mod = param_name.rpartition(".")[0] or self._names[id(self.model)]
            while True:
                if mod in first_call:
                    return first_call[mod]
                if "." not in mod:
                    return None
                mod = mod.rpartition(".")[0]

        last_cut = max(c["call"] for c in cuts)
        prefixes = tuple(c["module"] + "." for c in cuts)
        affected = [n for n, _ in starved
                    if ((c := call_of(n)) is not None and c <= last_cut) or n.startswith(prefixes)]
        if not affected:
            return
        first = next((c for c in cuts if any(call_of(n) is not None and call_of(n) <= c["call"]
                                                   or n.startswith(c["module"] + ".") for n in affected)),
                     cuts[0])
        detail = {"cut": "partial", "first_module": first, "cuts": [c["module"] for c in cuts][:MAX_SAMPLES],
                  "n_cuts": len(cuts), "n_params_without_grad": len(affected),
                  "params_without_grad": affected[:MAX_SAMPLES]}
        event = {"kind": "graph_cut", "step": self._step, "where": first.get("where"), "count": 1, "detail": detail}
        key = ("graph_cut", first["module"], first["how"])
        named = set(affected)
        self._confirmed_cut(event, key, frozenset(id(p) for n, p in starved if n in named))  # arming.py
        self._record(event, key=key)
