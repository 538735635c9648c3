"""A TorchSharp model whose loss turns NaN (issue 28, item 6, on the .NET stand-in): the soak ends
FINDINGS with the non-finite finding (OC501, its subjects naming the loss) at the first NaN step,
never a traceback, and its summary is final (not ``running``). Two causes: the stand-in returning a
NaN loss (``extra.nan_loss_at``, a diverged model) and a user's own ``Step`` writing a NaN into a
weight before its ``optimizer.step()`` (in-step bug ``nan-weight``, tests/dotnet/TestLoop.cs). The
same soaks without them are clean. Run as ``python -m optcheck soak`` subprocesses (the supervisor,
the worker and the .NET runtime as a user gets them; tests/conftest.py ``run_clis``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import run_clis
from optcheck.run import exitcodes
from optcheck.record.snapshot import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from test_bridge_worker import dll, need  # noqa: E402,F401  (dll: the module fixture)

# under -m slow (issue 48, fourth pass): the default run checks the same on real TorchSharp (a NaN written into a
# weight inside a user's Step, tests/torchsharp_real/test_real_own_trainer.py; a diverging built-in GPT,
# test_real_soak.py) and a NaN gradient on this stand-in (test_bridge_worker.py)
pytestmark = [pytest.mark.dotnet, pytest.mark.slow]

#: name -> (trainer, trainer options, the first step whose loss is NaN, or None for a clean run)
RUNS = {
    "nan-loss": ("OptCheckTest.LazyTrainer", ["nan_loss_at=40"], 40),
    "nan-weight": ("OptCheckTest.InStepTrainer", ["bug=nan-weight", "bug_at=30"], 31),
    "clean-lazy": ("OptCheckTest.LazyTrainer", [], None),
    "clean-instep": ("OptCheckTest.InStepTrainer", [], None),
}


@pytest.fixture(scope="module")
def runs(dll, tmp_path_factory):  # noqa: F811
    kind = need("coreclr")
    base = tmp_path_factory.mktemp("nan")
    commands = {}
    for name, (trainer, options, _) in RUNS.items():
        commands[name] = ["soak", "-q", "--backend", "torchsharp", "--dotnet-runtime", kind, "--dotnet-assembly",
                          str(dll), "--dotnet-trainer", trainer, "--steps", "60", "--every", "20", "--n-embd", "16",
                          "--n-head", "2", "--batch-size", "4", "--block-size", "16", "--out", str(base / name),
                          *(a for o in options for a in ("--trainer-option", o))]
    return base, run_clis(commands, jobs=2)


@pytest.mark.parametrize("name", ["nan-loss", "nan-weight"])
def test_a_nan_loss_is_the_non_finite_finding_at_its_step(runs, name):
    base, results = runs
    rc, stdout, stderr = results[name]
    assert "Traceback" not in stdout + stderr, stdout + stderr
    assert rc == exitcodes.FINDINGS, stdout + stderr
    out = base / name
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "findings" and s["exit_code"] == exitcodes.FINDINGS and s["last_step"] == 60, s
    first_nan = RUNS[name][2]
    losses = {r["step"]: r["loss"] for r in read_jsonl(out / "metrics.jsonl")}
    assert min(step for step, v in losses.items() if isinstance(v, str)) == first_nan, losses
    oc501 = [f for f in read_jsonl(out / "findings.jsonl") if f["code"] == "OC501"]
    assert oc501 and oc501[0]["step"] == first_nan and "loss" in oc501[0]["subjects"], oc501
    assert s["loss_last"] == "nan"


@pytest.mark.parametrize("name", ["clean-lazy", "clean-instep"])
def test_the_same_soaks_without_a_nan_are_clean(runs, name):
    base, results = runs
    rc, stdout, stderr = results[name]
    assert rc == exitcodes.CLEAN, stdout + stderr
    s = json.loads((base / name / "summary.json").read_text())
    assert s["status"] == "clean" and s["findings"] == 0, s
