"""OC401's numpy statistics (optcheck/rules/_memory_stats.py) against scipy.stats, which
they replace (scipy's import cost seconds inside the user's process)."""

import math

import numpy as np
import pytest

from optcheck.rules import _memory_stats as ms

stats = pytest.importorskip("scipy.stats")


def _close(a, b):
    if math.isnan(a):
        return math.isnan(b)
    return abs(a - b) <= 1e-9 * max(1.0, abs(a))


@pytest.mark.parametrize("kind", ["untied", "tied-counts", "rounded", "short", "rising"])
def test_kendall_and_theil_sen_match_scipy(kind):
    rng = np.random.default_rng(hash(kind) % 2**32)
    for _ in range(40):
        n = int(rng.integers(3, 12)) if kind == "short" else int(rng.integers(8, 200))
        x = np.sort(rng.choice(100_000, n, replace=False)).astype(float)
        y = {"untied": lambda: rng.normal(size=n),
             "tied-counts": lambda: rng.integers(0, 4, n).astype(float) + (x > x.mean()),
             "rounded": lambda: np.round(rng.normal(size=n) * 3),
             "short": lambda: rng.normal(size=n),
             "rising": lambda: 1e6 * x + rng.normal(size=n) * 1e8}[kind]()
        a, b = stats.kendalltau(x, y), ms.kendalltau(x, y)
        assert _close(a[0], b[0]) and _close(a[1], b[1]), (kind, n, a, b)
        if np.ptp(y) > 0:
            a, b = stats.theilslopes(y, x, alpha=0.95), ms.theilslopes(y, x, alpha=0.95)
            assert all(_close(u, v) for u, v in zip(a, b)), (kind, n, a, b)


def test_normal_tails_match_scipy():
    for p in (1e-15, 1e-6, 0.001, 0.05, 0.3, 0.5, 0.9):
        assert _close(stats.norm.isf(p), ms.norm_isf(p))
        z = stats.norm.isf(p)
        assert _close(stats.norm.sf(z), ms.norm_sf(z))


def test_constant_series_is_nan_not_an_error():
    tau, p = ms.kendalltau([1, 2, 3, 4], [5, 5, 5, 5])
    assert math.isnan(tau) and math.isnan(p)
