"""optcheck.series: the one moving mean and the one even subsampler."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optcheck.series import moving_mean, subsample


def naive(v, lo, hi):
    xs = [x for x in v[lo:hi] if math.isfinite(x)]
    return (sum(xs) / len(xs) if xs else math.nan), (hi - lo) - len(xs)


def test_trailing_and_centred_means_match_the_definition_and_skip_non_finite():
    v = [1.0, 2.0, math.nan, 4.0, math.inf, 6.0, 7.0]
    means, bad = moving_mean(v, 3)
    want = [naive(v, i, i + 3) for i in range(len(v) - 2)]
    np.testing.assert_allclose(means, [m for m, _ in want])
    assert bad.tolist() == [b for _, b in want] == [1, 1, 2, 1, 1]
    means, bad = moving_mean(v, 4, align="centred")
    want = [naive(v, max(i - 2, 0), min(i + 2, len(v))) for i in range(len(v))]
    np.testing.assert_allclose(means, [m for m, _ in want])
    assert len(means) == len(v) and bad.tolist() == [b for _, b in want]


def test_a_window_of_non_finite_values_is_nan_and_edges():
    means, bad = moving_mean([math.nan, math.nan, 1.0], 2)
    assert math.isnan(means[0]) and means[1] == 1.0 and bad.tolist() == [2, 1]
    assert moving_mean([5.0, 7.0], 50)[0].tolist() == [6.0]  # the window is clipped to the series
    assert len(moving_mean([], 5)[0]) == 0
    with pytest.raises(ValueError, match="align"):
        moving_mean([1.0], 1, align="leading")


def test_subsample_keeps_ends_and_spreads_evenly():
    assert subsample(10, 20).tolist() == list(range(10))
    idx = subsample(10_001, 400)
    assert idx[0] == 0 and idx[-1] == 10_000 and len(idx) == 400 and np.all(np.diff(idx) >= 25)
