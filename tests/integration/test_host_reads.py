"""No host read of a device value between snapshots: the soak's worker loop and
``optcheck.Monitor(every=100)``, counted on the CPU with ``optcheck.pytorch.hostreads``.

On a GPU each such read is a sync (the check of ``tests/gpu/test_cuda.py`` counts them with
``torch.cuda.set_sync_debug_mode``); here the same code runs on the CPU, and the counter
sees every ``.item()``/``float()``/``bool()``/``.tolist()``/``.cpu()`` it makes. A read is
allowed inside ``Sequencer.take`` (a snapshot) and the soak's metrics batch
(``Loop.flush_metrics``); any other read by optcheck's code fails the test. Real training:
the soak's GPT with AdamW, gradient clipping, the hazard probes and held-out passes; a
user loop with its own model under the Monitor.
"""

from __future__ import annotations

import math

import pytest
import torch

import optcheck
from optcheck.config import ChecksConfig, DataConfig, ModelConfig, OptimizerConfig, RunConfig, SoakConfig
from optcheck.data import load_corpus
from optcheck.pytorch import probe
from optcheck.pytorch.hostreads import HostReadCounter
from optcheck.pytorch.train import TorchBackend
from optcheck.run.sequencer import Sequencer
from optcheck.drivers.worker_loop import Loop
from recording_stream import RecordingStream


def soak_loop(steps=120, **kw):
    torch.set_num_threads(1)
    cfg = SoakConfig(model=ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=32),
                     data=DataConfig(val_every=40, batch_size=4), run=RunConfig(steps=steps, every=50, run_id="t"),
                     **kw)  # a section
    be = TorchBackend()
    corpus = load_corpus(None, None)
    be.setup(cfg, corpus)
    stream = RecordingStream()
    return Loop(be, cfg, stream), corpus, stream


@pytest.mark.parametrize("kw", [{}, {"checks": ChecksConfig(hazards="always")},
                                {"optimizer": OptimizerConfig(grad_clip=0.0)}, {"checks": ChecksConfig(hazards="off")}],
                         ids=["auto", "always", "no-clip", "no-hazards"])
def test_the_soak_worker_reads_nothing_between_snapshots(kw):
    loop, corpus, stream = soak_loop(**kw)
    with HostReadCounter(exempt=[Sequencer.take, Loop.flush_metrics]) as reads:
        loop.run(corpus)
    assert reads.count(by="optcheck", exempt=False) == 0, reads.report(by="optcheck", exempt=False)
    # the counter did see the reads there are: the snapshots' and the metrics batches'
    assert reads.count(by="optcheck", exempt=True) >= 3, reads.report()
    # the steps' losses and held-out losses still arrive, as floats
    metrics = stream.of("metrics")
    losses = [v for m in metrics for v in m["losses"]]
    assert len(losses) == 120 and all(isinstance(v, float) and math.isfinite(v) for v in losses)
    done = stream.of("done")[0]  # (the first and last loss: the supervisor's recorder counts them from these)
    assert stream.of("snapshot")[-1]["snapshot"]["loss"] == losses[-1]  # the final snapshot carries the last one
    assert done["val_loss_first"] is not None and done["val_step_last"] == 120


def test_the_monitor_reads_nothing_between_snapshots():
    """``Monitor(every=100)`` on a user's loop with gradient accumulation, clipping and
    ``zero_grad(set_to_none=False)``: every probe on, 250 steps, reads only at its 4 snapshots."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    with HostReadCounter(exempt=[Sequencer.take]) as reads:
        with optcheck.Monitor(model, opt, every=100, on_finding="raise", ignore_config=False) as mon:
            for _ in range(250):
                opt.zero_grad(set_to_none=False)
                for half in (slice(0, 32), slice(32, 64)):
                    torch.nn.functional.mse_loss(model(x[half]), y[half]).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
    assert mon.findings == [] and mon.snapshots == 4
    assert reads.count(by="optcheck", exempt=False) == 0, reads.report(by="optcheck", exempt=False)
    assert reads.count(by="optcheck", exempt=True) >= 4


def test_the_counter_names_a_read_by_optcheck_and_one_by_the_user():
    """The control: a read optcheck's own code makes outside a snapshot is counted and placed
    (``probe.state`` reads a CPU ``step`` counter), a user's ``loss.item()`` is the user's."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with HostReadCounter(exempt=[Sequencer.take]) as reads:
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        user_value = loss.item()
        probe.state(opt)
    assert isinstance(user_value, float)
    mine = reads.select(by="optcheck", exempt=False)
    assert len(mine) == 2 and {r.op for r in mine} == {"aten._local_scalar_dense"}  # weight's and bias's step
    assert all("optcheck/pytorch/probe.py" in r.where for r in mine)
    (user,) = reads.select(by="user")
    assert "test_host_reads.py" in user.where and user.op == "aten._local_scalar_dense"
    assert reads.count(by="torch") >= 2  # AdamW reading its own CPU step counters


