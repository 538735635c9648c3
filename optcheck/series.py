"""Moving means and even subsampling of a per-step series (numpy). Torch-free.

One implementation for everything that smooths or thins a series: ``compare``
and the verdict (trailing means of two loss trajectories), the run plot
(centred means, thinned to a drawable number of points) and the memory-trend
rule (a window subsampled before its regression).
"""

from __future__ import annotations

import numpy as np


def moving_mean(v, window: int, *, align: str = "trailing") -> tuple[np.ndarray, np.ndarray]:
    """Means of ``v`` over ``window`` consecutive points, ignoring non-finite values.

    Args:
        v: the series (1-D, any float-convertible sequence).
        window: points per window (clipped to ``1..len(v)``).
        align: ``"trailing"``: one mean per full window ending at each point from
            the ``window``-th on (``len(v) - window + 1`` values); ``"centred"``:
            one mean per point over the window around it, shorter at both ends
            (``len(v)`` values).

    Returns:
        ``(means, bad)``: the means (NaN where a window holds no finite value)
        and, per window, how many of its points were not finite (int).

    Raises:
        ValueError: ``align`` is neither "trailing" nor "centred".
    """
    v = np.asarray(v, dtype=float)
    n = len(v)
    if n == 0:
        return v, np.zeros(0, dtype=int)
    window = max(1, min(int(window), n))
    finite = np.isfinite(v)
    c_val = np.concatenate([[0.0], np.cumsum(np.where(finite, v, 0.0))])
    c_ok = np.concatenate([[0], np.cumsum(finite)])
    if align == "trailing":
        lo, hi = np.arange(0, n - window + 1), np.arange(window, n + 1)
    elif align == "centred":
        i = np.arange(n)
        lo, hi = np.maximum(i - window // 2, 0), np.minimum(i + (window - window // 2), n)
    else:
        raise ValueError(f"align must be 'trailing' or 'centred', got {align!r}")
    oks = c_ok[hi] - c_ok[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (c_val[hi] - c_val[lo]) / oks
    return means, (hi - lo) - oks


def subsample(n: int, limit: int) -> np.ndarray:
    """Indexes of at most ``limit`` points spread evenly over ``range(n)``, first
    and last included, ascending without repeats (all of them when ``n <= limit``)."""
    if n <= limit:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, limit).round().astype(int))
