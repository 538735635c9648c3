"""Memory rule OC401: does memory keep growing with the step count?

Reads the ``memory`` block of every snapshot (``optcheck.snapshot``: every field
optional) and tests each metric for a sustained upward trend against the step.
Torch-free: it sees numbers only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from optcheck.findings import Finding
from optcheck.rules.base import Rule, RuleConfig, RuleContext, register
from optcheck.snapshot import to_float
from optcheck.units import format_bytes, format_steps, round_sig

def _stats():
    """``scipy.stats``, imported on first use: it costs ~1 s, and every worker and
    ``optcheck check`` imports this module whether or not a trend is ever tested."""
    from scipy import stats

    return stats


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
}

#: Default floors for the count metrics, per 1,000 steps (override with
#: ``RuleConfig.extra["memory_min_growth_tensors_per_1k_steps"]`` / ``..._retries_...``).
MIN_GROWTH_TENSORS_PER_1K_STEPS = 100.0
MIN_GROWTH_RETRIES_PER_1K_STEPS = 10.0

MAX_POINTS = 400        # a window is subsampled evenly to at most this many snapshots
RETEST_FRACTION = 1 / 25  # re-test a metric after the series grew by this fraction
HALF_ALPHA = 0.05       # each half of a window must rise at this level
DECELERATION = 1 / 3    # a second half rising < 1/3 as fast as the first is levelling off
MIN_RISE_STEPS = 1000   # the fitted rise must be >= what 1,000 steps at the minimum slope add
CI_FRACTION = 0.5       # the slope's 95 % lower bound must be >= this fraction of it
SNR = 3.0               # rise over the window >= SNR x robust scale of the residuals
CLEAR_SNR = 20.0        # above this the autocorrelation correction is not needed


@dataclass
class Trend:
    """A significant, sustained upward trend of one metric.

    Attributes:
        slope: Theil–Sen slope, metric units (bytes, tensors) per step.
        intercept: value of the fitted line at step 0.
        tau, p_value: Kendall's tau of value against step, and its two-sided p-value.
        start_step, end_step: the window tested (steps).
        points: snapshots in the window (after subsampling).
        half_slopes: Theil–Sen slopes of the window's two halves (units per step).
        slope_ci: 95 % confidence interval of ``slope`` (Sen's, assumes independent
            noise). At the first snapshot that shows a leak the estimate tends to be
            high (the test fires when the noise happens to help); it is reported once.
    """

    slope: float
    intercept: float
    tau: float
    p_value: float
    start_step: int
    end_step: int
    points: int
    half_slopes: tuple[float, ...]
    slope_ci: tuple[float, float] = (math.nan, math.nan)

    def at(self, step: float) -> float:
        """The fitted value at ``step``."""
        return self.intercept + self.slope * step


def _subsample(x: np.ndarray, y: np.ndarray, limit: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    if len(x) <= limit:
        return x, y
    idx = np.unique(np.linspace(0, len(x) - 1, limit).round().astype(int))
    return x[idx], y[idx]


def _rising(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[float, float] | None:
    """(tau, p) when Kendall's tau of ``y`` against ``x`` is positive with p < alpha."""
    if np.ptp(y) == 0:
        return None
    tau, p = _stats().kendalltau(x, y)
    if not (math.isfinite(tau) and math.isfinite(p)) or tau <= 0 or p >= alpha:
        return None
    return float(tau), float(p)


def _lag1(r: np.ndarray) -> float:
    """Lag-1 autocorrelation of ``r``, clipped to [0, 0.95] (0 for a constant)."""
    r = r - r.mean()
    den = float(np.dot(r, r))
    if den == 0:
        return 0.0
    return min(max(float(np.dot(r[:-1], r[1:])) / den, 0.0), 0.95)


