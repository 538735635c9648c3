"""``optcheck soak --trainer-option KEY=VALUE`` reaches a user's TorchSharp trainer as ``extra.KEY``, and
``--dotnet-trainer`` may be left out when the assembly holds exactly one trainer type.

Real: the optcheck CLI, the worker process, pythonnet on CoreCLR, the shipped dotnet/Probe sources
(``TrainerOptions``, ``Driver.TrainerTypes``). The assembly is tests/dotnet/single_trainer/OnlyTrainer.cs
(one trainer type) compiled with mcs; the stand-in TestLoop.dll holds several.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optcheck.errors import InputError
from optcheck.torchsharp_bridge.options import RESERVED, parse_trainer_options

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from test_bridge_worker import config, dll, need, soak  # noqa: E402,F401


def test_trainer_options_parse():
    assert parse_trainer_options(["width=128", "data=/x/y.txt", "label=a=b", "empty=", "width=64"]) == {
        "width": "64", "data": "/x/y.txt", "label": "a=b", "empty": ""}
    assert parse_trainer_options([]) == {}


@pytest.mark.parametrize("bad, says", [
    ("width", "expected KEY=VALUE"),
    ("=3", "KEY must be a name"),
    ("9lives=1", "KEY must be a name"),
    ("a b=1", "KEY must be a name"),
    ("dotnet_assembly=x.dll", "dotnet_assembly is set by optcheck itself (use its own option, --dotnet-assembly, or "
                              "pick another name)"),
    ("fused=0", "fused is set by optcheck itself (pick another name)"),  # no --fused option to point at
    ("same_init_dir=/x", "same_init_dir is set by optcheck itself (pick another name)"),
])
def test_a_malformed_trainer_option_is_one_line(bad, says):
    with pytest.raises(InputError) as e:
        parse_trainer_options([bad])
    assert says in str(e.value) and "\n" not in str(e.value)
    assert "optimizer" in RESERVED and "dotnet_trainer" in RESERVED


def cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optcheck.cli", "soak", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


def test_a_malformed_trainer_option_on_the_cli_is_one_line_and_exit_2(tmp_path):
    res = cli("--backend", "torchsharp", "--steps", "5", "-q", "--trainer-option", "width", "--out", str(tmp_path / "r"))
    assert res.returncode == 2
    assert [ln for ln in res.stderr.splitlines() if ln.strip()] == [
        "optcheck: error: --trainer-option 'width': expected KEY=VALUE (the trainer reads it as extra.KEY)"]
    assert not (tmp_path / "r").exists()


@pytest.fixture(scope="module")
def only_dll(tmp_path_factory) -> Path:
    if shutil.which("mcs") is None:
        pytest.skip("mcs not installed (Debian mono-mcs)")
    out = tmp_path_factory.mktemp("one") / "OnlyOne.dll"
    res = subprocess.run(["mcs", "-target:library", "-nologo", "-langversion:7", f"-out:{out}",
                          *map(str, sorted((ROOT / "dotnet" / "Probe").glob("*.cs"))),
                          *map(str, sorted((ROOT / "dotnet" / "Contract").glob("*.cs"))),
                          str(ROOT / "tests" / "dotnet" / "single_trainer" / "OnlyTrainer.cs")],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def test_trainer_options_reach_setup_and_the_one_trainer_is_found(only_dll, tmp_path):
    need("coreclr")
    run = tmp_path / "run"
    res = cli("--backend", "torchsharp", "--dotnet-assembly", str(only_dll), "--steps", "20", "--every", "10", "-q",
              "--trainer-option", "width=128", "--trainer-option", "label=a=b", "--trainer-option", "flag=true",
              "--out", str(run))
    assert res.returncode == 0, res.stderr
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "clean"
    v = s["versions"]   # OnlyTrainer reports what its Setup read as extra.KEY
    assert (v["trainer_width"], v["trainer_label"], v["trainer_flag"]) == ("128", "a=b", "True")


def test_a_trainer_option_the_trainer_rejects_is_one_line(only_dll, tmp_path):
    need("coreclr")
    res = cli("--backend", "torchsharp", "--dotnet-assembly", str(only_dll), "--steps", "5", "-q",
              "--trainer-option", "width=wide", "--out", str(tmp_path / "run"))
    assert res.returncode == 2
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert line == "optcheck: error: --dotnet-trainer OnlyOne.OnlyTrainer: extra.width: expected an integer, got 'wide'"


def test_without_dotnet_trainer_an_assembly_of_several_trainers_names_them(dll, tmp_path):  # noqa: F811
    need("coreclr")
    cfg = config(dll, steps=5)
    cfg.torchsharp.trainer = None
    with pytest.raises(InputError) as e:
        soak(cfg, tmp_path / "run")
    msg = str(e.value)
    assert msg.startswith(f"--dotnet-assembly {dll}: TestLoop holds ") and "trainer types: " in msg
    assert "OptCheckTest.LazyTrainer" in msg and "name one with --dotnet-trainer" in msg and "\n" not in msg


# -- start-up errors ---------------------------------------------------------------------------

def test_mono_with_a_net8_assembly_is_refused_in_one_line(tmp_path):
    """The TorchSharp worker (and a user's project like examples/torchsharp-own-model) targets net8.0, which
    Mono 6.8 cannot load; the refusal says so before any runtime is loaded."""
    need("mono")
    if shutil.which("mcs") is None:
        pytest.skip("mcs not installed (Debian mono-mcs)")
    src = tmp_path / "Net8.cs"
    src.write_text('[assembly: System.Runtime.Versioning.TargetFramework(".NETCoreApp,Version=v8.0")]\n'
                   "namespace Net8 { public sealed class Nothing { } }\n")
    asm = tmp_path / "Net8.dll"
    res = subprocess.run(["mcs", "-target:library", "-nologo", f"-out:{asm}", str(src)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    res = cli("--backend", "torchsharp", "--dotnet-runtime", "mono", "--dotnet-assembly", str(asm), "--steps", "5",
              "--out", str(tmp_path / "run"))
    assert res.returncode == 2
    (line,) = [ln for ln in res.stderr.splitlines() if ln.strip()]   # one line: no progress bar before it either
    assert line.startswith(f"optcheck: error: --dotnet-runtime mono: {asm} is built for .NETCoreApp,Version=v8.0")
    assert "use --dotnet-runtime coreclr" in line


def test_a_start_up_error_is_one_line_with_no_progress_bar(dll, tmp_path):  # noqa: F811
    need("coreclr")
    res = cli("--backend", "torchsharp", "--dotnet-assembly", str(dll), "--dotnet-trainer", "OptCheckTest.NativeTrainer",
              "--steps", "5", "--out", str(tmp_path / "run"))
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("optcheck: error: the .NET worker could not load native library"), lines
