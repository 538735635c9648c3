"""The three statistics OC401's trend test needs (``_memory_trend.py``), in numpy and
the standard library: Kendall's tau-b with its p-value, the Theil–Sen slope with
Sen's confidence interval, and the normal tail functions.

They follow ``scipy.stats`` (``kendalltau`` with ``method="auto"``, ``theilslopes``
with ``method="separate"``, ``norm.isf`` / ``norm.sf``) formula for formula, so the
thresholds tuned on scipy's values hold (``tests/unit/test_memory_stats.py`` compares
both on random series with and without ties). Importing ``scipy.stats`` took 2–11 s
on a loaded machine and ~20 MiB of heap inside the user's process: ``optcheck.Monitor``
ran it in its first rule check, inside the user's loop.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

_NORMAL = NormalDist()


class KendallResult(NamedTuple):
    statistic: float
    pvalue: float


class TheilSenResult(NamedTuple):
    slope: float
    intercept: float
    low_slope: float
    high_slope: float


def norm_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def norm_isf(p: float) -> float:
    """The z with P(Z > z) = ``p`` (0 < p < 1); ±inf at the ends."""
    if p <= 0:
        return math.inf
    if p >= 1:
        return -math.inf
    return -_NORMAL.inv_cdf(p)


def _dense_ranks(v: np.ndarray) -> np.ndarray:
    u, inv = np.unique(v, return_inverse=True)
    return inv.reshape(-1)


def _tie_stats(ranks: np.ndarray) -> tuple[int, int, int]:
    cnt = np.bincount(ranks).astype(np.int64)
    cnt = cnt[cnt > 1]
    return (int((cnt * (cnt - 1) // 2).sum()), int((cnt * (cnt - 1) * (cnt - 2)).sum()),
            int((cnt * (cnt - 1) * (2 * cnt + 5)).sum()))


def _kendall_p_exact(n: int, c: int) -> float:
    """Two-sided exact p-value of ``c`` concordant pairs among ``n`` untied points
    (Kendall, *Rank Correlation Methods*, 1970; scipy's ``_kendall_p_exact``)."""
    c = int(min(c, n * (n - 1) // 2 - c))
    if n <= 2:
        return 1.0
    if c == 0:
        return min(1.0, 2.0 / math.factorial(n))
    if c == 1:
        return min(1.0, 2.0 / math.factorial(n - 1))
    if 4 * c == n * (n - 1):
        return 1.0
    new = np.zeros(c + 1)
    new[0:2] = 1.0
    for j in range(3, n + 1):
        new = np.cumsum(new) / j
        if j <= c:
            new[j:] -= new[:c + 1 - j]
    return float(min(1.0, max(0.0, np.sum(new))))


def kendalltau(x, y) -> KendallResult:
    """Kendall's tau-b of ``x`` and ``y`` (1-D, same length) and its two-sided
    p-value: exact when neither has ties and n <= 33, else the normal approximation
    with the tie-corrected variance. NaN for fewer than 2 points or a constant input."""
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    n = x.size
    if n < 2:
        return KendallResult(math.nan, math.nan)
    xr, yr = _dense_ranks(x), _dense_ranks(y)
    tot = n * (n - 1) // 2
    dx = np.sign(xr[:, None] - xr[None, :])
    dy = np.sign(yr[:, None] - yr[None, :])
    upper = np.triu(np.ones((n, n), bool), 1)
    prod = (dx * dy)[upper]
    dis = int((prod < 0).sum())
    con = int((prod > 0).sum())
    xtie, x0, x1 = _tie_stats(xr)
    ytie, y0, y1 = _tie_stats(yr)
    if xtie == tot or ytie == tot:
        return KendallResult(math.nan, math.nan)
    con_minus_dis = con - dis
    tau = con_minus_dis / math.sqrt(tot - xtie) / math.sqrt(tot - ytie)
    tau = min(1.0, max(-1.0, tau))
    if xtie == 0 and ytie == 0 and (n <= 33 or min(dis, tot - dis) <= 1):
        p = _kendall_p_exact(n, tot - dis)
    else:
        m = n * (n - 1.0)
        var = ((m * (2 * n + 5) - x1 - y1) / 18 + (2 * xtie * ytie) / m + x0 * y0 / (9 * m * (n - 2)))
        p = min(1.0, 2 * norm_sf(abs(con_minus_dis) / math.sqrt(var)))
    return KendallResult(float(tau), float(p))


def _repeat_counts(v: np.ndarray) -> np.ndarray:
    _, counts = np.unique(v, return_counts=True)
    return counts[counts > 1]


def theilslopes(y, x, alpha: float = 0.95) -> TheilSenResult:
    """Theil–Sen slope of ``y`` against ``x`` (median of the pairwise slopes), the
    intercept median(y) - slope * median(x), and Sen's (1968) ``alpha`` confidence
    interval of the slope (NaN where the ranks fall outside the slopes)."""
    y, x = np.asarray(y, float).ravel(), np.asarray(x, float).ravel()
    deltax = x[:, None] - x
    deltay = y[:, None] - y
    pos = deltax > 0
    slopes = np.sort(deltay[pos] / deltax[pos])
    if not slopes.size:
        return TheilSenResult(math.nan, math.nan, math.nan, math.nan)
    med = float(np.median(slopes))
    inter = float(np.median(y) - med * np.median(x))
    a = 1.0 - alpha if alpha > 0.5 else alpha
    z = -norm_isf(a / 2.0)  # norm.ppf(a / 2)
    ny, nt = len(y), len(slopes)
    sigsq = (ny * (ny - 1) * (2 * ny + 5) - sum(int(k) * (k - 1) * (2 * k + 5) for k in _repeat_counts(x))
             - sum(int(k) * (k - 1) * (2 * k + 5) for k in _repeat_counts(y))) / 18.0
    if sigsq < 0:
        return TheilSenResult(med, inter, math.nan, math.nan)
    sigma = math.sqrt(sigsq)
    ru = min(int(np.round((nt - z * sigma) / 2.0)), nt - 1)
    rl = max(int(np.round((nt + z * sigma) / 2.0)) - 1, 0)
    if not (0 <= rl < nt and 0 <= ru < nt):
        return TheilSenResult(med, inter, math.nan, math.nan)
    return TheilSenResult(med, inter, float(slopes[rl]), float(slopes[ru]))