def window_trend(x: np.ndarray, y: np.ndarray, *, min_slope: float, alpha: float, min_points: int) -> Trend | None:
    """Test one window of (step, value) points for sustained growth.

    All of these must hold:

    1. at least ``min_points`` points (and 8);
    2. Kendall's tau > 0 with p < ``alpha``, where the p-value is corrected for
       autocorrelated noise (RSS wanders rather than jitters): the z-score is divided
       by sqrt((1 + r1) / (1 - r1)), r1 the lag-1 autocorrelation of the residuals
       of the fit (an AR(1) variance-inflation correction in the spirit of Hamed &
       Rao, 1998). The correction is skipped when the rise across the window is over
       ``CLEAR_SNR`` times the noise scale: such growth is plain whatever the noise;
    3. the Theil–Sen slope is >= ``min_slope`` (units per step), and the lower
       end of its 95 % confidence interval is >= ``CI_FRACTION`` (1/2) of it, so
       the rate (and the budget projection) reported is good to about a factor 2;
    4. the rise of the fitted line across the window is >= ``SNR`` times the
       robust scale (1.4826 x MAD) of the residuals, and at least what
       ``MIN_RISE_STEPS`` (1,000) steps at ``min_slope`` add (8 MiB with the
       defaults): a few MiB of wander over a short window is not a leak;
    5. the growth is spread over the window and not levelling off: each half of
       the window rises on its own (Kendall tau > 0 with p < ``HALF_ALPHA``,
       Theil–Sen slope >= max(min_slope / 2, slope / 4)), and the second half
       rises at least ``DECELERATION`` (1/3) as fast as the first. A one-off step
       up (the first validation pass, an allocator taking a new arena) leaves one
       half flat; an allocator warming up to a plateau decelerates: both stay
       silent.

    Cost: O(n log n) for the tau test and, only when that passed, O(n^2) for
    Theil–Sen, on at most ``MAX_POINTS`` points.
    """
    x, y = _subsample(np.asarray(x, float), np.asarray(y, float))
    n = len(x)
    if n < max(min_points, 8):
        return None
    sig = _rising(x, y, alpha)
    if sig is None:
        return None
    slope, intercept, low, high = (float(v) for v in _stats().theilslopes(y, x, alpha=0.95))
    if not slope >= min_slope or slope <= 0 or low < slope * CI_FRACTION:
        return None
    resid = y - (intercept + slope * x)
    scale = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
    rise = slope * (x[-1] - x[0])
    if rise < SNR * scale or rise < min_slope * MIN_RISE_STEPS:
        return None
    tau, p = sig
    if rise < CLEAR_SNR * scale:
        r1 = _lag1(resid)
        z = _stats().norm.isf(p / 2) / math.sqrt((1 + r1) / (1 - r1))
        p = float(2 * _stats().norm.sf(z))
        if p >= alpha:
            return None
    floor = max(min_slope / 2, slope / 4)
    half_slopes = []
    h = n // 2
    for xs, ys in ((x[:h], y[:h]), (x[h:], y[h:])):
        if _rising(xs, ys, HALF_ALPHA) is None:
            return None
        half_slopes.append(float(_stats().theilslopes(ys, xs)[0]))
        if half_slopes[-1] < floor:
            return None
    if half_slopes[1] < half_slopes[0] * DECELERATION:
        return None
    return Trend(slope, intercept, tau, p, int(x[0]), int(x[-1]), n, tuple(half_slopes), (low, high))


def find_trend(steps: Iterable[float], values: Iterable[float], *, min_slope: float, alpha: float,
               min_points: int, warmup_fraction: float) -> Trend | None:
    """Sustained growth in a metric's series, or None.

    Args:
        steps, values: the series in step order (non-finite values are dropped).
        min_slope: smallest growth that matters, units per step.
        alpha: significance level of the whole-window Kendall test.
        min_points: snapshots needed after the warm-up.
        warmup_fraction: points before ``warmup_fraction x last step`` are ignored.

    Two windows are tested (:func:`window_trend`): everything after the warm-up,
    and the last half of it, so a leak that starts late in a long run is found
    once it covers most of that last half (a leak starting at step S is found by
    about step 1.6 S) instead of waiting for it to dominate the whole run.
    """
    x = np.asarray(list(steps), float)
    y = np.asarray(list(values), float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) == 0:
        return None
    keep = (x >= warmup_fraction * x[-1]) & (x >= 1)
    x, y = x[keep], y[keep]
    windows = [(x, y)]
    if len(x) >= 2 * min_points:
        windows.append((x[len(x) // 2:], y[len(x) // 2:]))
    for xs, ys in windows:
        trend = window_trend(xs, ys, min_slope=min_slope, alpha=alpha, min_points=min_points)
        if trend is not None:
            return trend
    return None


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

    For each memory metric of the snapshots (RSS, live tensor count and bytes,
    optimizer state bytes, .NET managed heap, device allocated / reserved bytes
    and allocation retries; whichever the backend records), the rule fits a robust
    trend of value against step and fires once per metric when all of these hold
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
    (the live count grows until the .NET GC runs, docs/torchsharp.md), an optimizer
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
            n = len(vals)
            last = memo["tested"].get(metric, 0)
            if not final and n - last < max(1, int(n * RETEST_FRACTION)):
                continue
            memo["tested"][metric] = n
            min_slope = _min_growth_per_1k(kind, cfg) / 1000.0
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
