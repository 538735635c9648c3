"""The TorchSharp worker steps in blocks inside .NET (``Driver.StepBlock``) and loses nothing by it.

A block runs the steps between two things the Python loop must do (a snapshot, an injection, a lifecycle
event, a held-out evaluation, a metrics batch) in one .NET call; the pre-step fingerprint after each step
and the in-step check stay inside it, so that a block ends at the step a check fires. Planted here in the
middle of a block (``every=100``: steps 101..200 are one block): a fault inside the user's Step is named at
that step, a fault the between-steps check sees at the next step, a crash keeps every earlier step's record
and names its step, a hung step is still killed by ``--step-timeout``, and SIGTERM during a block keeps the
steps the block did (the loop with a block backend of its own, no .NET).

Real: the optcheck worker, pythonnet on CoreCLR, the shipped dotnet/Probe sources, the supervisor, the run
directory. Stand-in: the trainer (tests/dotnet/TestLoop.cs).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from optcheck.run.backend import Backend

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from test_bridge_worker import config, dll, need, soak  # noqa: E402,F401  (dll: the module fixture)

pytestmark = pytest.mark.dotnet
KNF = "System.Collections.Generic.KeyNotFoundException"


def metric_steps(out: Path) -> list[int]:
    return [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def test_an_in_step_fault_mid_block_is_named_at_its_step_and_earlier_steps_are_kept(dll, tmp_path):  # noqa: F811
    need("coreclr")
    res = soak(config(dll, "coreclr", "OptCheckTest.InStepTrainer", steps=200, bug="to-float64", bug_at=137),
               tmp_path / "run")
    s = res.summary
    assert res.exit_code == 3 and s["crash"]["step"] == 137 and s["crash"]["exc_type"] == KNF, s["crash"]
    named = [(f.code, f.step, f.phase) for f in res.findings]
    assert ("OC108", 137, "in-step") in named and all(x[1:] == (137, "in-step") for x in named), named
    assert metric_steps(res.out) == list(range(1, 137))  # every step before the crash, none after


def test_a_fault_the_between_steps_check_sees_mid_block_is_named_before_the_next_step(dll, tmp_path):  # noqa: F811
    """The trainer is not guarded: the fault planted at the end of step 137, after its optimizer step, is seen by
    the fingerprint StepBlock takes after it, the block ends there, and the pre-step check snapshot of step 138 names it before step 138 throws."""
    need("coreclr")
    res = soak(config(dll, "coreclr", steps=200, bug="param-replaced", bug_after_at=137), tmp_path / "run")
    s = res.summary
    assert res.exit_code == 3 and s["crash"]["step"] == 138 and s["crash"]["exc_type"] == KNF, s["crash"]
    named = [(f.code, f.step, f.phase) for f in res.findings]
    assert ("OC108", 138, "pre-step") in named and all(step == 138 for _, step, _ in named), named
    assert metric_steps(res.out) == list(range(1, 138))


def test_stop_on_finding_mid_block_stops_at_the_step(dll, tmp_path):  # noqa: F811
    need("coreclr")
    cfg = config(dll, "coreclr", steps=200, bug="param-replaced", bug_after_at=137)
    cfg.checks.stop_on_finding = True
    res = soak(cfg, tmp_path / "run")
    assert res.summary["status"] == "stopped" and res.summary["crash"] is None, res.summary
    assert [(f.code, f.step) for f in res.findings if f.code == "OC108"] == [("OC108", 138)]
    assert metric_steps(res.out) == list(range(1, 138))


def test_a_crash_of_the_users_own_mid_block_keeps_the_records_before_it(dll, tmp_path):  # noqa: F811
    need("coreclr")
    res = soak(config(dll, "coreclr", steps=200, bug="throw", bug_at=163), tmp_path / "run")
    crash = res.summary["crash"]
    assert crash["step"] == 163 and crash["exc_type"] == "System.InvalidOperationException", crash
    assert "the user's own Step failed" in crash["message"]
    assert metric_steps(res.out) == list(range(1, 163))


def test_a_hung_step_mid_block_is_killed_by_the_step_timeout(dll, tmp_path):  # noqa: F811
    need("coreclr")
    cfg = config(dll, "coreclr", steps=300, hang_at=150, hang_s=120)
    cfg.run.step_timeout_s = 3.0
    res = soak(cfg, tmp_path / "run")
    crash = res.summary["crash"]
    assert crash["exc_type"] == "StepTimeout", crash
    steps = metric_steps(res.out)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) < 150  # nothing past the hung step


class _BlockBackend(Backend):
    """A backend with blocks and no .NET (the optional methods it lacks are the base's no-ops): each block does all its steps, and the one that reaches step
    ``term_at`` sends this process SIGTERM from inside it (as if it arrived while .NET was stepping)."""

    name = "fake"

    def __init__(self, term_at: int) -> None:
        self.term_at, self.n = term_at, 0
        self.blocks: list[tuple[int, int]] = []

    def setup(self, cfg, corpus) -> None:
        self.cfg = cfg

    def versions(self):
        return {}

    def threads(self):
        return 1

    def fingerprint(self):
        return 7

    def snapshot_body(self):
        return {"params": [], "groups": [], "state": [], "optimizer": {}, "memory": {}, "events": [], "notes": []}

    def has_events(self):
        return False

    def max_block(self, b, t):
        return 200

    def block_inputs(self, count, b, t):
        import numpy as np

        return np.empty((count, b, t), np.int64), np.empty((count, b, t), np.int64)

    def train_block(self, first, count, b, t, reference, budget_s):
        self.blocks.append((first, count))
        self.n = count
        if first <= self.term_at < first + count:
            os.kill(os.getpid(), signal.SIGTERM)
        return count

    def block_done(self):
        return self.n

    def block_results(self, n):
        return [1.0] * n, [0.001] * n

    def exception_info(self, exc):
        return {}


class _Recorder:
    def __init__(self) -> None:
        self.msgs: list[tuple[str, dict]] = []

    def send(self, type: str, **payload) -> None:  # noqa: A002
        self.msgs.append((type, payload))

    def verdict(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def test_sigterm_during_a_block_keeps_every_step_the_block_did(tmp_path):
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the worker's SIGTERM handler is installed from the main thread only")
    from optcheck.config import DataConfig, ModelConfig, RunConfig, SoakConfig
    from optcheck.drivers.worker_loop import TERMINATED, run

    be, stream = _BlockBackend(term_at=150), _Recorder()
    cfg = SoakConfig(model=ModelConfig(block_size=8), data=DataConfig(batch_size=2, val_every=0),
                     run=RunConfig(backend="torchsharp", steps=1000, every=100))
    assert run(be, cfg, stream) == TERMINATED
    assert be.blocks[:2] == [(1, 100), (101, 100)]  # blocks end at the cadence snapshots
    steps = [s for t, p in stream.msgs if t == "metrics" for s in p["steps"]]
    assert steps == list(range(1, 201))  # the block SIGTERM came in was recorded whole, then the worker stopped
    assert [t for t, _ in stream.msgs][-1] == "metrics"


def test_a_clean_block_run_records_every_step_once_and_counts_each_in_the_cost(dll, tmp_path):  # noqa: F811
    """Clean: CLEAN, one metrics line per step in order, and the summary's per-step cost counts every step of every
    block (not one per block)."""
    need("coreclr")
    res = soak(config(dll, "coreclr", steps=250), tmp_path / "run")
    s = res.summary
    assert res.exit_code == 0 and not res.findings, [f.to_dict() for f in res.findings]
    assert metric_steps(res.out) == list(range(1, 251))
    assert s["last_step"] == 250 and s["cost"]["steps"]["count"] == 250, s["cost"]


class _SlowBlockBackend(_BlockBackend):
    """Steps of 50 ms (what block_results reports) that stop a block when its time budget is spent, as
    Driver.StepBlock does: the batches a block is handed are counted."""

    def __init__(self) -> None:
        super().__init__(term_at=-1)
        self.filled: list[int] = []

    def block_inputs(self, count, b, t):
        self.filled.append(count)
        return super().block_inputs(count, b, t)

    def train_block(self, first, count, b, t, reference, budget_s):
        self.blocks.append((first, count))
        self.n = min(count, max(1, -(-int(budget_s * 1000) // 50)))  # steps until the budget is spent
        return self.n

    def block_results(self, n):
        return [1.0] * n, [0.05] * n


def test_a_block_is_handed_no_more_batches_than_its_time_budget_lets_run():
    """Real TorchSharp's ~20 ms steps end a 0.25 s block after ~12 steps: after the first block the loop fills the
    batches of about as many steps as the last block's step time lets run, not of every step up to the next
    snapshot (it generated ~10x the batches it used); every step is still run and recorded once."""
    from optcheck.config import DataConfig, ModelConfig, RunConfig, SoakConfig
    from optcheck.drivers.worker_loop import BLOCK_MAX_S, run

    be, stream = _SlowBlockBackend(), _Recorder()
    cfg = SoakConfig(model=ModelConfig(block_size=8), data=DataConfig(batch_size=2, val_every=0),
                     run=RunConfig(backend="torchsharp", steps=300, every=100))
    assert run(be, cfg, stream) == 0
    assert be.filled[0] == 100  # the first block knows no step time yet
    assert max(be.filled[1:]) <= int(BLOCK_MAX_S / 0.05) + 1 < 100, be.filled
    steps = [s for t, p in stream.msgs if t == "metrics" for s in p["steps"]]
    assert steps == list(range(1, 301))
