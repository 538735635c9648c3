"""A speed regression of ``optcheck upgrade``, confirmed in interleaved pairs of runs or refuted. Torch-free.

The speed check (``optcheck.judge.baseline.speed_check``) compares two runs made one after the
other, the baseline's and then the candidate's. Its noise band is the spread of the CPU-time
blocks *within* each run, so load that changes *between* the two runs (a neighbour's job starting
on a shared CI runner: caches, memory bandwidth and frequency are shared even when the CPU time
is the process's own) moves the ratio without widening the band. On this project's CI two runs of
the same torch once read 1.32x (limit 1.25x) and failed the upgrade.

An upgrade can run both sides again, so before a speed regression fails it, :func:`confirm` runs
``pairs`` pairs of short soaks, the baseline and the candidate back to back, the order alternating
(baseline first, then candidate first, ...) so a steady drift of the load favours neither side.
Each pair gives one ratio, :func:`pair_ratio`: the candidate's median CPU time per step over the
baseline's (``cost.train_cpu_block_s``, the first block left out, as the speed check reads it).
The regression stands only when the median of the pairs' ratios is above the limit as well; with
the default three pairs that is two pairs of three. A true regression is slower in every pair; a
load change between two runs is not.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from optcheck.judge.baseline import MIN_SPEED_STEPS, OK, REGRESSION, Check, cpu_blocks

#: Pairs of runs :func:`confirm` makes by default (``optcheck upgrade --speed-pairs``).
PAIRS = 3
#: Training steps of each run of a pair, at most (the soak's own steps when fewer): 11 blocks of
#: ``CPU_BLOCK_STEPS`` after the first, twice what the speed check needs at least.
PAIR_STEPS = 2 * MIN_SPEED_STEPS


def pair_steps(steps: int) -> int:
    """Steps of each run of a pair for a soak of ``steps`` steps: ``min(steps, PAIR_STEPS)``."""
    return min(steps, PAIR_STEPS)


def first_side(k: int) -> int:
    """Which side runs first in pair ``k`` (0-based): 0 (the baseline) for even ``k``, 1 for odd."""
    return k % 2


def pair_ratio(baseline: dict, candidate: dict) -> float | None:
    """The candidate's median CPU seconds per step over the baseline's, from two ``summary.json``
    dicts (``cost.train_cpu_block_s``); None when either recorded fewer than two blocks after
    the first."""
    a, b = cpu_blocks(baseline), cpu_blocks(candidate)
    if a is None or b is None or min(len(a), len(b)) < 2:
        return None
    return float(np.median(b)) / float(np.median(a))


def confirm(check: Check, tolerance: float, run_pair: Callable[[int], tuple[dict, dict] | None],
            pairs: int = PAIRS) -> Check:
    """The speed ``check`` (a regression of the sequential runs) after ``pairs`` interleaved pairs.

    ``run_pair(k)`` runs pair ``k`` (0-based; the caller orders the two runs by
    :func:`first_side`) and returns the two runs' summaries ``(baseline, candidate)``, or None
    when a run did not finish (interrupted, crashed). ``tolerance`` is the allowed rise (a
    fraction: 0.25 for 25 %).

    Returns the check again: still a regression when the median of the pairs' ratios is above
    ``1 + tolerance`` (its ``brief`` then gives that median), "ok" (with the sequential runs'
    figure kept in the text) when it is not, and the sequential verdict unchanged, saying why,
    when a pair did not finish or recorded too few blocks to compare.
    """
    if check.status != REGRESSION or pairs <= 0:
        return check
    limit, ratios = 1 + tolerance, []
    for k in range(pairs):
        got = run_pair(k)
        ratio = pair_ratio(*got) if got is not None else None
        if ratio is None:
            return Check(check.name, check.status, f"{check.text}; not confirmed or refuted: pair {k + 1} of "
                                                   f"{pairs} interleaved pairs of runs did not finish or recorded "
                                                   f"too few CPU-time blocks, so the sequential runs' verdict stands",
                         check.step, check.brief)
        ratios.append(ratio)
    med = float(np.median(ratios))
    listed = ", ".join(f"{r:.2f}x" for r in ratios)
    pairs_text = f"{pairs} interleaved pair(s) of runs {listed}: median {med:.2f}x (limit {limit:.2f}x)"
    if med > limit:
        return Check(check.name, REGRESSION, f"{check.text}; confirmed by {pairs_text}", check.step,
                     brief=f"speed: train CPU per step {med:.2f}x the baseline's in {pairs} interleaved pair(s) "
                           f"of runs (limit {limit:.2f}x)")
    return Check(check.name, OK, f"not confirmed by {pairs_text}, so the sequential runs' reading was load that "
                                 f"changed between them; they read: {check.text}", check.step)
