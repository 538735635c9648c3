"""optcheck/pytorch/export_init.py: the --same-init export round-trips, in Python and through the
C# reader the TorchSharp worker uses (dotnet/Worker/InitManifest.cs, compiled here with mcs and
run on Mono)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from optcheck.config import ChecksConfig, DataConfig, ModelConfig, RunConfig, SoakConfig
from optcheck.errors import InputError
from optcheck.pytorch import export_init
from optcheck.pytorch.gpt import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[2]
torch.set_num_threads(1)


def small_gpt(seed: int = 3) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=16))


def test_round_trip_is_exact_and_names_follow_named_parameters(tmp_path):
    model = small_gpt()
    out = export_init.export_model(model, tmp_path / "init", meta={"seed": 3})
    back = export_init.load_export(out)
    named = dict(model.named_parameters())
    assert list(back) == list(named)
    assert "wte.weight" in back and "lm_head.weight" not in back  # the tied tensor, once
    for name, p in named.items():
        np.testing.assert_array_equal(back[name], p.detach().numpy())
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["format"] == "optcheck.init/1" and doc["seed"] == 3 and doc["byte_order"] == "little"
    lines = [ln for ln in (out / "manifest.txt").read_text().splitlines() if not ln.startswith("#")]
    assert len(lines) == len(named)
    name, dtype, shape, fname = lines[0].split("\t")
    assert (name, dtype, shape) == ("wte.weight", "float32", "64,16")
    assert (out / fname).stat().st_size == 64 * 16 * 4


def test_reexport_replaces_old_files(tmp_path):
    out = export_init.export_model(small_gpt(), tmp_path / "init")
    (out / "999_stale.f32").write_bytes(b"\0" * 4)
    export_init.export_model(small_gpt(), out)
    assert not (out / "999_stale.f32").exists()


def test_export_for_config_is_the_model_a_pytorch_soak_starts_from(tmp_path):
    from optcheck.pytorch.train import Trainer

    data = tmp_path / "text.txt"
    data.write_bytes(bytes(range(32, 127)) * 40)
    cfg = SoakConfig(model=ModelConfig(block_size=16, n_layer=1, n_head=2, n_embd=16), data=DataConfig(path=str(data)),
                     run=RunConfig(seed=11, steps=10, work_dir=str(tmp_path)), checks=ChecksConfig(hazards="off"))
    out = export_init.export_for_config(cfg, tmp_path / "init")
    back = export_init.load_export(out)
    trainer = Trainer(cfg, 256)
    for name, p in trainer.model.named_parameters():
        np.testing.assert_array_equal(back[name], p.detach().numpy())
    assert json.loads((out / "manifest.json").read_text())["vocab_size"] == 256


def test_cli_writes_and_rejects_bad_input_with_one_line(tmp_path):
    data = tmp_path / "text.txt"
    data.write_bytes(b"abcdefgh" * 200)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(SoakConfig(model=ModelConfig(block_size=16, n_layer=1, n_embd=16, n_head=2),
                              data=DataConfig(path=str(data))).to_json())
    ok = subprocess.run([sys.executable, "-m", "optcheck.pytorch.export_init", "--config", str(cfg),
                         "--out", str(tmp_path / "init")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "init" / "manifest.txt").is_file()
    cfg.write_text(SoakConfig(data=DataConfig(path=str(tmp_path / "missing.txt"))).to_json())
    bad = subprocess.run([sys.executable, "-m", "optcheck.pytorch.export_init", "--config", str(cfg),
                          "--out", str(tmp_path / "x")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such file" in bad.stderr


def test_load_export_rejects_a_truncated_file(tmp_path):
    out = export_init.export_model(small_gpt(), tmp_path / "init")
    f = sorted(out.glob("*.f32"))[0]
    f.write_bytes(f.read_bytes()[:-4])
    with pytest.raises(InputError, match="bytes, expected"):
        export_init.load_export(out)


@pytest.fixture(scope="module")
def csharp_reader(tmp_path_factory):
    if shutil.which("mcs") is None or shutil.which("mono") is None:
        pytest.skip("mcs/mono not installed (Debian mono-mcs, mono-runtime)")
    exe = tmp_path_factory.mktemp("initcheck") / "InitManifestCheck.exe"
    res = subprocess.run(["mcs", "-out:" + str(exe), str(REPO / "dotnet" / "Worker" / "InitManifest.cs"),
                          str(REPO / "tests" / "dotnet" / "init_manifest" / "InitManifestCheck.cs")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return exe


def run_reader(exe: Path, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["mono", str(exe), str(folder)], capture_output=True, text=True, timeout=60)


def test_the_csharp_reader_reads_what_python_wrote(tmp_path, csharp_reader):
    model = small_gpt(5)
    out = export_init.export_model(model, tmp_path / "init")
    res = run_reader(csharp_reader, out)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [ln.split("\t") for ln in res.stdout.splitlines()]
    named = dict(model.named_parameters())
    assert [r[0] for r in rows] == list(named)
    for name, shape, count, first, total in rows:
        a = named[name].detach().numpy().astype(np.float32)
        assert shape == ",".join(str(d) for d in a.shape) and int(count) == a.size
        assert float(first) == float(a.reshape(-1)[0])  # exact: the same float32 bits
        assert float(total) == pytest.approx(float(a.astype(np.float64).sum()), rel=1e-12, abs=1e-12)


def test_the_csharp_reader_rejects_a_wrong_size(tmp_path, csharp_reader):
    out = export_init.export_model(small_gpt(), tmp_path / "init")
    f = sorted(out.glob("*.f32"))[1]
    f.write_bytes(f.read_bytes()[:-4])
    res = run_reader(csharp_reader, out)
    assert res.returncode == 3 and "error\t--same-init" in res.stdout and "bytes, expected" in res.stdout
