"""The slow-trend test of OC401 (``optcheck/rules/memory.py``): Kendall's tau and a
Theil–Sen slope of a memory metric against the step, robust to wandering noise.

Torch-free: numpy and the standard library (``_memory_stats.py``: no scipy import).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from optcheck.rules import _memory_stats
from optcheck.series import subsample


def _stats():
    """The statistics used here (``_memory_stats.py``: ``kendalltau``, ``theilslopes``,
    ``norm_isf``, ``norm_sf``, as ``scipy.stats`` computes them)."""
    return _memory_stats


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
    idx = subsample(len(x), limit)
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
    """Lag-1 autocorrelation of ``r``, clipped to [0, 0.95] (0 for a constant).

    Why not ``pymannkendall`` (issue 17 asked): its Hamed–Rao modified test, put in
    place of this AR(1) correction, passes the memory tests but raises the false
    alarms on clean RSS with AR(1) wander from 42 to 71 of 200 streams
    (``python benchmarks/bench_memory.py --skip-cost --streams 200``, "rss-ar1"); its
    Yue–Wang test returns p = 0 on short windows (12–20 points) whose variance
    correction collapses. The thresholds here are tuned for this correction."""
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
        z = _stats().norm_isf(p / 2) / math.sqrt((1 + r1) / (1 - r1))
        p = float(2 * _stats().norm_sf(z))
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
