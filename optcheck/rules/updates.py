"""Update rules OC204–OC208 (family "updates"): does every ``optimizer.step()`` apply
one fresh gradient, and does it really move the parameters it holds?

OC204, OC206, OC207 and OC208 read the events of the gradient-flow probe
(``optcheck/pytorch/grad_clear.py``, ``optcheck.Monitor``): gradients not cleared,
no step, cleared before the step, applied twice. OC205 asks three signals, any one
of which says "this parameter was updated" between two snapshots (``docs/parameter-identity.md``):

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
from optcheck.rules._fixtures import Invalid, Valid, at, cases, clean, event, steps, with_events, with_lr, with_params
from optcheck.rules._identity import identity_by_ref
from optcheck.rules.base import Rule, RuleContext, listing, register
from optcheck.record.snapshot import members

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

    code, symbol, severity, family = "OC205", "stalled-param", "error", "updates"
    message = ("{n} parameter(s) had gradients but were not updated from step {since} to step {step} "
               "({k} snapshot intervals in a row: same values, version counter and optimizer step count): {names}")

    @cases
    def VALID():
        return [
            Valid(steps(clean(), 200, 300, 400), "every step bumps the version counters"),
            Valid((clean(), *(with_params(at(clean(), s), version=1, checksum=s) for s in (200, 300, 400))),
                  "a fused step: the values move, the version counter does not"),
            Valid(tuple(with_lr(with_params(at(clean(), s), version=1), 0.0) for s in (100, 200, 300, 400)),
                  "a learning rate of 0 (warm-up from 0)"),
            Valid(tuple(with_params(at(clean(), s), version=1, grad="none", grad_norm=None) for s in (100, 200, 300)),
                  "no gradient: nothing to apply"),
        ]

    @cases
    def INVALID():
        return [
            Invalid(tuple(with_params(at(clean(), s), version=1) for s in (100, 200, 300, 400)),
                    "step() never called on the optimizer holding them", step=300, param="layer0.weight"),
        ]

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
            had_grad = p["grad"] == "set" or p.get("grad_arrived")  # (heavyball sets .grad None in step())
            if (old is not None and p["requires_grad"] and had_grad and old["ref"] == p["ref"]
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
    up to the snapshot's step.

    The message is ``what`` and then where: "at step 2" when the event was first seen
    at the snapshot's own step (the usual case: the finding comes at once), else
    "from step 2: at 9 of the 19 optimizer steps checked up to step 20" (or "at every
    one of the 19 ...", or without "of the N" for streams recorded before the events
    carried ``steps``)."""

    event_kind: str = ""
    next_failure: str = ""
    #: the sentence before "at step N" / "from step N: ..."; empty: ``message`` says it all
    what: str = ""

    def describe(self, step, count: int, steps: int | None, last: int) -> str:
        """The message for an event first seen at ``step``, ``count`` times in ``steps`` checked, up to ``last``."""
        if not self.what:
            return self.message.format(step=step, count=count, steps=steps, last=last)
        if step == last:
            return f"{self.what} at step {step}"
        if steps is None:
            return f"{self.what}, from step {step}: at {count} optimizer step(s) up to step {last}"
        if count == steps:
            return (f"{self.what}, from step {step}: at every one of the {steps} optimizer steps checked "
                    f"up to step {last}")
        return f"{self.what}, from step {step}: at {count} of the {steps} optimizer steps checked up to step {last}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        evs = events(snap, self.event_kind)
        if not evs:
            return []
        e = evs[0]
        count = sum(x.get("count", 1) for x in evs)
        detail = dict(e.get("detail") or {})
        steps = detail.pop("steps", None)
        return [self.finding(snap, self.describe(e.get("step"), count, steps, snap["step"]),
                             key=self.event_kind, next_failure=self.next_failure, first_step=e.get("step"),
                             count=count, steps_checked=steps, **detail)]


@register
class GradNotCleared(_EventRule):
    """Gradients were not cleared between optimizer steps.

    The first ``backward()`` after an ``optimizer.step()`` found the previous
    step's gradient still in ``.grad``: every step adds its gradient to the sum of
    all earlier ones, so each update follows that sum (an undamped momentum)
    instead of the current gradient: with SGD the steps grow, with Adam they keep
    pointing where the sum points; the loss oscillates, diverges, or settles elsewhere.

    Fix: call ``optimizer.zero_grad()`` (or ``model.zero_grad()``) once per
    optimizer step, before ``backward()`` or right after ``step()``. Deliberate
    gradient accumulation over micro-batches is fine and is not reported.
    """

    code, symbol, severity, family = "OC204", "grad-not-cleared", "error", "updates"
    what = "gradients of the previous step were still in .grad at backward()"
    message = what + ", from step {step}: at {count} of the {steps} optimizer steps checked up to step {last}"
    event_kind = "grad_not_cleared"
    next_failure = ("each step() uses the sum of every gradient since the last clear, not this step's (an undamped "
                    "momentum): the updates stop following the current loss; it oscillates, diverges or settles "
                    "elsewhere than with cleared gradients, depending on the optimizer and learning rate")

    @cases
    def VALID():
        return [
            Valid(steps(clean(2), 10, 20), "zero_grad() at every step"),
        ]

    @cases
    def INVALID():
        return [
            Invalid(tuple(with_events(at(clean(2), s), event("grad_not_cleared", 2, count=n, shape=[2], steps=n))
                          for s, n in ((2, 1), (10, 9), (20, 19))), "zero_grad() never called", step=2),
        ]


