"""A user's own TorchSharp model (examples/torchsharp-own-model/): ModuleTrainer, TorchSharpTarget
over any (Module, Optimizer) pair, TorchSharpGuard.

Compile checks: the example with optcheck's sources against TorchSharp 0.107.0's real reference
assembly (skips, saying why, when none is found: tests/dotnet/build.py find_torchsharp_ref) and
against the signature stub (always). Run on Mono against the stub (its bodies throw, so nothing
touches a tensor): what the worker does with a user's assembly before TorchSharp's native code
runs — Driver.ForType finds the user's trainer, ModuleTrainer checks Setup and knows its faults,
the target reads optimizer options and state by reflection over TorchSharp's own AdamW types.
Real TorchSharp training of the example is acceptance's (no libtorch for TorchSharp here);
the guard's logic runs for real on the stand-in in tests/integration/test_prestep_guard.py.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optcheck.torchsharp_bridge.build import DEFAULT_VERSION

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torchsharp-own-model"
STUB = REPO / "tests" / "dotnet" / "torchsharp_stub" / "TorchSharpStub.cs"
_spec = importlib.util.spec_from_file_location("optcheck_tests_dotnet_build", REPO / "tests" / "dotnet" / "build.py")
dotnet_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dotnet_build)

needs_mcs = pytest.mark.skipif(shutil.which("mcs") is None or shutil.which("mono") is None,
                               reason="mcs/mono not installed (Debian mono-mcs, mono-runtime)")


def optcheck_sources() -> list[Path]:
    """What the example's csproj compiles in from OptCheckSources."""
    return list(dotnet_build.TORCHSHARP_SOURCES)


def test_example_has_readme_csproj_and_source():
    csproj = (EXAMPLE / "OwnModel.csproj").read_text()
    for pattern in ("/Probe/*.cs", "/Worker/TorchSharpProbe.cs", "/Contract/*.cs", "/Contract/TorchSharp/*.cs"):
        assert f"$(OptCheckSources){pattern}" in csproj
    assert 'Version="[$(TorchSharpVersion)]"' in csproj and f">{DEFAULT_VERSION}<" in csproj
    readme = (EXAMPLE / "README.md").read_text()
    assert "--dotnet-trainer OwnModel.OwnTrainer" in readme and "TorchSharpGuard.For" in readme
    assert "class OwnTrainer : ModuleTrainer" in (EXAMPLE / "OwnModel.cs").read_text()


def test_example_compiles_against_the_real_torchsharp_api(tmp_path):
    if shutil.which("mcs") is None:
        pytest.skip("mcs not installed (Debian mono-mcs)")
    refs, why = dotnet_build.find_torchsharp_ref(DEFAULT_VERSION)
    if not refs:
        pytest.skip(why)
    res = dotnet_build.mcs_against_ref(refs, tmp_path / "OwnModel.dll", [*optcheck_sources(), EXAMPLE / "OwnModel.cs"])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.fixture(scope="module")
def check_exe(tmp_path_factory) -> Path:
    if shutil.which("mcs") is None or shutil.which("mono") is None:
        pytest.skip("mcs/mono not installed")
    exe = tmp_path_factory.mktemp("own") / "OwnModelCheck.exe"
    res = subprocess.run(["mcs", "-nologo", "-warnaserror+", "-nowarn:219", f"-out:{exe}", str(STUB),
                          *map(str, optcheck_sources()), str(EXAMPLE / "OwnModel.cs"),
                          str(REPO / "tests" / "dotnet" / "worker_check" / "OwnModelCheck.cs")],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    return exe


@needs_mcs
def test_what_the_worker_gets_from_a_users_trainer(check_exe):
    res = subprocess.run(["mono", str(check_exe)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    out = dict(ln.split(" ", 1) for ln in res.stdout.splitlines())
    assert out["trainer"] == "OwnModel.OwnTrainer : OptCheck.Contract.ModuleTrainer"
    assert out["target"] == "OptCheck.Contract.TorchSharpTarget"  # the same target GptTrainer uses
    assert out["scenarios"] == "module-to-after-optimizer"
    assert out["lifecycle"].startswith("NotSupportedException OwnModel.OwnTrainer has no lifecycle events")
    assert "scenario 'param-replaced' is not implemented by OwnModel.OwnTrainer" in out["inject"]
    assert out["evalloss"] == "NaN"  # ModuleTrainer.EvalLoss: no held-out loss unless the user writes one
    assert out["forgetful"] == "InvalidOperationException ForgetfulTrainer.Setup must assign Model and Optimizer"
    assert out["badoptions"] == "ArgumentException Setup: the configuration must be a JSON object"
    assert out["options"] == "0.003 2000 absent"
    assert out["badlong"] == "seed: expected an integer, got 'abc'"
    # SoakConfig.trainer_options arrive as "extra.KEY", JSON escapes decoded, booleans readable
    assert out["extra"] == 'obvious|a "b"A|True'
    assert out["badjson"] == "Setup: the configuration is not JSON: JSON: expected a member name at character 11"
    # any optimizer's options by reflection (AdamW's, in TorchSharp's field order), lr first
    assert out["adamw_options"] == "lr,beta1,beta2,weight_decay,eps,amsgrad,maximize"
    assert out["no_options"] == "lr"
    assert out["state"] == "step=42 tensors=0"  # null exp_avg etc. skipped
    assert out["state_field"] == "TorchSharp.Modules.OptimizerHelper"


def test_build_module_prints_where_the_sources_are():
    res = subprocess.run([sys.executable, "-m", "optcheck.torchsharp_bridge.build", "--sources"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    folder = Path(res.stdout.strip())
    assert (folder / "Contract" / "TorchSharp" / "ModuleTrainer.cs").is_file() and (folder / "Contract" / "PreStepGuard.cs").is_file()
