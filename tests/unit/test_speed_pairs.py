"""``optcheck.judge.speed_pairs``: the statistic that confirms or refutes a speed regression of
``optcheck upgrade``'s sequential runs, on summaries shaped as a soak writes them
(``cost.train_cpu_block_s``); the real runs are in tests/integration/test_upgrade.py."""

from __future__ import annotations

import pytest

from optcheck.judge.baseline import OK, REGRESSION, Check
from optcheck.judge.speed_pairs import PAIR_STEPS, confirm, first_side, pair_ratio, pair_steps

SEQUENTIAL = Check("speed", REGRESSION, "train CPU 28.20 vs 22.16 ms/step (1.32x ...)",
                   brief="speed: train CPU per step 1.32x the baseline's (limit 1.25x)")


def _summary(ms: float, blocks: int = 11, first: float = 3.0) -> dict:
    """A summary whose CPU time per step is ``ms`` in every block but the first (warm-up, ``first`` times)."""
    return {"cost": {"train_cpu_block_s": [ms / 1e3 * first] + [ms / 1e3] * blocks}}


def _pairs(*ratios: float):
    """``run_pair`` for pairs with these candidate/baseline ratios; records the pairs asked for."""
    asked = []

    def run_pair(k):
        asked.append(k)
        return _summary(20.0), _summary(20.0 * ratios[k])
    return run_pair, asked


def test_the_ratio_is_of_the_medians_after_the_first_block():
    assert pair_ratio(_summary(20.0, first=9.0), _summary(25.0, first=1.0)) == pytest.approx(1.25)
    assert pair_ratio(_summary(20.0), {"cost": {}}) is None
    assert pair_ratio(_summary(20.0, blocks=1), _summary(20.0)) is None  # one block after the warm-up


def test_the_order_alternates_and_the_runs_are_short():
    assert [first_side(k) for k in range(4)] == [0, 1, 0, 1]
    assert pair_steps(2000) == PAIR_STEPS == 120 and pair_steps(60) == 60


@pytest.mark.parametrize("ratios, status", [((1.4, 1.5, 1.35), REGRESSION), ((1.4, 1.02, 0.97), OK),
                                            ((1.3, 1.3, 1.0), REGRESSION), ((1.26, 1.1, 1.24), OK)])
def test_the_median_of_the_pairs_decides(ratios, status):
    run_pair, asked = _pairs(*ratios)
    got = confirm(SEQUENTIAL, 0.25, run_pair, pairs=3)
    assert asked == [0, 1, 2] and got.status == status and got.name == "speed"
    if status == REGRESSION:
        assert got.text.startswith(SEQUENTIAL.text + "; confirmed by 3 interleaved pair(s) of runs ")
        assert got.brief.startswith("speed: train CPU per step ") and "in 3 interleaved pair(s)" in got.brief
    else:
        assert got.text.startswith("not confirmed by 3 interleaved pair(s) of runs ") and got.brief == ""
        assert got.text.endswith("they read: " + SEQUENTIAL.text)
    listed = ", ".join(f"{r:.2f}x" for r in ratios)
    assert f"of runs {listed}: median {sorted(ratios)[1]:.2f}x (limit 1.25x)" in got.text, got.text


def test_a_pair_that_does_not_finish_leaves_the_sequential_verdict():
    done = []

    def run_pair(k):
        done.append(k)
        return None if k == 1 else (_summary(20.0), _summary(20.0))
    got = confirm(SEQUENTIAL, 0.25, run_pair, pairs=3)
    assert done == [0, 1] and got.status == REGRESSION and got.brief == SEQUENTIAL.brief
    assert "not confirmed or refuted: pair 2 of 3 interleaved pairs of runs did not finish" in got.text


@pytest.mark.parametrize("check, pairs", [(Check("speed", OK, "1.02x"), 3), (SEQUENTIAL, 0)])
def test_nothing_runs_again_without_a_regression_or_without_pairs(check, pairs):
    run_pair, asked = _pairs(1.0, 1.0, 1.0)
    assert confirm(check, 0.25, run_pair, pairs=pairs) is check and asked == []