@register
class NoOptimizerStep(_EventRule):
    """Backward passes run, but the optimizer never steps.

    ``backward()`` was called many times (event ``no_optimizer_step``, recorded by
    ``optcheck.Monitor``) without a single optimizer step in between: no
    ``optimizer.step()``, and no update inside backward either (an optimizer stepped
    from gradient hooks, ``optcheck/pytorch/in_backward.py``): gradients are
    computed and thrown away, and the model never changes.

    Fix: call ``optimizer.step()`` after ``backward()`` (for gradient accumulation,
    once every N micro-batches), on the optimizer the monitor watches; for an
    optimizer that steps in backward, register its hooks (optimi's
    ``prepare_for_gradient_release``, the recipe's ``register_post_accumulate_grad_hook``).
    """

    code, symbol, severity, family = "OC206", "no-optimizer-step", "error", "updates"
    message = ("{count} backward() call(s) in a row without an optimizer step (no optimizer.step(), no update "
               "inside backward) (from step {step})")
    event_kind = "no_optimizer_step"
    next_failure = "the model keeps its initial weights for the whole run"

    @cases
    def VALID():
        return [
            Valid(steps(clean(10), 20), "a step after every backward()"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((clean(10), with_events(at(clean(10), 20), event("no_optimizer_step", 11, count=10))),
                    "backward() without optimizer.step()", step=20),
        ]


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

    code, symbol, severity, family = "OC207", "grad-cleared-before-step", "error", "updates"
    what = "optimizer.step() found the gradients cleared after backward()"
    message = what + ", from step {step}: at {count} of the {steps} optimizer steps checked up to step {last}"
    event_kind = "grad_cleared_before_step"
    next_failure = "no update uses a gradient: the loss does not fall"

    @cases
    def VALID():
        return [
            Valid(steps(clean(10), 20), "zero_grad() before backward()"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((clean(10), with_events(at(clean(10), 20),
                                                    event("grad_cleared_before_step", 11, count=9, steps=10))),
                    "zero_grad() between backward() and step()", step=20),
        ]


@register
class StaleGradStep(_EventRule):
    """``optimizer.step()`` ran without a fresh gradient since the previous step.

    No gradient flowed into any parameter between two ``optimizer.step()`` calls,
    yet ``.grad`` is set: the previous gradients are applied again — ``step()``
    called twice per iteration, or ``backward()`` skipped on some path. Adam's
    moment estimates and step count drift from the data.

    Fix: one ``optimizer.step()`` per ``backward()`` (or per accumulation window).
    """

    code, symbol, severity, family = "OC208", "stale-grad-step", "error", "updates"
    what = "optimizer.step() applied the previous gradients again"
    message = what + ", from step {step}: at {count} of the {steps} optimizer steps checked up to step {last}"
    event_kind = "stale_grad_step"
    next_failure = "updates are repeated: an effectively larger, uneven learning rate"

    @cases
    def VALID():
        return [
            Valid(steps(clean(10), 20), "one step per backward()"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((with_events(clean(2), event("stale_grad_step", 2, count=1, steps=1)),),
                    "optimizer.step() twice per iteration", step=2),
        ]


@register
class OptimizerSwitched(Rule):
    """Another optimizer now steps the watched parameters.

    ``optcheck.Monitor`` watches one optimizer; an optimizer built mid-run over the same
    parameters (a fine-tuning recipe: AdamW, then SGD) moves them while the watched one
    stops stepping. Recorded by the Monitor's global step hooks
    (``torch.optim.optimizer.register_optimizer_step_post_hook``,
    ``optcheck/pytorch/step_hooks.py`` ``StepWatch``): the new optimizer's steps
    are counted as the training steps (snapshots, the identity check before each step,
    the gradient-flow checks), so nothing reports "no optimizer step", and from its first
    step on it is the watched optimizer: snapshots read its param groups and state, so
    the reference and state rules judge the optimizer that trains the model
    (``optcheck/pytorch/step_hooks.py``). Not reported for an inner optimizer sharing
    the watched one's param groups (SAM's ``base_optimizer``).

    Fix: nothing, when the swap is meant.
    """

    code, symbol, severity, family = "OC209", "optimizer-switched", "info", "updates"
    message = ("the watched {watched} stopped stepping after step {before}; {stepping} moves {n} of its "
               "parameters from step {step}: it is watched from then on")

    @cases
    def VALID():
        return [
            Valid(steps(clean(10), 20), "the watched optimizer steps"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((clean(10), with_events(at(clean(10), 11), event(
                "optimizer_switched", 11, watched="AdamW", stepping="SGD", params=4, steps_before=10))),
                "AdamW swapped for SGD after step 10", step=11),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        out = []
        for e in events(snap, "optimizer_switched"):
            d = e.get("detail") or {}
            out.append(self.finding(
                snap, self.message.format(watched=d.get("watched", "?"), before=d.get("steps_before", "?"),
                                          stepping=d.get("stepping", "?"), n=d.get("params", "?"),
                                          step=e.get("step")),
                key=f"{d.get('stepping')}", first_step=e.get("step"),
                next_failure="none from the swap; snapshots read the new optimizer's param groups and state "
                             "from this step on", **{k: d.get(k) for k in ("watched", "stepping", "params")}))
        return out
