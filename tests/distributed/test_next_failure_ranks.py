""""next:" is true for the cross-rank rules (issue 33, item 5): the faulty 2-rank loops of
``dist_loop.py`` run on without optcheck (``--plain``: gloo, CPU, 1 thread each), and what
each rank ended with — its parameters, buffers and optimizer step counts, or the exception
its loop died of and how long after the fault — is checked against each rule's prediction
(taken from the rule's own INVALID example: the rules' sentences are fixed per rule)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optcheck.engine import check_stream
from optcheck.rules import REGISTRY
from test_distributed_monitor import ranks_alone, torchrun

# Under -m slow as a whole (issue 48, fourth pass): what torch does next WITHOUT optcheck changes only with torch
# itself; the rules' own firing and silent runs under the Monitor stay in the default run
# (tests/distributed/test_distributed_monitor.py).
pytestmark = pytest.mark.slow

SCENARIOS = ["lr", "skipstep", "nosync", "unused-rank1", "buffers"]


def predicted(code: str) -> str:
    """The ``next_failure`` of rule ``code``'s first INVALID example."""
    case = REGISTRY[code].INVALID[0]
    return next(f.next_failure for f in check_stream(case.snaps) if f.code == code)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plain")
    proc = torchrun(out, "--kind", "ddp", "--plain", "--scenario", ",".join(SCENARIOS))
    assert all((out / s / "plain-rank-1.json").exists() for s in SCENARIOS), proc.stderr[-3000:]
    return out


def seen(run: Path, rank: int) -> dict:
    return json.loads((run / f"plain-rank-{rank}.json").read_text())


def same(a: dict, b: dict, key: str) -> bool:
    return all(a[key][n] == b[key][n] for n in a[key])


def test_oc701_replicas_that_stopped_syncing_end_as_different_models(plain):
    assert "each rank now trains its own model" in predicted("OC701")
    r0, r1 = seen(plain / "nosync", 0), seen(plain / "nosync", 1)
    assert r0["exc"] is None and r1["exc"] is None and not same(r0, r1, "params")


def test_oc702_a_learning_rate_changed_on_one_rank_makes_the_replicas_drift_apart(plain):
    assert "DDP replicas drift apart" in predicted("OC702")
    r0, r1 = seen(plain / "lr", 0), seen(plain / "lr", 1)
    assert r0["exc"] is None and not same(r0, r1, "params")


def test_oc703_a_step_skipped_on_one_rank_leaves_other_step_counts_and_other_replicas(plain):
    assert "bias correction and step-based schedules differ per rank; replicas diverge" == predicted("OC703")
    r0, r1 = seen(plain / "skipstep", 0), seen(plain / "skipstep", 1)
    assert r0["steps"] == [8.0] and r1["steps"] == [7.0] and not same(r0, r1, "params")


def test_oc704_a_parameter_unused_on_one_rank_is_averaged_with_zeros_and_nothing_raises(plain):
    assert predicted("OC704").startswith("DDP averages in zeros for it (find_unused_parameters)")
    r0, r1 = seen(plain / "unused-rank1", 0), seen(plain / "unused-rank1", 1)
    assert r0["exc"] is None and r1["exc"] is None and same(r0, r1, "params")  # the replicas stay alike


def test_oc705_batchnorm_statistics_not_broadcast_stay_apart(plain):
    assert predicted("OC705").startswith("nothing raises and the trained weights stay alike")
    r0, r1 = seen(plain / "buffers", 0), seen(plain / "buffers", 1)
    assert r0["exc"] is None and r0["buffers"]["bn.running_mean"] != r1["buffers"]["bn.running_mean"]
    assert same(r0, r1, "params")  # information only: the trained weights are the same


# its own torchrun job; under the Monitor the same crash is checked in the default run
# (test_distributed_monitor.py: test_an_unused_parameter_under_ddp_is_OC706_one_forward_before_ddp_raises)
def test_oc706_an_unused_parameter_without_find_unused_raises_at_the_next_forward(tmp_path):
    assert predicted("OC706").startswith("RuntimeError at the next forward")
    torchrun(tmp_path, "--plain", "--scenario", "unused")
    for rank in (0, 1):
        r = seen(tmp_path, rank)
        assert r["exc"]["type"] == "RuntimeError" and "Expected to have finished reduction" in r["exc"]["message"]
        assert r["iteration"] == 2  # the forward after the first backward


@pytest.mark.slow
def test_oc707_a_killed_rank_makes_the_others_next_collective_fail_at_once(tmp_path):
    assert "fails: at once when the lost rank died" in predicted("OC707")
    rank0, rank1 = ranks_alone(tmp_path, "--plain", "--scenario", "kill", "--timeout", "120")
    assert rank1.returncode == -9
    r = seen(tmp_path, 0)
    assert r["exc"] is not None and r["exc"]["after_s"] < 60  # not the process group's 120 s timeout
