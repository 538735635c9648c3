"""The autograd seed failures 000–004 (``optcheck/scenarios.py``) as scenarios, run both ways.

With the hazard probes on, each scenario is flagged at the injection step, naming
the op or module and the user source line; with them off
(``SoakConfig(hazards=False)``) the same run fails the way the seed report did —
the same RuntimeError text — or trains silently without gradients. Together they
give the lead time in ``optcheck/scenarios.py``'s ``without_optcheck`` text.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from conftest import SMALL, run_clis
from optcheck.run import exitcodes
from optcheck.config import ChecksConfig, DataConfig, ModelConfig, OptimizerConfig, RunConfig, SoakConfig
from optcheck.engine import check_stream
from optcheck.pytorch import hazard_scenarios, scenarios
from optcheck.pytorch.train import Trainer
from optcheck.record.snapshot import read_jsonl
from optcheck.drivers.worker_loop import StepStopped

torch.set_num_threads(1)
INJECT = 3


def trainer(hazards: bool, n_layer: int = 2) -> Trainer:
    cfg = SoakConfig(model=ModelConfig(n_layer=n_layer, n_embd=32, n_head=2, block_size=32),
                     optimizer=OptimizerConfig(warmup_steps=1), data=DataConfig(batch_size=4), run=RunConfig(steps=10),
                     checks=ChecksConfig(hazards="auto" if hazards else "off"))
    return Trainer(cfg, vocab_size=256)


def run(tr: Trainer, name: str, steps: int = INJECT + 1, inject=None):
    """Train ``steps`` steps, injecting ``name`` (or calling ``inject(trainer, step)``) at step
    INJECT; return (events by step, exception, step)."""
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (4, 32)), rng.integers(0, 256, (4, 32))
    events = {}
    for step in range(1, steps + 1):
        if step == INJECT:
            scenarios.apply(name, tr, step) if inject is None else inject(tr, step)
        try:
            tr.train_step(step, x, y)
        except (StepStopped, RuntimeError) as e:
            return events, e, step
        events[step] = tr.hazards.drain()
    return events, None, steps


def test_kv_cache_inplace():
    events, exc, step = run(trainer(True), "kv-cache-inplace")
    assert isinstance(exc, StepStopped) and step == INJECT and all(not e for e in events.values())
    d = exc.event["detail"]
    assert exc.event["kind"] == "inplace_on_saved" and d["phase"] == "forward"
    assert d["saved_by"]["op"] == "BmmBackward0" and d["saved_by"]["module"] == "h.0.attn"
    assert d["written"]["code"].startswith("k = cache_k.index_copy_(2, input_pos, k)")
    assert exc.event["where"].startswith("hazard_scenarios.py:")
    # without optcheck: seed 000's exact error, at the same step, in backward
    _, exc, step = run(trainer(False), "kv-cache-inplace")
    assert step == INJECT and isinstance(exc, RuntimeError) and not isinstance(exc, StepStopped)
    assert ("one of the variables needed for gradient computation has been modified by an inplace operation: "
            "[torch.LongTensor [1]] is at version 1; expected version 0 instead.") in str(exc)


@pytest.mark.parametrize("n_layer", [1, 2])
def test_mask_inplace_caught_in_the_checkpoint_recompute(n_layer):
    _, exc, step = run(trainer(True, n_layer), "mask-inplace")
    assert isinstance(exc, StepStopped) and step == INJECT
    d = exc.event["detail"]
    assert d["phase"] == "backward (recompute)" and d["saved_by"]["op"] == "MulBackward0"
    assert d["written"]["code"].startswith("keep.masked_fill_(~causal, 0.0)")
    assert d["tensor"]["shape"] == [1, 1, 32, 32]
    _, exc2, step2 = run(trainer(False, n_layer), "mask-inplace")
    assert step2 == INJECT and isinstance(exc2, RuntimeError)
    expected = (f"[torch.FloatTensor [1, 1, 32, 32]] is at version {n_layer + 1}; "
                f"expected version {n_layer} instead.")
    assert expected in str(exc2) and expected in d["pytorch_error"]  # optcheck predicted PyTorch's text


@pytest.mark.parametrize("n_layer", [1, 2])
def test_mask_inplace_under_non_reentrant_checkpoint(n_layer):
    """``use_reentrant=False``: torch.utils.checkpoint's own saved-tensor hooks replace the
    probes' during the recompute; the write is still found there, at the injection step.
    Without optcheck PyTorch says nothing (the recompute checks no version counter)."""
    def inject(tr, step):
        return hazard_scenarios.mask_inplace(tr, step, use_reentrant=False)

    _, exc, step = run(trainer(True, n_layer), "mask-inplace", inject=inject)
    assert isinstance(exc, StepStopped) and step == INJECT
    d = exc.event["detail"]
    assert d["phase"] == "backward (recompute)" and d["checkpoint"] == "non-reentrant"
    assert d["written"]["code"].startswith("keep.masked_fill_(~causal, 0.0)")
    assert d["saved_by"]["code"] == "att = F.softmax(att, dim=-1) * keep"
    assert d["saved_by"]["module"] == f"h.{n_layer - 1}.attn" and d["version"] == d["saved_version"] + 1
    events, exc2, _ = run(trainer(False, n_layer), "mask-inplace", inject=inject)
    assert exc2 is None and all(not e for e in events.values())  # silent without optcheck


def test_fp32_cast_nograd_partial_cut_and_silent_training_without_optcheck():
    events, exc, _ = run(trainer(True), "fp32-cast-nograd")
    assert exc is None and not events[INJECT - 1]
    (ev,) = events[INJECT]
    d = ev["detail"]
    assert ev["kind"] == "graph_cut" and d["cut"] == "partial" and d["first_module"]["module"] == "h.0.ln_1"
    assert d["first_module"]["code"] == "x = x + self.attn(self.ln_1(x))" and ev["where"].startswith("gpt.py:")
    assert d["n_params_without_grad"] == 27
    tr = trainer(False)
    _, exc, _ = run(tr, "fp32-cast-nograd")
    starved = [n for n, p in tr.model.named_parameters() if p.grad is None]
    assert exc is None and len(starved) == 27 and "lm_head.weight" not in starved  # trains silently


def test_a_partial_cut_that_goes_on_is_reported_again_at_each_later_step():
    """The first card run (benchmarks/gpu_check.sh) took two events for one cut as a fault:
    the cut is named at its step, then the same cut again at each step it goes on."""
    events, exc, _ = run(trainer(True), "fp32-cast-nograd", steps=INJECT + 2)
    assert exc is None and not events[INJECT - 1]
    cuts = {step: [e for e in evs if e["kind"] == "graph_cut"] for step, evs in events.items() if evs}
    assert sorted(cuts) == [INJECT, INJECT + 1, INJECT + 2] and all(len(c) == 1 for c in cuts.values())
    first = cuts[INJECT][0]["detail"]["first_module"]
    assert first["module"] == "h.0.ln_1" and all(c[0]["detail"]["first_module"] == first for c in cuts.values())
    assert all(c[0]["step"] == step for step, c in cuts.items())


def test_detached_loss():
    _, exc, step = run(trainer(True), "detached-loss")
    assert isinstance(exc, StepStopped) and step == INJECT
    d = exc.event["detail"]
    assert d["cut"] == "full" and d["first_module"]["module"] == "wte" and not d["first_module"]["grad_enabled"]
    assert d["n_params_without_grad"] == 28 and exc.event["where"].startswith("gpt.py:")
    _, exc, step = run(trainer(False), "detached-loss")
    assert step == INJECT and str(exc) == "element 0 of tensors does not require grad and does not have a grad_fn"
    assert d["pytorch_error"] == str(exc)


def test_nonleaf_grad_read():
    events, exc, _ = run(trainer(True), "nonleaf-grad-read", steps=INJECT + 2)
    assert exc is None and not events[INJECT - 1]
    (ev,) = events[INJECT]
    assert ev["kind"] == "nonleaf_grad_access" and ev["where"].startswith("hazard_scenarios.py:")
    assert ev["detail"]["code"].startswith("g = logits.grad")
    assert events[INJECT + 1][0]["count"] == 1
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        tr = trainer(False)
        _, exc, _ = run(tr, "nonleaf-grad-read", steps=INJECT + 2)
    reads = [w for w in shown if "is not a leaf Tensor is being accessed" in str(w.message)]
    assert exc is None and len(reads) == 3 and tr.last_logits_grad is None


# -- through the CLI: a short soak, the scenario at step 500 --------------------------------
SEEDS = {"mask-inplace": "OC301", "fp32-cast-nograd": "OC203", "detached-loss": "OC203",
         "nonleaf-grad-read": "OC201"}


@pytest.fixture(scope="module")
def soaks(tmp_path_factory):
    """{name: (run directory, exit code, stdout)}: the 600-step kv-cache soak and a 60-step soak per
    seed of :data:`SEEDS`, independent of each other, run side by side once (``run_clis``)."""
    root = tmp_path_factory.mktemp("seeds")
    commands = {"kv-cache-inplace": ["--steps", "600", "--every", "100", "--inject", "kv-cache-inplace@500"]}
    commands.update({name: ["--steps", "60", "--every", "20", "--inject", f"{name}@50"] for name in SEEDS})
    done = run_clis({name: ["soak", "-q", *args, "--out", str(root / name), *SMALL] for name, args in commands.items()})
    return {name: (root / name, rc, stdout) for name, (rc, stdout, _) in done.items()}


def test_soak_flags_kv_cache_inplace_at_step_500_and_exits_1(soaks):
    out, rc, stdout = soaks["kv-cache-inplace"]
    assert rc == exitcodes.FINDINGS, stdout
    findings = list(read_jsonl(out / "findings.jsonl"))
    assert [(f["code"], f["step"]) for f in findings] == [("OC301", 500)]
    assert "index_copy_" in findings[0]["message"] and "hazard_scenarios.py:" in findings[0]["message"]
    assert "expected version" in findings[0]["next_failure"]
    assert json.loads((out / "summary.json").read_text())["findings"] == 1


@pytest.mark.parametrize("name,code", list(SEEDS.items()))
def test_soak_flags_each_seed_at_the_injection_step(soaks, name, code):
    out, rc, stdout = soaks[name]
    assert rc == exitcodes.FINDINGS, stdout
    findings = list(read_jsonl(out / "findings.jsonl"))
    first = findings[0]
    assert (first["code"], first["step"]) == (code, 50), findings
    # the recorded stream gives the same finding (rules read snapshots only)
    snaps = [s for s in read_jsonl(out / "snapshots.jsonl")]
    assert (code, 50) in [(f.code, f.step) for f in check_stream(snaps)]
