"""OC401 on real soaks: a leak injected mid-run is flagged with its projected step;
the same soak without it stays silent."""

from __future__ import annotations

import pytest

from conftest import SMALL, run_cli
from optcheck.run import exitcodes
from optcheck.record.snapshot import read_jsonl


def test_state_leak_is_flagged_with_a_projected_step(tmp_path):
    out = tmp_path / "leak"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "1000", "--every", "25", "--val-every", "0",
                             "--inject", "state-leak@100", "--memory-budget", "8GiB", "--out", str(out), *SMALL])
    found = [f for f in read_jsonl(out / "findings.jsonl") if f["code"] == "OC401"]
    assert rc == exitcodes.FINDINGS and found, stdout
    f = found[0]
    assert 100 < f["step"] <= 1000 and f["detail"]["projected_step"] > f["step"]
    assert "8 GiB budget at step" in f["message"]


def test_same_soak_without_the_leak_is_silent(tmp_path):
    out = tmp_path / "clean"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "1000", "--every", "25", "--val-every", "0",
                             "--memory-budget", "8GiB", "--out", str(out), *SMALL])
    assert rc == exitcodes.CLEAN, stdout
    assert list(read_jsonl(out / "findings.jsonl")) == []


@pytest.mark.slow
def test_default_20k_soak_is_clean(tmp_path):
    """The main job as the README runs it (minutes): zero findings, loss falls, every snapshot kept."""
    out = tmp_path / "default"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "20000", "--out", str(out)])
    assert rc == exitcodes.CLEAN, stdout
    snaps = list(read_jsonl(out / "snapshots.jsonl"))
    assert len(snaps) == 201 and snaps[-1]["step"] == 20000


# ---------------------------------------------------------------- TorchSharp: the .NET stand-in through pythonnet
def standin_soak(tmp_path, inject: list[str], kind: str = "coreclr", steps: int = 300):
    """The stand-in training loop (tests/dotnet/TestLoop.cs) soaked through the real worker on
    a real .NET runtime, a snapshot every 20 steps."""
    import sys
    from pathlib import Path

    from optcheck.config import (ChecksConfig, DataConfig, Injection, ModelConfig, OptimizerConfig, RunConfig,

                                 SoakConfig, TorchSharpConfig)
    from optcheck.errors import InputError
    from optcheck.drivers.soak import run_soak
    from optcheck.torchsharp_bridge import runtime

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dotnet"))
    from build import BuildUnavailable, build_testloop

    try:
        dll = build_testloop()
        runtime.select(kind)
    except (BuildUnavailable, InputError) as e:
        pytest.skip(str(e))
    cfg = SoakConfig(model=ModelConfig(n_embd=16, n_head=2, block_size=16), optimizer=OptimizerConfig(lr=1e-2),
                     data=DataConfig(batch_size=4, val_every=100),
                     run=RunConfig(backend="torchsharp", steps=steps, every=20),
                     checks=ChecksConfig(inject=[Injection.parse(i) for i in inject]),
                     torchsharp=TorchSharpConfig(runtime=kind, assembly=str(dll),
                                                 trainer="OptCheckTest.LazyTrainer"))
    out = tmp_path / "run"
    run_soak(cfg, out, progress=False)
    return list(read_jsonl(out / "findings.jsonl")), list(read_jsonl(out / "snapshots.jsonl"))


@pytest.mark.dotnet
@pytest.mark.parametrize("kind", ["coreclr", "mono"])
def test_standin_without_dispose_scope_is_named_at_the_next_snapshot(tmp_path, kind):
    found, snaps = standin_soak(tmp_path, ["no-dispose-scope@100"], kind)
    scope = [f for f in found if f["code"] == "OC402"]
    assert scope and scope[0]["step"] == 120, found
    assert scope[0]["detail"]["source"] == "statistics" and scope[0]["detail"]["tensors_per_step"] == 24
    assert "24 tensors per step created outside any scope and never disposed" in scope[0]["message"]
    mem = snaps[-1]["memory"]
    assert mem["tensors_created_outside_scope"] > mem["tensors_disposed_outside_scope"] >= 0


@pytest.mark.dotnet
def test_standin_state_leak_is_a_steady_rise_of_live_tensors(tmp_path):
    found, _ = standin_soak(tmp_path, ["state-leak@100"])
    assert [(f["code"], f["step"], f["subjects"]) for f in found] == [("OC401", 160, ["live_tensors"])], found
    assert found[0]["message"].startswith("live tensor count rises by 1 tensor per step at every snapshot")


@pytest.mark.dotnet
@pytest.mark.slow  # silent in the default run: the stand-in's clean soak (test_bridge_worker.py) and real TorchSharp's
def test_standin_clean_soak_has_no_memory_finding(tmp_path):
    found, snaps = standin_soak(tmp_path, [])
    assert found == []
    mem = snaps[-1]["memory"]
    assert mem["tensors_created_outside_scope"] == mem["tensors_disposed_outside_scope"] == 0
    assert mem["peak_tensors"] > mem["live_tensors"] > 0
