"""optcheck.judge.verdict on loss dicts and snapshot dicts: each verdict fires, and stays silent
where it should (the real-process cases are tests/integration/test_upgrade.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optcheck.judge.verdict import (DIVERGED, IDENTICAL, WITHIN_NOISE, WITHIN_SEED_BAND, config_differences, judge, judge_seed_band,
                              localise, noise_tolerance, same_batches)

STEPS = range(1, 301)


def losses(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return {s: float(1.5 + 4.0 * math.exp(-scale * s / 150) + rng.normal(0, 0.08)) for s in STEPS}


def snap(step, norms, lr=1e-3, grad=None):
    return {"step": step, "phase": "post-step",
            "groups": [{"index": 0, "options": {"lr": lr, "weight_decay": 0.1}}],
            "params": [{"name": n, "value_norm": v, "grad_norm": (grad or {}).get(n, 1.0)} for n, v in norms.items()]}


def test_tolerance_grows_with_steps():
    assert noise_tolerance(0) == pytest.approx(1e-5) and noise_tolerance(1000) == pytest.approx(2e-5)


def test_identical_needs_equal_losses_and_fingerprints():
    a = losses()
    snaps = [snap(100, {"w": 2.0})]
    v = judge(a, dict(a), same_seed=True, snaps_a=snaps, snaps_b=[snap(100, {"w": 2.0})])
    assert v.kind == IDENTICAL and v.fingerprints == 2 and v.first_differs is None
    other = judge(a, dict(a), same_seed=True, snaps_a=snaps, snaps_b=[snap(100, {"w": 2.0 + 1e-9})])
    assert other.kind == WITHIN_NOISE  # a fingerprint differs, by less than noise


def test_rounding_sized_differences_are_within_noise_with_their_size():
    a = losses()
    b = {s: x * (1 + 3e-7) for s, x in a.items()}
    v = judge(a, b, same_seed=True)
    assert v.kind == WITHIN_NOISE and v.max_rel_diff == pytest.approx(3e-7, rel=1e-3)
    assert v.first_differs == 1 and v.headline().startswith("WITHIN NUMERICAL NOISE (same seed")


def test_beyond_noise_diverges_at_the_first_step_beyond():
    a = losses()
    b = dict(a)
    for s in range(40, 301):
        b[s] = a[s] * (1 + 5e-5)
    v = judge(a, b, same_seed=True)
    assert v.kind == DIVERGED and v.first_step == 40 and v.first_differs == 40
    assert v.tolerance == pytest.approx(noise_tolerance(40) * a[40])
    assert v.headline().startswith("DIVERGED from step 40: loss ")


def test_a_non_finite_loss_on_one_side_diverges():
    a = losses()
    b = dict(a)
    b[70] = math.nan
    v = judge(a, b, same_seed=True)
    assert v.kind == DIVERGED and v.first_step == 70 and math.isinf(v.max_abs_diff)
    assert "non-finite" in v.headline()


def test_localise_names_option_and_parameter():
    a = [snap(0, {"w": 1.0, "b": 1.0}), snap(100, {"w": 1.0, "b": 1.0})]
    assert localise(a, a) is None
    b = [snap(0, {"w": 1.0, "b": 1.0}), snap(100, {"w": 1.0, "b": 1.01})]
    loc = localise(a, b)
    assert (loc.step, loc.param, loc.quantity) == (100, "b", "value_norm") and loc.rel_diff == pytest.approx(0.01)
    c = [snap(0, {"w": 1.0, "b": 1.0}, lr=1.2e-3), snap(100, {"w": 1.0, "b": 1.0})]
    assert localise(a, c).options == ["lr 0.001 vs 0.0012 on group 0"] and localise(a, c).param is None
    noisy = [snap(0, {"w": 1.0, "b": 1.0}), snap(100, {"w": 1.0, "b": 1.0}, grad={"w": 1.0 + 1e-6})]
    assert localise(a, noisy) is None  # grad norms within their noise


def test_config_and_version_differences():
    sa = {"backend": "pytorch", "config": {"lr": 1e-3, "seed": 1, "run_id": "a", "extra": {"optimizer": "adamw"}},
          "versions": {"torch": "2.13.0"}, "inject": []}
    sb = {"backend": "pytorch", "config": {"lr": 1.2e-3, "seed": 1, "run_id": "b", "extra": {"optimizer": "sgd"}},
          "versions": {"torch": "2.14.1"}, "inject": ["perturb-param@5"]}
    assert config_differences(sa, sb) == ["extra.optimizer adamw vs sgd", "lr 0.001 vs 0.0012",
                                          "inject - vs perturb-param@5", "torch 2.13.0 → 2.14.1"]
    assert config_differences(sa, sa) == []


def test_same_batches_needs_recorded_configs():
    s = {"config": {"seed": 1, "batch_size": 16, "block_size": 64}, "corpus": {"sha256": "x"}}
    assert same_batches(s, dict(s))
    assert not same_batches(s, {**s, "config": {**s["config"], "seed": 2}})
    assert not same_batches({}, s)


def test_seed_band():
    base = [losses(seed) for seed in (1, 2, 3)]
    ok = judge_seed_band(base, [losses(4), losses(5)])
    assert ok.kind == WITHIN_SEED_BAND and ok.basis == "seed-band" and ok.max_abs_diff > 0
    # a seed band is a weaker claim than float rounding, and says so
    assert ok.headline().startswith("WITHIN THE SEED BAND (inside the baseline seeds' band): largest 50-step "
                                    "trailing-mean loss difference")
    slow = judge_seed_band(base, [losses(4, scale=0.5)])
    assert slow.kind == DIVERGED and 50 <= slow.first_step < 150
    with pytest.raises(ValueError):
        judge_seed_band(base[:1], [losses(4)])


def test_seed_band_numbers():
    from optcheck.judge.verdict import seed_band

    steps = list(range(1, 11))
    base = [{s: 2.0 + d for s in steps} for d in (-0.1, 0.0, 0.1)]   # constant losses, seeds 0.1 apart
    at, centre, half, w = seed_band(base, steps, window=4, k=5.0)
    assert w == 4 and list(at) == steps[3:]
    assert centre == pytest.approx([2.0] * 7)
    assert half == pytest.approx([5.0 * 0.1 * (1 + 1 / 3) ** 0.5] * 7)   # sd 0.1, widened for a 3-seed mean
    with pytest.raises(ValueError, match="at least two baseline seeds"):
        seed_band(base[:1], steps)
    with pytest.raises(ValueError, match="no step"):
        seed_band(base, [])
