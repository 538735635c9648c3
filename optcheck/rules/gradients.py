"""Gradient rules OC201–OC203: do the parameters get the gradients the loss should give them?

OC201 and OC203 read the hazard events the PyTorch probes record
(``optcheck/pytorch/hazards/``; the TorchSharp bridge may record the same kinds);
OC202 reads the ``grad`` and ``grad_arrived`` fields of the snapshot's params, so it
works on any recorded stream.
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._events import events, names
from optcheck.rules._fixtures import (Invalid, Valid, at, cases, clean, edit, event, steps, with_events, with_grads,
                                      with_params)
from optcheck.rules.base import Rule, RuleContext, register
from optcheck.record.snapshot import members


@register
class NonleafGradAccess(Rule):
    """``.grad`` is read on a tensor that is not a leaf.

    Autograd fills ``.grad`` only on leaf tensors (parameters, tensors created by the
    user); on a non-leaf (the result of an op: activations, logits, a parameter that
    was rebuilt by ``.to()``) it stays ``None`` and every read warns "The .grad
    attribute of a Tensor that is not a leaf Tensor is being accessed". Code that
    logs or clips that ``None`` does nothing; code that steps it never trains. In
    seed 003 (TorchSharp) these warnings were the first sign that the model's
    parameters had been replaced by non-leaf tensors, 10,000 steps before the
    optimizer crashed.

    The finding gives the source line of the reads and how many there were since
    the previous snapshot.

    Fix: call ``t.retain_grad()`` before backward if the gradient of an
    intermediate is really wanted (or use a tensor hook); if the tensor was meant to
    be a parameter, make it a leaf (``nn.Parameter(t.detach())``) and rebuild the
    optimizer.
    """

    code, symbol, severity, family = "OC201", "nonleaf-grad-access", "warning", "gradients"
    message = "{count} .grad read(s) on non-leaf tensors at {where} {span} (always None)"

    @cases
    def VALID():
        return [
            Valid(steps(clean(10), 20), "no .grad read on a non-leaf"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((clean(10), with_events(at(clean(10), 20), event("nonleaf_grad_access", 11, "train.py:88", 10,
                                                                      code="g = logits.grad", last_step=20))),
                    "logits.grad read at every step", step=20, param="train.py:88"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        out = []
        for e in events(snap, "nonleaf_grad_access"):
            where = e.get("where") or "?"
            code = (e.get("detail") or {}).get("code")
            first, last = e.get("step"), (e.get("detail") or {}).get("last_step", e.get("step"))
            span = f"in steps {first}–{last}" if last != first else f"in step {first}"
            msg = self.message.format(count=e.get("count", 1), where=where, span=span) + (f": {code}" if code else "")
            out.append(self.finding(
                snap, msg, subjects=[where], key=where,
                next_failure="the value read is None: whatever uses it (logging, clipping, a manual update) "
                             "silently does nothing",
                count=e.get("count", 1), first_step=e.get("step"), event=e.get("detail")))
        return out


@register
class GradStarved(Rule):
    """A trainable parameter got no gradient for K consecutive snapshots.

    The parameter is in a param group and requires grad, yet at each of the last K
    post-step snapshots (``RuleConfig.grad_starved_snapshots``) its ``.grad`` was
    empty (or exactly zero): the optimizer skips it (or, with weight decay, only
    shrinks it). Where the snapshot says a gradient *arrived* during the step's
    backward passes (``grad_arrived``, recorded by ``optcheck.Monitor`` from
    autograd's post-accumulate-grad hooks), an empty ``.grad`` after the step is
    no finding: optimizers that consume the gradient inside ``step()`` and set
    ``.grad`` to None (heavyball) leave nothing for the snapshot to read. Causes: the graph is cut before it (a ``.detach()``, a cast under
    ``no_grad``, OC203), it is not used in the forward any more (a replaced module,
    a branch never taken), or it is a non-leaf tensor (OC105).

    Fix: find where its gradient stops (OC203 names the cut when the PyTorch hazard
    probes are on); freeze it (``requires_grad_(False)``) or remove it from the
    optimizer if it is not meant to train.
    """

    code, symbol, severity, family = "OC202", "grad-starved", "warning", "gradients"
    message = "{n} trainable parameter(s) got no gradient at the last {k} snapshots (steps {first}–{last}): {names}"

    @cases
    def VALID():
        return [
            Valid(steps(with_params(clean(), grad="none", grad_norm=None, requires_grad=False), 200, 300, 400),
                  "frozen parameters without a gradient"),
            Valid((clean(100), *(with_grads(at(clean(), s), ["layer1.weight"]) for s in (200, 300))),
                  "no gradient at two snapshots only (K = 3)"),
            Valid(tuple(edit(with_grads(at(clean(), s), ["layer1.weight"]), phase="pre-step") for s in (100, 200, 300)),
                  "pre-step snapshots (gradients not computed yet)"),
            Valid((clean(100), *(with_params(at(clean(), s), grad="none", grad_norm=None, grad_arrived=True)
                                 for s in (200, 300, 400))),
                  "the optimizer consumed .grad in step() (heavyball): the gradients arrived"),
            Valid((clean(100), *(with_params(with_grads(at(clean(), s), ["layer1.weight"]), shard_empty=True)
                                 for s in (200, 300, 400))),
                  "FSDP1 (use_orig_params): this rank's shard holds none of the parameters, no gradient here"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((clean(100), *(with_grads(at(clean(), s), ["layer1.weight"]) for s in (200, 300, 400))),
                    "a parameter the forward no longer uses", step=400, param="layer1.weight"),
            Invalid((clean(100), *(with_params(with_grads(at(clean(), s), ["layer1.weight"]), grad_arrived=False)
                                   for s in (200, 300, 400))),
                    "no gradient arrived (recorded by the Monitor)", step=400, param="layer1.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        k = max(1, ctx.config.grad_starved_snapshots)
        if snap.get("phase") != "post-step":
            return []
        window = [s for s in ctx.history if s.get("phase") == "post-step" and s.get("step", 0) > 0][-k:]
        if len(window) < k or window[-1] is not snap:
            return []
        trained_refs = {m["ref"] for _, m in members(snap)}
        trained_ptrs = {m.get("data_ptr") for _, m in members(snap) if m.get("data_ptr")}

        def starved(p: dict) -> bool:  # an exact zero that arrived is still no gradient
            return (p.get("grad") == "none" and not p.get("grad_arrived")) or p.get("grad_norm") == 0

        cand = {p["name"] for p in snap["params"] if p.get("requires_grad") and starved(p)
                and not p.get("shard_empty")  # FSDP1: none of it on this rank, no gradient here by design
                and (p["ref"] in trained_refs or (p.get("data_ptr") and p["data_ptr"] in trained_ptrs))}
        for s in window[:-1]:
            if not cand:
                break
            by_name = {p["name"]: p for p in s["params"]}
            cand = {n for n in cand if n in by_name and starved(by_name[n])}
        if not cand:
            return []
        lst = sorted(cand)
        return [self.finding(
            snap, self.message.format(n=len(lst), k=k, first=window[0]["step"], last=window[-1]["step"],
                                      names=names(lst)),
            subjects=lst, key=",".join(lst),
            next_failure="these parameters keep their values (weight decay aside: an optimizer skips a "
                         "parameter whose .grad is None, decays one whose .grad is zeros); nothing raises", snapshots=[s["step"] for s in window])]


@register
class GraphCut(Rule):
    """The autograd graph was cut: the loss, or a module's output, lost ``grad_fn``.

    Full cut: the loss has no ``grad_fn`` although parameters require grad, so
    ``backward()`` raises "element 0 of tensors does not require grad and does not
    have a grad_fn" (seeds 002, 004) — the PyTorch probes stop the step before that
    and name the first module whose output lost ``grad_fn``, and whether autograd
    was recording when it ran (a forward under ``torch.no_grad()`` /
    ``inference_mode``, a wrapper that disabled grad). Partial cut: the loss still
    has a ``grad_fn``, but a module's output lost it (a cast under ``no_grad``, a
    ``.detach()``, a checkpoint whose inputs do not require grad) and the optimizer
    parameters before it got no gradient at this step: training goes on silently
    without them. Leaf loss: the loss requires grad but is a new leaf tensor
    (``torch.tensor(loss.item(), requires_grad=True)``): ``backward()`` runs
    without error and no parameter gets a gradient.

    One finding per cut for the run: a cut that goes on, or comes back after steps that had their
    gradients, is reported once, at the first step it cut (the same kind of cut at the same module).

    Fix: run the training forward with grad enabled; do dtype casts outside
    ``no_grad`` (``x.float()`` is differentiable); remove the ``.detach()``/``.data``;
    build the loss from the model's output tensors, never from ``.item()``; with
    ``torch.utils.checkpoint(use_reentrant=True)`` make an input require grad
    (``enable_input_require_grads()``) or use ``use_reentrant=False``.
    """

    code, symbol, severity, family = "OC203", "graph-cut", "error", "gradients"
    message = "{what} at {where}: {module} {why}; {n} parameter(s) get no gradient: {names}"

    @cases
    def VALID():
        return [
            Valid(steps(clean(), 200), "the loss has a grad_fn"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((with_events(clean(500), event(
                "graph_cut", 500, "gpt.py:136", cut="full", n_params_without_grad=28,
                params_without_grad=["wte.weight", "wpe.weight"],
                first_module={"module": "wte", "why": "autograd was not recording", "grad_enabled": False},
                pytorch_error="element 0 of tensors does not require grad and does not have a grad_fn")),),
                "the forward ran under no_grad", step=500, param="wte.weight"),
            Invalid((with_events(clean(500), event(
                "graph_cut", 500, "gpt.py:87", cut="partial", n_params_without_grad=2,
                params_without_grad=["h.0.ln_1.weight", "h.0.ln_1.bias"],
                first_module={"module": "h.0.ln_1", "why": "ran under no_grad", "grad_enabled": True})),),
                "a cast under no_grad cuts the layers before it", step=500, param="h.0.ln_1.weight"),
            Invalid((clean(30), with_events(clean(38), event(
                "graph_cut", 37, "model.py:41", cut="partial", n_params_without_grad=2, named_at_step=38,
                params_without_grad=["inp.weight", "inp.bias"],
                first_module={"module": "mid", "why": "its input does not require grad", "grad_enabled": True})),),
                "named by the armed step after the first step without gradients: found at that first step",
                step=37, param="inp.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        out = []
        # one finding per cut (its kind and the module that lost grad_fn) for the run: a cut that goes on,
        # or comes back after steps with gradients (the probes then open a new event, at the first
        # gradless step again), is the same fault, already reported (issue 48)
        reported = ctx.memo.setdefault(self.code, {}).setdefault("reported", set())
        for e in events(snap, "graph_cut"):
            d = e.get("detail") or {}
            first = d.get("first_module") or {}
            full = d.get("cut") == "full"
            params = d.get("params_without_grad") or []
            n = d.get("n_params_without_grad", len(params))
            module = first.get("module") or "no module (the cut is between the model's output and the loss)"
            why = first.get("why") or ""
            msg = self.message.format(
                what="loss has no grad_fn" if full else "graph cut", where=e.get("where") or "?",
                module=module, why=f"lost grad_fn: {why}" if first else "", n=n,
                names=names(params) + ("" if len(params) >= n else f" (+{n - len(params)} more)")).replace(" ;", ";")
            f = self.finding(
                snap, msg, subjects=params, key=f"{d.get('cut')}:{module}",
                next_failure=(f"backward() raises RuntimeError: {d.get('pytorch_error')}"
                              if full and d.get("pytorch_error") else
                              "backward() runs, but no parameter gets a gradient: the model stops training "
                              "without an error" if full else f"{n} parameter(s) silently stop training"),
                cut=d.get("cut"), first_step=e.get("step"), module=first.get("module"),
                grad_enabled=first.get("grad_enabled"), cuts=d.get("cuts"), n_params_without_grad=n)
            if d.get("named_at_step") and isinstance(e.get("step"), int):
                # the PyTorch probes named it on an armed step after the first step without gradients
                # (docs/hazards.md, "Armed on demand"): the finding is at that first step
                f.step = e["step"]
                f.detail["named_at_step"] = d["named_at_step"]
            if f.key in reported:
                continue
            reported.add(f.key)
            out.append(f)
        return out
