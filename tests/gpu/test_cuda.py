"""The soak and the Monitor on a CUDA GPU (marker ``gpu``; run by ``benchmarks/gpu_check.sh``).

Where ``torch.cuda.is_available()`` is False the whole module is skipped with one line,
so a run without a GPU (CI, this project's own machine) runs none of it. On a card:

- seeds 000, 001 and 002 (``optcheck/scenarios.py``) on CUDA tensors: found at the
  injection step with the same event as on the CPU; without the probes, seed 000's
  error names ``torch.cuda.LongTensor [1]``;
- a user's GPT loop (``cuda_loop.py``) with fused AdamW, foreach AdamW, bf16 autocast,
  ``GradScaler`` with fp16 and ``torch.compile`` (inductor): clean, silent; a NaN loss
  named at its step; kept outputs (their graph and all) found on ``device_allocated_bytes``
  within 300 steps at ``every=50``;
- no synchronising call by optcheck on a step without a snapshot
  (``torch.cuda.set_sync_debug_mode``), for the soak's worker loop and the Monitor;
- the soak CLI with ``--device cuda``: the summary names the card.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False): the gpu tests run on a card, "
                "benchmarks/gpu_check.sh", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
import cuda_loop  # noqa: E402
from test_seeds_pytorch import run as run_seed  # noqa: E402  (the CPU seed tests' loop)

from optcheck.config import ChecksConfig, DataConfig, ModelConfig, OptimizerConfig, RunConfig, SoakConfig  # noqa: E402
from optcheck.data import load_corpus  # noqa: E402
from optcheck.pytorch import hazard_scenarios  # noqa: E402
from optcheck.pytorch.train import TorchBackend, Trainer  # noqa: E402
from optcheck.drivers.protocol import Stream  # noqa: E402
from optcheck.run.sequencer import Sequencer  # noqa: E402
from optcheck.drivers.worker_loop import Loop, StepStopped  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OPTCHECK_DIR = str(Path(__import__("optcheck").__file__).resolve().parent) + "/"
INJECT = 3


def trainer(hazards: bool, n_layer: int = 2) -> Trainer:
    cfg = SoakConfig(model=ModelConfig(n_layer=n_layer, n_embd=32, n_head=2, block_size=32),
                     optimizer=OptimizerConfig(warmup_steps=1), data=DataConfig(batch_size=4),
                     run=RunConfig(steps=10, device="cuda"), checks=ChecksConfig(hazards="auto" if hazards else "off"))
    return Trainer(cfg, vocab_size=256)


def test_seed_000_kv_cache_on_cuda():
    _, exc, step = run_seed(trainer(True), "kv-cache-inplace")
    assert isinstance(exc, StepStopped) and step == INJECT, exc
    d = exc.event["detail"]
    assert exc.event["kind"] == "inplace_on_saved" and d["saved_by"]["module"] == "h.0.attn"
    assert d["written"]["code"].startswith("k = cache_k.index_copy_(2, input_pos, k)")
    _, exc, step = run_seed(trainer(False), "kv-cache-inplace")
    assert step == INJECT and isinstance(exc, RuntimeError) and not isinstance(exc, StepStopped)
    assert "[torch.cuda.LongTensor [1]] is at version 1; expected version 0 instead." in str(exc)


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_seed_001_mask_under_checkpointing_on_cuda(reentrant):
    _, exc, step = run_seed(trainer(True), "mask-inplace",
                            inject=lambda tr, s: hazard_scenarios.mask_inplace(tr, s, use_reentrant=reentrant))
    assert isinstance(exc, StepStopped) and step == INJECT, exc
    assert exc.event["detail"]["written"]["code"].startswith("keep.masked_fill_(~causal, 0.0)")


def test_seed_002_cast_under_no_grad_on_cuda():
    events, exc, _ = run_seed(trainer(True), "fp32-cast-nograd", steps=INJECT + 2)
    found = [e for step in events.values() for e in step] + ([exc.event] if isinstance(exc, StepStopped) else [])
    ev, *later = [e for e in found if e["kind"] == "graph_cut"]
    assert ev["step"] == INJECT and ev["detail"]["cut"] == "partial", ev
    assert ev["detail"]["first_module"]["module"] == "h.0.ln_1"
    # the cut goes on at each later step: the same cut again (as on the CPU: test_seeds_pytorch.py)
    assert [e["step"] for e in later] == list(range(INJECT + 1, INJECT + 3))
    assert all(e["detail"]["first_module"] == ev["detail"]["first_module"] for e in later)


CLEAN = [dict(optim="fused", precision="bf16"), dict(optim="foreach", precision="bf16"),
         dict(optim="fused", precision="fp32"), dict(optim="fused", precision="fp16"),
         dict(optim="fused", precision="bf16", compile=True)]


@pytest.mark.parametrize("kw", CLEAN, ids=["fused-bf16", "foreach-bf16", "fused-fp32", "fused-fp16-scaler",
                                           "compile-bf16"])
def test_clean_loops_are_silent(kw, tmp_path):
    res = cuda_loop.train(steps=40, monitor=dict(every=10, out=str(tmp_path / "run"), on_finding="ignore",
                                                 ignore_config=False), **kw)
    assert res.mon.findings == [], [f.message for f in res.mon.findings]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "clean" and summary["versions"]["device"].startswith("cuda:")
    snaps = [json.loads(line) for line in (tmp_path / "run" / "snapshots.jsonl").read_text().splitlines()]
    assert all(s["memory"]["device_allocated_bytes"] > 0 for s in snaps[1:])


@pytest.mark.parametrize("kw", CLEAN[:2] + CLEAN[4:], ids=["fused-bf16", "foreach-bf16", "compile-bf16"])
def test_a_nan_loss_is_named_at_its_step(kw):
    res = cuda_loop.train(steps=30, bug="nan-loss", bug_at=13,
                          monitor=dict(every=10, on_finding="ignore", ignore_config=False), **kw)
    first = min((f for f in res.mon.findings if f.code == "OC501"), key=lambda f: f.step)
    assert first.step == 13 and "step 13" in first.message


def test_no_zero_grad_is_named_from_its_step():
    res = cuda_loop.train(steps=30, bug="no-zero-grad", bug_at=7,
                          monitor=dict(every=10, on_finding="ignore", ignore_config=False))
    (f,) = [f for f in res.mon.findings if f.code == "OC204"]
    assert f.detail["first_step"] == 8 and "from step 8" in f.message  # the first backward into kept grads


def test_the_gpu_leak_is_found_within_300_steps_at_every_50():
    """Each step's logits kept with their graph on the GPU from step 100: OC401 on device memory
    by step 400; the caching allocator's warm-up over the first steps is no finding."""
    res = cuda_loop.train(sizes=dict(cuda_loop.TINY, n_embd=128, block_size=128), batch=16, steps=400,
                          bug="keep-outputs", bug_at=100,
                          monitor=dict(every=50, on_finding="ignore", ignore_config=False))
    found = [f for f in res.mon.findings if f.code == "OC401" and f.key.startswith("device_")]
    assert found and found[0].step <= 400, [(f.code, f.step, f.key) for f in res.mon.findings]
    clean = cuda_loop.train(sizes=dict(cuda_loop.TINY, n_embd=128, block_size=128), batch=16, steps=400,
                            monitor=dict(every=50, on_finding="ignore", ignore_config=False))
    assert clean.mon.findings == []


