"""``optcheck soak --device``: a device that is not there is one line and exit 2 (on this
machine, which has no CUDA), the run names its device, and a step that runs out of memory
ends the run with what was held and what rose before it.

The out-of-memory step is real: a user's forward hook asks the CPU allocator for an
impossible tensor mid-step (``DefaultCPUAllocator: can't allocate memory``, the CPU's
``torch.OutOfMemoryError``), after a history list kept a copy of every step's logits.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import SMALL, run_cli
from optcheck.run import exitcodes
from optcheck.config import DataConfig, ModelConfig, RunConfig, SoakConfig
from optcheck.pytorch.train import TorchBackend
from optcheck.drivers.worker_loop import run as run_worker
from recording_stream import RecordingStream


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: --device cuda is no error here")
def test_device_cuda_without_cuda_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--device", "cuda", "--steps", "20",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == exitcodes.USAGE
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "--device cuda: CUDA is not available" in err[0], r.stderr
    assert "Traceback" not in r.stderr and not out.exists()  # nothing run, nothing left behind


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "gpu0"])
def test_a_device_that_is_no_device_is_refused_before_anything_runs(bad):
    code, _, err = run_cli(["soak", "--device", bad, "--steps", "5"])
    assert code == exitcodes.USAGE and f"--device {bad!r}: must be cpu, cuda or cuda:N" in err


def test_the_run_names_its_device(tmp_path):
    out = tmp_path / "run"
    code, stdout, _ = run_cli(["soak", "-q", "--steps", "30", "--every", "10", "--out", str(out), *SMALL])
    assert code == exitcodes.CLEAN, stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["config"]["device"] == "cpu" and s["versions"]["device"] == "cpu"
    snap = json.loads((out / "snapshots.jsonl").read_text().splitlines()[-1])
    assert snap["versions"]["device"] == "cpu"


class OutOfMemoryAt(TorchBackend):
    """The soak's backend with the user's bug: a history of every step's logits (memory rises)
    and, at step ``at``, a forward that asks for more memory than the machine has."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.history = at, []

    def setup(self, cfg, corpus):
        super().setup(cfg, corpus)

        def forward_hook(trainer, logits, loss):
            self.history.append(logits.detach().clone())  # grows every step
            if self.steps_done + 1 == self.at:
                torch.empty(1 << 60, dtype=torch.uint8)  # the allocator refuses: a real OOM
            return loss

        self.trainer.extra_forward.append(forward_hook)


def test_an_out_of_memory_step_ends_the_run_with_what_was_held_and_what_rose():
    torch.set_num_threads(1)
    cfg = SoakConfig(model=ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=32),
                     data=DataConfig(val_every=0, batch_size=16), run=RunConfig(steps=60, every=10, run_id="oom"))
    stream = RecordingStream()
    code = run_worker(OutOfMemoryAt(45), cfg, stream)
    assert code == 1  # a crash of the training code: the supervisor makes it exit 3
    (crash,) = stream.of("crash")
    assert crash["step"] == 45 and "can't allocate memory" in crash["message"]
    oom = crash["oom"]
    assert oom["device"] == "cpu" and oom["rss_bytes"] > 0
    assert [b["after_step"] for b in oom["before"]] == [0, 10, 20, 30, 40]
    assert oom["rose"] and all(v > 0 for v in oom["rose"].values())
    assert oom["summary"].startswith("out of memory at this step: RSS ") and "steps 0-40" in oom["summary"]
    # the steps before it were all sent, with their losses
    steps = [s for p in stream.of("metrics") for s in p["steps"]]
    assert steps == list(range(1, 45))


def test_the_torchsharp_worker_is_handed_the_device():
    """The TorchSharp trainer's configuration carries ``device`` (``GptTrainer.Setup`` moves the
    GPT there: dotnet/Worker/Trainer.cs ``OnDevice``; compiled here, not run: docs/torchsharp.md)."""
    from optcheck.data import load_corpus
    from optcheck.torchsharp_bridge.worker import setup_config

    doc = json.loads(setup_config(SoakConfig(run=RunConfig(backend="torchsharp", device="cuda:1")), load_corpus(None)))
    assert doc["device"] == "cuda:1"
    doc = json.loads(setup_config(SoakConfig(run=RunConfig(backend="torchsharp")), load_corpus(None)))
    assert doc["device"] == "cpu"