def test_a_nan_loss_is_read_later_and_dated_at_its_step():
    """The soak's loss NaN check is read at the next metrics batch or snapshot, and the event
    still carries the step of the NaN (and OC501 names it)."""
    loop, corpus, stream = soak_loop(steps=60)
    trainer = loop.backend.trainer
    trainer.extra_forward.append(lambda tr, logits, loss: loss * float("nan") if loop.step == 37 else loss)
    loop.run(corpus)
    snaps = [p["snapshot"] for p in stream.of("snapshot")]
    events = [(s["step"], e) for s in snaps for e in s["events"] if e["kind"] == "nonfinite"]
    loss_events = [(at, e["step"]) for at, e in events if e["detail"]["what"] == "loss"]
    grad_events = [(at, e["step"]) for at, e in events if e["detail"]["what"] == "grad"]
    assert loss_events and loss_events[0][1] == 37 and loss_events[0][0] >= 37
    assert grad_events and grad_events[0][1] == 37
    from optcheck.engine import RuleEngine

    engine = RuleEngine()
    for s in snaps:
        engine.feed(s)
    first = min((f for f in engine.findings if f.code == "OC501"), key=lambda f: f.step)
    assert first.step == 37 and "step 37" in first.message


def test_a_nan_read_at_a_crash_goes_out_before_it():
    """A NaN at step 37 and an exception at step 40, before any metrics batch read the NaN:
    the crash path reads the pending checks and sends their snapshot ahead of the crash."""
    from optcheck.drivers.worker_loop import run as run_worker

    class NanThenCrash(TorchBackend):
        def setup(self, cfg, corpus):
            super().setup(cfg, corpus)

            def hook(tr, logits, loss):
                if self.steps_done + 1 == 37:
                    return loss * float("nan")
                if self.steps_done + 1 == 40:
                    raise ValueError("the user's check: loss is not finite")
                return loss

            self.trainer.extra_forward.append(hook)

    torch.set_num_threads(1)
    stream = RecordingStream()
    cfg = SoakConfig(model=ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=32),
                     data=DataConfig(val_every=0, batch_size=4), run=RunConfig(steps=60, every=50, run_id="t"))
    import optcheck.drivers.worker_loop as wl

    old, wl.METRICS_FLUSH_S = wl.METRICS_FLUSH_S, 1e9  # no time-based metrics batch in between
    try:
        assert run_worker(NanThenCrash(), cfg, stream) == 1
    finally:
        wl.METRICS_FLUSH_S = old
    kinds = [t for t, _ in stream.msgs]
    last_snap = stream.of("snapshot")[-1]["snapshot"]
    assert kinds.index("crash") > len(kinds) - 3 and last_snap["trigger"] == "hazard"
    assert {(e["detail"]["what"], e["step"]) for e in last_snap["events"] if e["kind"] == "nonfinite"} >= \
        {("loss", 37), ("grad", 37)}


def test_the_monitor_reads_its_pending_checks_when_the_loop_crashes(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    with pytest.raises(ValueError):
        with optcheck.Monitor(model, opt, every=100, out=str(tmp_path / "run"), on_finding="ignore",
                              ignore_config=False) as mon:
            for step in range(1, 20):
                loss = torch.nn.functional.mse_loss(model(x), y) * (float("nan") if step == 5 else 1.0)
                if step == 8:
                    raise ValueError("the user's own check")
                opt.zero_grad()
                loss.backward()
                opt.step()
    first = min((f for f in mon.findings if f.code == "OC501"), key=lambda f: f.step)
    assert first.step == 5 and mon.summary()["status"] == "crashed"
    assert mon.summary()["lead_time"]["flagged_step"] == 5
