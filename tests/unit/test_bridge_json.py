"""The .NET probe's JSON writer/reader and one-pass value statistics (dotnet/Probe/Json.cs,
dotnet/Probe/ValueStats.cs), compiled with mcs and run with mono, checked from Python:
what json.loads reads, and checksums equal to the PyTorch probe's (optcheck/pytorch/probe.py)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("mcs") is None or shutil.which("mono") is None,
                                reason="mcs/mono not installed (Debian mono-mcs, mono-runtime)")


@pytest.fixture(scope="module")
def exe(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("json") / "JsonCheck.exe"
    res = subprocess.run(["mcs", "-nologo", "-langversion:7", f"-out:{out}",
                          *map(str, sorted((REPO / "dotnet" / "Probe").glob("*.cs"))),
                          *map(str, sorted((REPO / "dotnet" / "Contract").glob("*.cs"))),
                          str(REPO / "tests" / "dotnet" / "json_check" / "JsonCheck.cs")],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def run(exe: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mono", str(exe), *args], capture_output=True, timeout=60)


def test_writer_output_is_what_json_loads_reads(exe):
    res = run(exe, "write")
    assert res.returncode == 0, res.stderr
    def strict(word):
        raise AssertionError(f"{word}: strict JSON has no NaN/Infinity (docs/run-directory.md)")

    d = json.loads(res.stdout.decode("utf-8"), parse_constant=strict)
    assert d['quote"back\\slash'] == "tab\tnewline\ncr\rbell\x07nul\x00end \u00e9\u4e2d"
    assert (d["nan"], d["inf"], d["-inf"]) == ("nan", "inf", "-inf")  # as optcheck.record.snapshot.clean_json spells them
    assert d["null_nan"] is None
    assert d["tiny"] == 5e-324 and d["third"] == 1 / 3  # round-trip precision
    assert d["big"] == -(2 ** 63) and d["longs"] == [1, -2] and d["empty"] == []
    assert d["nested"] == {"t": True, "f": False, "n": None}


def test_reader_round_trips_a_soak_configuration(exe, tmp_path):
    from optcheck.config import OptimizerConfig, RunConfig, SoakConfig, TorchSharpConfig
    from optcheck.data import load_corpus
    from optcheck.torchsharp_bridge.worker import setup_config

    cfg = SoakConfig(optimizer=OptimizerConfig(lr=3e-4, eps=1e-8), run=RunConfig(backend="torchsharp"),
                     torchsharp=TorchSharpConfig(same_init='a "b"\\c'),
                     trainer_options={'tie': "obvious", 'failfast_at': 7, 'flag': True})
    text = setup_config(cfg, load_corpus(None))
    f = tmp_path / "cfg.json"
    f.write_text(text, encoding="utf-8")
    res = run(exe, "roundtrip", str(f))
    assert res.returncode == 0, res.stdout
    assert json.loads(res.stdout.decode("utf-8")) == json.loads(text)


def test_reader_names_where_bad_json_breaks(exe, tmp_path):
    f = tmp_path / "bad.json"
    f.write_text('{"lr": 0.1, "steps": }')
    res = run(exe, "roundtrip", str(f))
    assert res.returncode == 1
    assert res.stdout.decode().strip() == "FormatException JSON: unexpected character '}' at character 21"


def test_probe_body_of_a_target_without_readable_state(exe):
    """ProbeCore.Read's JSON for a target with no TorchSharp: the schema's field names, betas joined,
    no grad = null, unmeasured memory left out, the unreadable state null with its reason in notes, the
    untracked parameter in prestep_findings as OC102; the schema validates it."""
    from optcheck.record.snapshot import SCHEMA, validate
    from optcheck.torchsharp_bridge.convert import body_from_json

    res = run(exe, "probe")
    assert res.returncode == 0, res.stderr
    body = body_from_json(res.stdout.decode("utf-8"))
    a, b = body["params"]
    assert a == {"name": "emb.weight", "ref": 11, "data_ptr": 1100, "shape": [4, 2], "dtype": "float32",
                 "is_leaf": True, "requires_grad": True, "device": "cpu", "grad": "set", "grad_norm": 0.25,
                 "value_norm": 2.0, "checksum": -5, "version": None}
    assert b["name"] == 'head "bias"' and b["grad"] == "none" and b["grad_norm"] is None
    (g,) = body["groups"]
    assert g["options"]["betas"] == [0.9, 0.95] and g["options"]["lr"] == 0.001 and g["options"]["amsgrad"] == 0.0
    assert math.isnan(g["options"]["unset"]) and "beta1" not in g["options"]
    assert [m["name"] for m in g["members"]] == ["emb.weight"]
    assert body["state"] is None and "state_bytes" not in body["memory"]
    assert body["notes"] == ["optimizer state not readable: no field '_state' on System.Object or its base types "
                             "(reflection; TorchSharp declares _state on TorchSharp.Modules.OptimizerHelper)"]
    assert body["optimizer"] == {"type": "MyOpt", "state_init": "eager"}
    assert body["memory"]["live_tensors"] == 7 and "peak_tensors" not in body["memory"]
    assert body["memory"]["managed_bytes"] > 0 and body["memory"]["rss_bytes"] > 0
    assert body["prestep_findings"] == [{"code": "OC102", "line": '1 trainable model parameter(s) in no param group, '
                                         'never trained: head "bias" (handle 12)', "names": ['head "bias"'],
                                         "refs": [12]}]
    validate({"schema": SCHEMA, "backend": "torchsharp", "run": "t", "step": 0, "phase": "post-step",
              "trigger": "start", **body, "events": []})


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_checksum_and_norm_match_the_pytorch_probe(exe, tmp_path, dtype):
    torch = pytest.importorskip("torch")
    from optcheck.pytorch.probe import checksum as torch_checksum

    torch.manual_seed(0)
    t = torch.randn(40_000, dtype=getattr(torch, dtype))  # > one 16384-element chunk: the chunk loop runs
    f = tmp_path / "values.bin"
    f.write_bytes(t.view(torch.uint8).numpy().tobytes() if dtype == "bfloat16" else t.numpy().tobytes())
    kind = dtype if dtype != "bfloat16" else "words32"
    res = run(exe, "values", kind, str(f))
    assert res.returncode == 0, res.stderr
    norm, dotnet_sum = res.stdout.decode().split()
    assert int(dotnet_sum) == int(torch_checksum(t))
    if dtype != "bfloat16":
        assert float(norm) == pytest.approx(float(np.linalg.norm(t.double().numpy())), rel=1e-12)
    # one ulp moved in one value changes the checksum
    t2 = t.clone()
    t2.view(torch.int16 if dtype == "bfloat16" else torch.int32 if dtype == "float32" else torch.int64)[123] += 1
    f.write_bytes(t2.view(torch.uint8).numpy().tobytes() if dtype == "bfloat16" else t2.numpy().tobytes())
    assert int(run(exe, "values", kind, str(f)).stdout.decode().split()[1]) != int(dotnet_sum)