# -- no sync ---------------------------------------------------------------------------------
class _SyncWatch:
    """``torch.cuda.set_sync_debug_mode("warn")`` for a block: the synchronising calls as
    warnings, each placed by its stack (optcheck's own frames only, outside ``exempt``)."""

    def __init__(self, exempt):
        self.exempt = {f.__code__ for f in exempt}
        self.found: list[str] = []

    def __enter__(self):
        self._cm = warnings.catch_warnings()  # puts the filters and showwarning back on exit
        self._cm.__enter__()
        warnings.simplefilter("always")
        import traceback

        self._orig = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" not in str(message):
                return
            frames = [f for f, _ in traceback.walk_stack(None)]
            if any(f.f_code in self.exempt for f in frames):
                return
            mine = [f for f in frames if f.f_code.co_filename.startswith(OPTCHECK_DIR)]
            if mine:
                self.found.append(f"{mine[0].f_code.co_filename}:{mine[0].f_lineno}: {message}")

        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = self._orig
        self._cm.__exit__(*exc)


def test_no_sync_between_snapshots_in_the_soak_worker():
    cfg = SoakConfig(model=ModelConfig(n_layer=2, n_embd=64, n_head=2, block_size=64),
                     data=DataConfig(val_every=40, batch_size=8),
                     run=RunConfig(steps=120, every=50, run_id="t", device="cuda"))
    be = TorchBackend()
    corpus = load_corpus(None, None)
    be.setup(cfg, corpus)
    loop = Loop(be, cfg, Stream(None))
    with _SyncWatch([Sequencer.take, Loop.flush_metrics]) as w:
        loop.run(corpus)
    assert w.found == [], "\n".join(w.found[:20])


def test_no_sync_between_snapshots_in_the_monitor():
    with _SyncWatch([Sequencer.take]) as w:
        res = cuda_loop.train(steps=250, monitor=dict(every=100, on_finding="ignore", ignore_config=False))
    assert res.mon.findings == [] and w.found == [], "\n".join(w.found[:20])


def test_the_soak_cli_on_cuda_names_the_card(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--device", "cuda", "--steps", "200",
                        "--every", "50", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["config"]["device"] == "cuda" and s["versions"]["device"].startswith("cuda:0 ")
    assert s["versions"]["cuda_capability"] and s["versions"]["cuda"]
    times = [json.loads(line)["step_time_s"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(times) == 200 and all(t > 0 for t in times)  # CUDA-event times
