"""`optcheck compare` on real soaks: two seeds agree; a 10x learning rate or SGD instead
of AdamW do not."""

from __future__ import annotations

import pytest

from conftest import SMALL, run_cli, run_clis
from optcheck import exitcodes
from optcheck.compare import compare_runs


@pytest.fixture(scope="module")
def soaks(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    extras = {"seed1": ["--seed", "1"], "seed2": ["--seed", "2"], "lr10x": ["--seed", "1", "--lr", "0.01"],
              "sgd": ["--seed", "1", "--optimizer", "sgd"]}
    done = run_clis({name: ["soak", "-q", "--steps", "300", "--every", "100", "--out", str(root / name), *SMALL,
                            *extra] for name, extra in extras.items()})
    for rc, stdout, _ in done.values():
        assert rc == exitcodes.CLEAN, stdout
    return {name: root / name for name in extras}


def test_two_seeds_pass_with_the_defaults(soaks):
    res = compare_runs(soaks["seed1"], soaks["seed2"])
    assert res.exit_code == exitcodes.CLEAN, res.render()
    assert res.loss.common_steps == 300 and res.loss.max_rel_diff < 0.05
    assert 0.5 < res.step_time_ratio < 2 and 0.8 < res.peak_memory_ratio < 1.25
    assert res.a.versions["torch"] == res.b.versions["torch"]


def test_ten_times_the_learning_rate_fails_through_the_cli(soaks):
    rc, stdout, _ = run_cli(["compare", str(soaks["seed1"]), str(soaks["lr10x"])])
    assert rc == exitcodes.FINDINGS, stdout
    assert "OC601 run-divergence: loss trajectories diverge from step" in stdout
    res = compare_runs(soaks["seed1"], soaks["lr10x"])
    assert res.findings[0].step <= 150


def test_another_optimizer_fails(soaks):
    res = compare_runs(soaks["seed1"], soaks["sgd"])
    assert res.exit_code == exitcodes.FINDINGS and res.findings[0].code == "OC601", res.render()
    assert res.loss.max_rel_diff > 0.2
