"""Memory rule OC401: does memory keep growing with the step count?

Reads the ``memory`` block of every snapshot (``optcheck.record.snapshot``: every field
optional) and tests each metric for a sustained upward trend against the step.
Torch-free: it sees numbers only.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from optcheck.findings import Finding
from optcheck.rules._fixtures import Invalid, Valid, cases, memory_stream, wobble
from optcheck.rules._memory_shapes import (STEADY_MIN_INTERVAL_STEPS, STEADY_MIN_RISE_BYTES, Shift, Steady,
                                           level_shift, steady_growth, thin)
from optcheck.rules._memory_trend import RETEST_FRACTION, Trend, _stats, find_trend, window_trend  # noqa: F401
from optcheck.rules.base import Rule, RuleConfig, RuleContext, register
from optcheck.record.snapshot import to_float
from optcheck.units import format_bytes, format_steps, round_sig

MiB = 2**20

#: metric -> (label in messages, unit kind). Byte metrics use
#: ``RuleConfig.memory_min_growth_bytes_per_1k_steps``; the others their own floor.
METRICS: dict[str, tuple[str, str]] = {
    "rss_bytes": ("RSS", "bytes"),
    "live_tensor_bytes": ("live tensor memory", "bytes"),
    "state_bytes": ("optimizer state memory", "bytes"),
    "managed_bytes": (".NET managed heap", "bytes"),
    "device_allocated_bytes": ("device allocated memory", "bytes"),
    "device_reserved_bytes": ("device reserved memory", "bytes"),
    "live_tensors": ("live tensor count", "tensors"),
    "device_alloc_retries": ("device allocation retry count", "retries"),
    "heap_in_use_bytes": ("malloc heap in use", "bytes"),
}

#: Exact metrics (a count, or bytes an allocator hands out): a leak raises them by the
#: same amount between snapshots, so :func:`steady_growth` finds it in a few snapshots.
#: RSS, the .NET heap and device *reserved* bytes wander; they keep the slow trend test.
EXACT = ("live_tensors", "heap_in_use_bytes", "live_tensor_bytes", "state_bytes", "device_allocated_bytes")

#: Default floors for the count metrics, per 1,000 steps (override with
#: ``RuleConfig.extra["memory_min_growth_tensors_per_1k_steps"]`` / ``..._retries_...``).
MIN_GROWTH_TENSORS_PER_1K_STEPS = 100.0
MIN_GROWTH_RETRIES_PER_1K_STEPS = 10.0


def _min_growth_per_1k(kind: str, config: RuleConfig) -> float:
    if kind == "bytes":
        return float(config.memory_min_growth_bytes_per_1k_steps)
    if kind == "tensors":
        return float(config.extra.get("memory_min_growth_tensors_per_1k_steps", MIN_GROWTH_TENSORS_PER_1K_STEPS))
    return float(config.extra.get("memory_min_growth_retries_per_1k_steps", MIN_GROWTH_RETRIES_PER_1K_STEPS))


def _budget(metric: str, config: RuleConfig) -> int | None:
    if metric == "rss_bytes":
        return config.memory_budget_bytes
    if metric.startswith("device_") and metric.endswith("_bytes"):
        return config.extra.get("memory_device_budget_bytes")
    return None


def _amount(value: float, kind: str) -> str:
    if kind == "bytes":
        return format_bytes(value)
    return f"{value:,.0f} {kind}"


@register
class MemoryGrowth(Rule):
    """Memory keeps growing with the step count: a leak that ends the run later.

    Three shapes, checked in this order, each metric reported once:

    1. **Steady rise of an exact metric** (live tensor count and bytes, malloc heap
       in use, optimizer state bytes, device allocated bytes), at every snapshot:
       the last three intervals between snapshots all rise, by the same amount per
       step within ±50 %, at least the floors below, from the highest value seen so
       far, and each rise is 3x the wobble of the earlier rises. A list that gets one
       tensor per step does exactly that; jitter does not. Byte metrics compare
       snapshots >= 50 steps apart that differ by >= 1 MiB (the monitor's own
       bounded history stays below that). "live tensor count rises by 1 tensor per
       step at every snapshot (steps 500-800: 111 -> 411 tensors); RSS +1.7 MiB per
       step over the same steps" — found three snapshots after the leak starts.
    2. **RSS level shift**: a jump of >= 256 MiB and >= half the level, 8x the
       earlier snapshot-to-snapshot wobble, flat before and still there one snapshot
       later, is reported as what it is: "RSS rose by 1.3 GiB between steps 500 and
       600 (302.9 MiB -> 1.6 GiB) and stayed", not as a slow trend with a far
       projection.
    3. **Slow trend** of any metric (RSS and the .NET heap wander, so they take only
       this path): the rule fits a robust trend of value against step and fires when all of these hold
    after the warm-up (``RuleConfig.memory_warmup_fraction`` of the steps so far,
    default the first 20 %) over at least ``memory_min_snapshots`` snapshots:

    - Kendall's tau of value against step is positive with p < ``memory_alpha``
      (Mann–Kendall trend test; default 0.001);
    - the Theil–Sen slope (median of pairwise slopes; outliers and a single jump
      barely move it) is at least ``memory_min_growth_bytes_per_1k_steps`` (default
      8 MiB per 1,000 steps) for byte metrics, **100 tensors per 1,000 steps** for the
      live tensor count (one tensor kept every 10 steps; a PyTorch or TorchSharp
      step makes and frees hundreds, so a smaller drift is noise) and 10 retries
      per 1,000 steps for device allocation retries;
    - the rise across the window is at least 3x the robust scale of the residuals,
      and each half of the window rises on its own — a one-off step up (the first
      validation pass, an allocator plateau) leaves one half flat and stays silent.

    With ``--memory-budget`` (``RuleConfig.memory_budget_bytes``) the finding for
    RSS projects the step at which the trend line crosses the budget: "RSS grows
    41.2 MiB per 1,000 steps; exceeds the 4 GiB budget at step ~183,000".

    Typical causes: keeping tensors that hold a graph (``losses.append(loss)``
    instead of ``loss.item()``), a cache or history appended every step, hooks
    that store activations, TorchSharp tensors created outside a ``DisposeScope``
    (OC402 names that case, ``docs/memory.md``), an optimizer
    whose state grows (parameters added every step).

    Fix: store Python numbers (``loss.item()``) or ``detach()``-ed tensors; bound
    caches; in TorchSharp wrap each step in ``torch.NewDisposeScope()``. The
    finding names the metric; compare ``live_tensors`` with ``rss_bytes`` to tell
    tensors from other allocations.

    Cost: the series are kept in the rule's memo (O(1) per snapshot); a metric is
    re-tested when its series grew by 4 % (and at the final snapshot), on at most
    400 evenly spaced points, so 20,000 snapshots cost a few seconds in all.
    """

    code, symbol, severity, family = "OC401", "memory-growth", "warning", "memory"
    message = "{label} grows {rate} per 1,000 steps"

    def _series(self, snap: dict, ctx: RuleContext) -> dict:
        memo = ctx.memo.setdefault(self.code, {})
        if "steps" not in memo or (memo["steps"] and snap["step"] < memo["steps"][-1]):
            # first call (or a new run in the same engine): start from the history
            memo.update(steps=[], values={m: [] for m in METRICS}, tested={}, fired=set())
            feed = ctx.history if ctx.history and ctx.history[-1] is snap else [*ctx.history, snap]
        else:
            feed = [snap]
        for s in feed:
            mem = s.get("memory") or {}
            memo["steps"].append(float(s["step"]))
            for metric, vals in memo["values"].items():
                try:
                    v = to_float(mem.get(metric))
                except (TypeError, ValueError):
                    v = None
                vals.append(math.nan if v is None else v)
        return memo

    @cases
    def VALID():
        return [
            Valid(memory_stream(range(50, 3001, 50), rss_bytes=lambda s: 400 * MiB + wobble(s, 2 * MiB)),
                  "RSS wobbling around a level"),
            Valid(memory_stream(range(50, 3001, 50),
                                rss_bytes=lambda s: 400 * MiB + wobble(s, 2 * MiB) + (64 * MiB if s >= 1500 else 0)),
                  "RSS steps up once (the first validation pass) and stays"),
            Valid(memory_stream(range(50, 3001, 50),
                                rss_bytes=lambda s: (400 * MiB + 200 * MiB * (1 - math.exp(-s / 150))
                                                     + wobble(s, 2 * MiB))),
                  "an allocator warming up to a plateau"),
            Valid(memory_stream(range(100, 1001, 100), live_tensors=lambda s: 110 + (s // 100) % 3),
                  "a live tensor count that jitters"),
        ]

    @cases
    def INVALID():
        return [
            Invalid(memory_stream(range(100, 1001, 100), live_tensors=lambda s: 110 + max(0, s - 500)),
                    "one tensor kept per step from step 500 (losses.append(loss))", step=800, param="live_tensors"),
            Invalid(memory_stream(range(50, 3001, 50),
                                  rss_bytes=lambda s: 400 * MiB + 100_000 * s + wobble(s, 2 * MiB)),
                    "RSS growing 100 kB per step under 2 MiB of wobble", step=700, param="rss_bytes"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        memo = self._series(snap, ctx)
        cfg = ctx.config
        out = []
        final = snap.get("trigger") == "final"
        for metric, (label, kind) in METRICS.items():
            if metric in memo["fired"]:
                continue
            vals = memo["values"][metric]
            if math.isnan(vals[-1]) and not final:
                continue
            min_slope = _min_growth_per_1k(kind, cfg) / 1000.0
            fast = self._fast(memo, metric, min_slope, cfg) if not math.isnan(vals[-1]) else None
            if fast is not None:
                found = fast(snap, metric, label, kind)
                # the bytes a count leak holds are named in its finding: one leak, one finding
                memo["fired"].update(filter(None, (metric, found.detail.get("bytes_metric"))))
                out.append(found)
                continue
            n = len(vals)
            last = memo["tested"].get(metric, 0)
            if not final and n - last < max(1, int(n * RETEST_FRACTION)):
                continue
            memo["tested"][metric] = n
            trend = find_trend(memo["steps"], vals, min_slope=min_slope, alpha=cfg.memory_alpha,
                               min_points=cfg.memory_min_snapshots, warmup_fraction=cfg.memory_warmup_fraction)
            if trend is None:
                continue
            if kind == "bytes" and trend.end_step - trend.start_step < cfg.memory_min_span_steps:
                # allocator warm-up (RSS, heaps) moves megabytes in the first hundreds of steps of
                # any process: a byte trend must hold over a span of steps before it is a leak
                continue
            memo["fired"].add(metric)
            out.append(self._finding(snap, metric, label, kind, trend, _budget(metric, cfg)))
        return out

    @staticmethod
    def _points(memo: dict, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """The metric's finite points after step 0 (the start snapshot precedes any step)."""
        x = np.asarray(memo["steps"], float)
        y = np.asarray(memo["values"][metric], float)
        ok = np.isfinite(y) & (x >= 1)
        return x[ok], y[ok]

    def _fast(self, memo: dict, metric: str, min_slope: float, cfg: RuleConfig):
        """A finding-maker when the latest snapshots already show the leak's shape: a steady
        rise of an exact metric, or an RSS level shift that stayed; else None."""
        if metric in EXACT:
            x, y = self._points(memo, metric)
            min_rise = 0.0
            if METRICS[metric][1] == "bytes":
                # compare snapshots >= 50 steps apart by >= 1 MiB: a loop's own small, bounded
                # retention (the monitor's last 64 snapshots) cannot rise three times in a row
                x, y = thin(x, y, STEADY_MIN_INTERVAL_STEPS)
                min_rise = STEADY_MIN_RISE_BYTES
            steady = steady_growth(x, y, min_rate=min_slope, min_rise=min_rise)
            if steady is not None:
                return lambda snap, m, label, kind: self._steady_finding(snap, memo, m, label, kind, steady,
                                                                         cfg.memory_budget_bytes)
        if metric == "rss_bytes":
            x, y = self._points(memo, metric)
            shift = level_shift(x, y)
            if shift is not None:
                return lambda snap, m, label, kind: self._shift_finding(snap, m, label, shift)
        return None

    @staticmethod
    def _rate(memo: dict, metric: str, a: int, b: int) -> float | None:
        """Per-step change of ``metric`` between the snapshots at steps ``a`` and ``b``."""
        steps, vals = memo["steps"], memo["values"][metric]
        try:
            ia, ib = steps.index(float(a)), len(steps) - 1 - steps[::-1].index(float(b))
        except ValueError:
            return None
        va, vb = vals[ia], vals[ib]
        if math.isnan(va) or math.isnan(vb) or b <= a:
            return None
        return (vb - va) / (b - a)

    def _steady_finding(self, snap: dict, memo: dict, metric: str, label: str, kind: str, st: Steady,
                        budget: int | None) -> Finding:
        a, b = st.steps[0], st.steps[-1]
        per_step = _amount(st.rate, kind) if kind != "bytes" else format_bytes(st.rate)
        if kind == "tensors":
            per_step = f"{st.rate:,.3g} tensor{'s' if round(st.rate, 3) != 1 else ''}"
        msg = (f"{label} rises by {per_step} per step at every snapshot "
               f"(steps {format_steps(a)}-{format_steps(b)}: {_amount(st.values[0], kind)} -> "
               f"{_amount(st.values[-1], kind)})")
        bytes_per_step, bytes_metric = None, None
        if kind != "bytes":
            for other in ("heap_in_use_bytes", "live_tensor_bytes", "rss_bytes"):
                r = self._rate(memo, other, a, b)
                if r is not None and r * (b - a) >= STEADY_MIN_RISE_BYTES:
                    bytes_per_step, bytes_metric = r, other
                    msg += f"; {METRICS[other][0]} +{format_bytes(r)} per step over the same steps"
                    break
        else:
            bytes_per_step, bytes_metric = st.rate, metric
        nxt = ("every step keeps more alive; memory grows by the same amount each step until the process "
               "is killed (OOM) or allocation fails")
        projected = None
        rss_now = memo["values"]["rss_bytes"][-1]
        if budget and bytes_per_step and not math.isnan(rss_now):
            # the leak's bytes per step added to today's RSS: where --memory-budget is crossed
            if rss_now >= budget:
                projected = snap["step"]
                msg += f"; RSS already above the {format_bytes(budget)} budget"
            else:
                projected = max(int(round_sig(snap["step"] + (budget - rss_now) / bytes_per_step, 3)), snap["step"] + 1)
                msg += f"; at this rate RSS exceeds the {format_bytes(budget)} budget at step ~{format_steps(projected)}"
            nxt = (f"RSS reaches the {format_bytes(budget)} budget around step {format_steps(projected)}; past the "
                   "machine's memory the process is killed (OOM) or allocation fails")
        return self.finding(
            snap, msg, subjects=[metric], key=metric, next_failure=nxt, metric=metric, unit=kind, shape="steady",
            per_step=st.rate, slope_per_1k_steps=st.rate * 1000, window=[a, b], points=len(st.steps),
            values=st.values, bytes_per_step=bytes_per_step, bytes_metric=bytes_metric,
            budget_bytes=budget, projected_step=projected)

    def _shift_finding(self, snap: dict, metric: str, label: str, sh: Shift) -> Finding:
        msg = (f"{label} rose by {format_bytes(sh.rise)} between steps {format_steps(sh.from_step)} and "
               f"{format_steps(sh.to_step)} ({format_bytes(sh.before)} -> {format_bytes(sh.after)}) and stayed "
               f"({format_bytes(sh.now)} at step {format_steps(sh.now_step)}): a one-off level shift, not a trend")
        nxt = ("the process keeps the larger footprint for the rest of the run; another shift of this size "
               "may exceed the machine's memory")
        return self.finding(
            snap, msg, subjects=[metric], key=metric, next_failure=nxt, metric=metric, unit="bytes", shape="shift",
            rise_bytes=sh.rise, window=[sh.from_step, sh.to_step], before=sh.before, after=sh.after,
            budget_bytes=None, projected_step=None)

    def _finding(self, snap: dict, metric: str, label: str, kind: str, trend: Trend, budget: int | None) -> Finding:
        rate = _amount(trend.slope * 1000, kind)
        msg = self.message.format(label=label, rate=rate)
        now = snap["step"]
        projected = None
        if budget:
            if trend.at(now) >= budget:
                msg += f"; already above the {format_bytes(budget)} budget"
                projected = now
            else:
                projected = int(round_sig((budget - trend.intercept) / trend.slope, 3))
                projected = max(projected, now + 1)
                msg += f"; exceeds the {format_bytes(budget)} budget at step ~{format_steps(projected)}"
        else:
            msg += (f" (steps {format_steps(trend.start_step)}-{format_steps(trend.end_step)}: "
                    f"{_amount(trend.at(trend.start_step), kind)} -> {_amount(trend.at(trend.end_step), kind)})")
        if projected is not None:
            nxt = (f"{label} reaches the {format_bytes(budget)} budget around step {format_steps(projected)}; "
                   f"past the machine's memory the process is killed (OOM) or allocation fails")
        elif kind == "tensors":
            nxt = "every step keeps more tensors alive; memory grows until the process is killed (OOM)"
        else:
            nxt = ("memory keeps growing until the process is killed (OOM) or allocation fails "
                   "('CUDA out of memory', std::bad_alloc), late in a long run")
        return self.finding(
            snap, msg, subjects=[metric], key=metric, next_failure=nxt,
            metric=metric, unit=kind, slope_per_1k_steps=trend.slope * 1000,
            slope_ci_per_1k_steps=[trend.slope_ci[0] * 1000, trend.slope_ci[1] * 1000], tau=trend.tau,
            p_value=trend.p_value, window=[trend.start_step, trend.end_step], points=trend.points,
            half_slopes_per_1k_steps=[s * 1000 for s in trend.half_slopes],
            fitted_start=trend.at(trend.start_step), fitted_end=trend.at(trend.end_step),
            budget_bytes=budget, projected_step=projected)
