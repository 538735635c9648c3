"""Update rules: does the optimizer really move the parameters it holds?

OC205 reads the version counter (``Tensor._version``) that every in-place
update bumps: ``torch.optim`` updates parameters in place under ``no_grad``
(``param.addcdiv_`` in ``torch/optim/adamw.py``), so a parameter that had a
gradient and kept its version across snapshots was not stepped.
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._events import events
from optcheck.rules.base import Rule, RuleContext, listing, register
from optcheck.snapshot import members


@register
class StalledParam(Rule):
    """A parameter the optimizer holds had gradients but did not change.

    Between consecutive post-step snapshots the step advanced and the parameter
    had a gradient, yet its version counter did not move: no in-place update
    touched it. Seen for ``RuleConfig.stalled_snapshots`` snapshot pairs in a row.

    Typical causes: ``optimizer.step()`` never called on the optimizer that holds
    them (called on another one), the step skipped every time (a gradient scaler
    that always finds inf), parameters skipped by the optimizer's own logic. (A
    learning rate of 0 is not caught: torch's optimizers still write in place.)

    Fix: call ``optimizer.step()`` after ``backward()`` on the optimizer that holds
    these parameters; check the learning-rate schedule. Training otherwise runs
    to the end without learning anything.
    """

    code, symbol, severity, family = "OC205", "stalled-param", "error", "gradients"
    message = "{n} parameter(s) with gradients were not updated over {k} snapshot(s) (since step {since}): {names}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        prev = ctx.previous
        memo = ctx.memo.setdefault(self.code, {})
        if prev is None or snap.get("phase") != "post-step" or prev.get("phase") != "post-step" \
                or snap["step"] <= prev["step"]:
            return []
        held = {m["ref"] for _, m in members(snap)} | {m["data_ptr"] for _, m in members(snap) if m.get("data_ptr")}
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
            if (old is None or p.get("version") is None or old.get("version") is None or not p["requires_grad"]
                    or p["grad"] != "set" or old["ref"] != p["ref"]
                    or not (p["ref"] in held or p["data_ptr"] in held)):
                runs.pop(p["name"], None)
                continue
            if p["version"] == old["version"]:
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
                                      names=listing(stalled)),
            subjects=stalled, key="stalled",
            next_failure="the run goes on to the end without these parameters learning anything",
            since_step=first)]


class _EventRule(Rule):
    """A rule that reports the first event of ``event_kind`` (recorded by a probe),
    with its step and how often it happened."""

    event_kind: str = ""
    next_failure: str = ""

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        evs = events(snap, self.event_kind)
        if not evs:
            return []
        e = evs[0]
        count = sum(x.get("count", 1) for x in evs)
        return [self.finding(snap, self.message.format(step=e.get("step"), count=count), key=self.event_kind,
                             next_failure=self.next_failure, first_step=e.get("step"), count=count,
                             **(e.get("detail") or {}))]


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
    message = "gradients of the previous step were still in .grad at backward (from step {step}, {count} time(s))"
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
    message = "{count} backward() calls without an optimizer.step() (since step {step})"
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
    message = "optimizer.step() found the gradients cleared after backward() (from step {step}, {count} time(s))"
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
    message = "optimizer.step() applied the previous gradients again (from step {step}, {count} time(s))"
    event_kind = "stale_grad_step"
    next_failure = "updates are repeated: an effectively larger, uneven learning rate"
