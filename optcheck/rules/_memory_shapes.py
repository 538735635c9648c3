"""Shapes of a memory series the memory rules look for besides a slow trend
(``optcheck/rules/memory.py``): steady growth of an exact count, and a level shift.

Pure functions over (step, value) arrays; torch-free, numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

STEADY_INTERVALS = 3      # consecutive snapshot intervals that must all show the same growth
STEADY_TOLERANCE = 0.5    # per-step rates within +-50 % of their median (allocator rounding, list growth)
STEADY_START_TOLERANCE = 0.15  # ... within +-15 % while fewer than 3 earlier rises show the wobble
STEADY_NOISE_FACTOR = 3.0  # each rise >= 3x the robust scale of the earlier rises' wobble
STEADY_MIN_INTERVAL_STEPS = 50  # byte metrics: snapshots at least this many steps apart are compared
STEADY_MIN_RISE_BYTES = 2**20  # a byte metric must rise >= 1 MiB between snapshots: the monitor's own
#                                snapshot history (<= 64 snapshots of a few KiB) stays below it
SHIFT_MIN_BYTES = 256 * 2**20  # a level shift is at least this ...
SHIFT_MIN_FRACTION = 0.5       # ... and at least half the level before it
SHIFT_FLAT_FRACTION = 0.25     # before and after: spread within 1/4 of the jump
SHIFT_CONFIRM = 2              # snapshots after the jump that show it stayed (the jump's own included)
SHIFT_NOISE_FACTOR = 8.0       # the jump >= 8x the robust scale of the earlier snapshot-to-snapshot changes


@dataclass
class Steady:
    """A count or byte total that rose by the same amount per step at every snapshot.

    Attributes:
        rate: median rise per step over the window (units per step).
        steps: the window's snapshot steps (``STEADY_INTERVALS`` + 1 of them).
        values: the metric at those steps.
    """

    rate: float
    steps: list[int]
    values: list[float]


def steady_growth(x, y, *, min_rate: float, min_rise: float = 0.0, intervals: int = STEADY_INTERVALS,
                  tolerance: float = STEADY_TOLERANCE) -> Steady | None:
    """The last ``intervals`` intervals of the series as a steady rise, or None.

    Args:
        x, y: steps and values in step order, finite only (counts or bytes).
        min_rate: smallest rise per step that matters (units per step).
        min_rise: smallest rise between two snapshots (units).

    All of these must hold on the last ``intervals`` + 1 points:

    - every interval rises (strictly), by at least ``min_rise``, at least ``min_rate`` per step, and the
      per-step rates agree within ``tolerance`` of their median: a list that gets
      one more entry per step grows by exactly the same amount between any two
      snapshots the same number of steps apart; noise does not;
    - nothing decreased: the window starts at (within half a rise of) the highest
      value seen so far;
    - when there are earlier rises, each rise in the window is at least
      ``STEADY_NOISE_FACTOR`` times the robust scale (1.4826 x MAD) of the earlier
      rises' deviation from their median, so jitter (GC debt, allocator wobble)
      cannot imitate three equal rises in a row. A leak running since the first
      snapshot has equal earlier rises (scale ~0) and still fires;
    - while fewer than 3 earlier rises exist (the first snapshots of a run), the
      wobble cannot be measured, and the window's rates must agree within
      ``STEADY_START_TOLERANCE`` (+-15 %) instead of ``tolerance``: a count that jitters
      by up to a few hundred tensors rises three times in a row within +-50 % about
      once in 175 runs (0.57 % of 20,000 simulated runs of 4-120 snapshots), within
      +-15 % about once in 2,500 (0.04 %); a leak running since the first snapshot
      rises by the same amount each interval and still fires at the fourth.
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    n = intervals + 1
    if len(x) < n:
        return None
    wx, wy = x[-n:], y[-n:]
    dx, dy = np.diff(wx), np.diff(wy)
    if np.any(dx <= 0) or np.any(dy <= 0) or dy.min() < min_rise:
        return None
    rates = dy / dx
    med = float(np.median(rates))
    before = y[:-n]
    if len(before) < 3:
        tolerance = min(tolerance, STEADY_START_TOLERANCE)
    if rates.min() < min_rate or float(np.max(np.abs(rates - med))) > tolerance * med:
        return None
    if len(before) and wy[0] < before.max() - 0.5 * dy.min():
        return None
    if len(before) >= 3:
        earlier = np.diff(y[:len(y) - n + 1]) / np.diff(x[:len(x) - n + 1])
        scale = 1.4826 * float(np.median(np.abs(earlier - np.median(earlier))))
        if np.any(rates < STEADY_NOISE_FACTOR * scale):
            return None
    return Steady(med, [int(v) for v in wx], [float(v) for v in wy])


def thin(x, y, min_gap: float) -> tuple[np.ndarray, np.ndarray]:
    """The points of (x, y) kept walking back from the last one, each at least
    ``min_gap`` steps before the previously kept one (in step order)."""
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    keep, last = [], math.inf
    for i in range(len(x) - 1, -1, -1):
        if last - x[i] >= min_gap:
            keep.append(i)
            last = x[i]
    keep.reverse()
    return x[keep], y[keep]


@dataclass
class Shift:
    """A one-off jump of a level that then stayed.

    Attributes:
        from_step, to_step: the snapshots on either side of the jump.
        before, after: the level before the jump and its median since (units).
        now_step, now: the latest snapshot and its value.
    """

    from_step: int
    to_step: int
    before: float
    after: float
    now_step: int
    now: float

    @property
    def rise(self) -> float:
        return self.after - self.before


def level_shift(x, y, *, min_jump: float = SHIFT_MIN_BYTES, min_fraction: float = SHIFT_MIN_FRACTION,
                confirm: int = SHIFT_CONFIRM) -> Shift | None:
    """A jump ``confirm`` snapshots back (inclusive of the jump's own) that stayed, or None.

    Args:
        x, y: steps and values in step order, finite only (bytes).

    The jump between points ``j-1`` and ``j`` (``j`` = ``len - confirm``) must be at
    least ``min_jump`` and ``min_fraction`` of the level before it; the two points
    before the jump and the ``confirm`` points from ``j`` on must each stay within
    ``SHIFT_FLAT_FRACTION`` of the jump; and the jump must be at least
    ``SHIFT_NOISE_FACTOR`` times the robust scale (1.4826 x MAD) of every earlier
    snapshot-to-snapshot change (at least 3 of them), so RSS that wanders by
    hundreds of MiB anyway is no shift. A leak that keeps rising fails the
    "stayed" test and is left to the trend test.
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    j = len(y) - confirm
    if j < 4:
        return None
    pre, post = y[max(0, j - 2):j], y[j:]
    jump = float(post.min() - pre.max())
    if jump < min_jump or jump < min_fraction * float(pre[-1]):
        return None
    flat = SHIFT_FLAT_FRACTION * jump
    if np.ptp(pre) > flat or np.ptp(post) > flat:
        return None
    changes = np.diff(y[:j])
    med = float(np.median(changes))
    # a series already rising (a leak) moves by its median change each snapshot: no shift
    if jump < SHIFT_NOISE_FACTOR * (abs(med) + 1.4826 * float(np.median(np.abs(changes - med)))):
        return None
    return Shift(int(x[j - 1]), int(x[j]), float(pre[-1]), float(np.median(post)), int(x[-1]), float(y[-1]))
