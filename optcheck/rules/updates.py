"""Update rules: does the optimizer really move the parameters it holds?

OC205 asks three signals, any one of which says "this parameter was updated"
between two snapshots (``docs/parameter-identity.md``):

- its values: ``checksum`` (the sum of the values' bit patterns, recorded by the
  probe) changed. Every implementation changes values, including fused kernels
  (``torch.optim.AdamW(fused=True)``), which do not bump the version counter;
- its version counter (``Tensor._version``) moved: an in-place write happened,
  even one whose result rounded back to the same values (bf16, a learning rate
  of 0, weight decay of 0);
- the optimizer's per-parameter step count (``state[p]["step"]``) advanced: the
  optimizer stepped it, whatever the update rounded to.

A parameter is reported only when every signal it has stayed put.
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._events import events
from optcheck.rules.base import Rule, RuleContext, listing, register
from optcheck.rules.references import identity_by_ref
from optcheck.snapshot import members

_LOW_PRECISION = ("bfloat16", "float16")


def _moved(p: dict, old: dict, step_now: int | None, step_before: int | None) -> bool | None:
    """True if any signal says ``p`` was updated since ``old``; False if the values
    or the version counter were recorded and every signal stayed put; None if
    nothing can be told (a snapshot without either, e.g. TorchSharp's today)."""
    told = False
    for key in ("checksum", "version"):
        a, b = old.get(key), p.get(key)
        if a is not None and b is not None:
            if a != b:
                return True
            told = True
    if step_now is not None and step_before is not None:
        if step_now != step_before:
            return True
    elif p.get("dtype") in _LOW_PRECISION:
        # no step count to ask, and 16-bit rounding can swallow every update of a
        # step (a LayerNorm weight of 1.0 in bf16 moves only by steps >= 2**-8):
        # unchanged values do not prove the optimizer skipped it
        return None
    return False if told else None


@register
class StalledParam(Rule):
    """A parameter the optimizer holds had gradients but was not updated.

    Between consecutive post-step snapshots the step advanced and the parameter
    had a gradient, yet nothing shows an update: its values are bit-for-bit the
    same (``checksum``), its version counter did not move, and the optimizer's
    step count for it (where it keeps one) did not advance. Seen for
    ``RuleConfig.stalled_snapshots`` snapshot intervals in a row.

    Not reported: a learning rate of 0 in its param group (a warm-up from 0), a
    16-bit parameter whose optimizer keeps no step count (rounding can swallow
    its updates), a parameter without a gradient.

    Typical causes: ``optimizer.step()`` never called on the optimizer that holds
    them (called on another one), the step skipped every time (a gradient scaler
    that always finds inf), parameters skipped by the optimizer's own logic.

    Fix: call ``optimizer.step()`` after ``backward()`` on the optimizer that holds
    these parameters; check the learning-rate schedule. Training otherwise runs
    to the end without learning anything.
    """

    code, symbol, severity, family = "OC205", "stalled-param", "error", "gradients"
    message = ("{n} parameter(s) had gradients but were not updated from step {since} to step {step} "
               "({k} snapshot intervals in a row: same values, version counter and optimizer step count): {names}")

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        prev = ctx.previous
        memo = ctx.memo.setdefault(self.code, {})
        if prev is None or snap.get("phase") != "post-step" or prev.get("phase") != "post-step" \
                or snap["step"] <= prev["step"]:
            return []
        held = {m["ref"] for _, m in members(snap)}
        held_ptrs = set() if identity_by_ref(snap) else {  # TorchSharp: a handle on a member's data is that member
            m["data_ptr"] for _, m in members(snap) if m.get("data_ptr")}
        lr_zero = {m["ref"] for g in snap["groups"] for m in g.get("members", ())
                   if (g.get("options") or {}).get("lr") == 0}
        steps_now = {s["ref"]: s.get("step") for s in snap.get("state") or ()}
        steps_before = {s["ref"]: s.get("step") for s in prev.get("state") or ()}
        before = {p["name"]: p for p in prev["params"]}
        runs: dict[str, int] = memo.setdefault("runs", {})
        since: dict[str, int] = memo.setdefault("since", {})
        seen_refs: set = set()
        stalled = []
        for p in snap["params"]:
            old = before.get(p["name"])
            if p["ref"] in seen_refs:  # a tied alias: judged once
                continue
            seen_refs.add(p["ref"])
            moved = None
            if (old is not None and p["requires_grad"] and p["grad"] == "set" and old["ref"] == p["ref"]
                    and p["ref"] not in lr_zero and (p["ref"] in held or p["data_ptr"] in held_ptrs)):
                moved = _moved(p, old, steps_now.get(p["ref"]), steps_before.get(p["ref"]))
            if moved is False:
                runs[p["name"]] = runs.get(p["name"], 0) + 1
                since.setdefault(p["name"], prev["step"])
                if runs[p["name"]] >= ctx.config.stalled_snapshots:
                    stalled.append(p["name"])
            else:
                runs.pop(p["name"], None)
                since.pop(p["name"], None)
        if not stalled:
            return []
        first = min(since[n] for n in stalled)
        return [self.finding(
            snap, self.message.format(n=len(stalled), k=ctx.config.stalled_snapshots, since=first,
                                      step=snap["step"], names=listing(stalled)),
            subjects=stalled, key="stalled",
            next_failure="the run goes on to the end without these parameters learning anything",
            since_step=first)]


class _EventRule(Rule):
    """A rule that reports the first event of ``event_kind`` (recorded by a probe)
    with the step it was first seen and how often it happened: ``count`` optimizer
    steps out of ``detail["steps"]`` checked since (``optcheck/pytorch/grad_clear.py``),
    up to the snapshot's step."""

    event_kind: str = ""
    next_failure: str = ""
    #: for streams whose events carry no ``steps`` (recorded before they did)
    message_count_only: str = ""

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        evs = events(snap, self.event_kind)
        if not evs:
            return []
        e = evs[0]
        count = sum(x.get("count", 1) for x in evs)
        detail = dict(e.get("detail") or {})
        steps = detail.pop("steps", None)
        template = self.message if steps is not None else self.message_count_only
        return [self.finding(snap, template.format(step=e.get("step"), count=count, steps=steps, last=snap["step"]),
                             key=self.event_kind, next_failure=self.next_failure, first_step=e.get("step"),
                             count=count, steps_checked=steps, **detail)]


@register
class GradNotCleared(_EventRule):
    """Gradients were not cleared between optimizer steps.

    The first ``backward()`` after an ``optimizer.step()`` found the previous
    step's gradient still in ``.grad``: every step adds its gradient to the sum of
    all earlier ones, so updates grow and point the wrong way, and the loss
    diverges or stalls a few hundred steps later.

    Fix: call ``optimizer.zero_grad()`` (or ``model.zero_grad()``) once per
    optimizer step, before ``backward()`` or right after ``step()``. Deliberate
    gradient accumulation over micro-batches is fine and is not reported.
    """

    code, symbol, severity, family = "OC204", "grad-not-cleared", "error", "gradients"
    message = ("gradients of the previous step were still in .grad at backward(), from step {step}: "
               "at {count} of the {steps} optimizer step(s) checked up to step {last}")
    message_count_only = ("gradients of the previous step were still in .grad at backward(), from step {step}: "
                          "at {count} optimizer step(s) up to step {last}")
    event_kind = "grad_not_cleared"
    next_failure = "gradients accumulate across steps: updates grow until the loss diverges"


@register
class NoOptimizerStep(_EventRule):
    """Backward passes run, but the optimizer never steps.

    ``backward()`` was called many times (event ``no_optimizer_step``, recorded by
    ``optcheck.Monitor``) without a single ``optimizer.step()`` in between:
    gradients are computed and thrown away, and the model never changes.

    Fix: call ``optimizer.step()`` after ``backward()`` (for gradient accumulation,
    once every N micro-batches), on the optimizer the monitor watches.
    """

    code, symbol, severity, family = "OC206", "no-optimizer-step", "error", "gradients"
    message = "{count} backward() call(s) in a row without an optimizer.step() (from step {step})"
    message_count_only = message
    event_kind = "no_optimizer_step"
    next_failure = "the model keeps its initial weights for the whole run"


@register
class GradClearedBeforeStep(_EventRule):
    """Gradients were cleared between ``backward()`` and ``optimizer.step()``.

    Gradients flowed into the parameters, but when ``optimizer.step()`` ran they
    were gone (``.grad`` None, or zeroed): ``zero_grad()`` sits between
    ``backward()`` and ``step()``. AdamW then skips every parameter (or only decays
    the weights): the model does not learn.

    Fix: order the step as ``zero_grad()``, forward, ``backward()``, ``step()``
    (or ``backward()``, ``step()``, ``zero_grad()``).
    """

    code, symbol, severity, family = "OC207", "grad-cleared-before-step", "error", "gradients"
    message = ("optimizer.step() found the gradients cleared after backward(), from step {step}: "
               "at {count} of the {steps} optimizer step(s) checked up to step {last}")
    message_count_only = ("optimizer.step() found the gradients cleared after backward(), from step {step}: "
                          "at {count} optimizer step(s) up to step {last}")
    event_kind = "grad_cleared_before_step"
    next_failure = "no update uses a gradient: the loss does not fall"


@register
class StaleGradStep(_EventRule):
    """``optimizer.step()`` ran without a fresh gradient since the previous step.

    No gradient flowed into any parameter between two ``optimizer.step()`` calls,
    yet ``.grad`` is set: the previous gradients are applied again — ``step()``
    called twice per iteration, or ``backward()`` skipped on some path. Adam's
    moment estimates and step count drift from the data.

    Fix: one ``optimizer.step()`` per ``backward()`` (or per accumulation window).
    """

    code, symbol, severity, family = "OC208", "stale-grad-step", "error", "gradients"
    message = ("optimizer.step() applied the previous gradients again, from step {step}: "
               "at {count} of the {steps} optimizer step(s) checked up to step {last}")
    message_count_only = ("optimizer.step() applied the previous gradients again, from step {step}: "
                          "at {count} optimizer step(s) up to step {last}")
    event_kind = "stale_grad_step"
    next_failure = "updates are repeated: an effectively larger, uneven learning rate"
