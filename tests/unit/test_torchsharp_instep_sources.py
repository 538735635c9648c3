"""The TorchSharp side of the in-step check and of the native-optimizer read, against TorchSharp's API.

- tests/dotnet/instep/InStepBugs.cs, a user's ModuleTrainer whose Step plants the five identity bugs
  (model.to(Float64); head.weight = new Parameter; register_parameter late; an optimizer over
  parameters().ToList() then model.to(Float64); a disposed Parameter) before its own zero_grad() /
  step(), and the same loop without optcheck with its optimizer wrapped once (TorchSharpGuard.Wrap),
  compiles with optcheck's sources against TorchSharp 0.107.0's own reference assembly and against the
  signature stub. The behaviour (named at the step, phase in-step, before the exception) runs on the
  stand-in: tests/integration/test_torchsharp_instep.py.
- tests/dotnet/native_optimizer/NativeOptimizerCheck.cs runs on Mono against TorchSharp 0.107.0's own
  TorchSharp.dll: a torch.optim.Optimizer with a native handle that is not an OptimizerHelper (the
  stand-in of libtorch's LBFGS, whose every member enumeration wraps its native tensors in new
  Parameters that free them when finalized). The probe reads its groups' options, reports members and
  state as not readable, finds nothing from them, never enumerates them, and leaves its handle as it
  was; GuardedOptimizer forwards every call to it.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from optcheck.torchsharp_bridge.build import DEFAULT_VERSION

REPO = Path(__file__).resolve().parents[2]
STUB = REPO / "tests" / "dotnet" / "torchsharp_stub" / "TorchSharpStub.cs"
BUGS = REPO / "tests" / "dotnet" / "instep" / "InStepBugs.cs"
NATIVE = REPO / "tests" / "dotnet" / "native_optimizer" / "NativeOptimizerCheck.cs"
_spec = importlib.util.spec_from_file_location("optcheck_tests_dotnet_build", REPO / "tests" / "dotnet" / "build.py")
dotnet_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dotnet_build)


def user_sources() -> list[Path]:
    """What a user's project compiles in from optcheck (examples/torchsharp-own-model/OwnModel.csproj)."""
    return list(dotnet_build.TORCHSHARP_SOURCES)


@pytest.fixture(scope="module")
def refs() -> list[Path]:
    if shutil.which("mcs") is None:
        pytest.skip("mcs not installed (Debian mono-mcs)")
    found, why = dotnet_build.find_torchsharp_ref(DEFAULT_VERSION)
    if not found:
        pytest.skip(why)
    return found


def test_the_five_in_step_bugs_compile_against_the_real_torchsharp_api(tmp_path, refs):
    res = dotnet_build.mcs_against_ref(refs, tmp_path / "InStepBugs.dll", [*user_sources(), BUGS])
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_five_in_step_bugs_compile_against_the_signature_stub(tmp_path):
    if shutil.which("mcs") is None:
        pytest.skip("mcs not installed (Debian mono-mcs)")
    res = subprocess.run(["mcs", "-target:library", "-nologo", "-warnaserror+", "-nowarn:219",
                          f"-out:{tmp_path / 'b.dll'}", str(STUB), *map(str, user_sources()), str(BUGS)],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_bugs_are_planted_inside_step_before_the_users_own_optimizer_calls():
    text = BUGS.read_text()
    step = text[text.index("public override double Step"):text.index("public static class PlainLoop")]
    assert step.index("Plant();") < step.index("Optimizer.zero_grad();")          # disposed / eager: before zero_grad
    assert step.index("Optimizer.zero_grad();") < step.rindex("Plant();") < step.index("Optimizer.step();")
    for bug in ("to-float64", "param-replaced", "register-late", "eager-to-float64", "dispose"):
        assert f'case "{bug}"' in text
    assert "TorchSharpGuard.Wrap(model," in text


@pytest.fixture(scope="module")
def native_out(refs, tmp_path_factory) -> dict[str, str]:
    if shutil.which("mono") is None:
        pytest.skip("mono not installed (Debian mono-runtime)")
    d = tmp_path_factory.mktemp("native")
    for r in refs:
        shutil.copy2(r, d / r.name)
    exe = d / "NativeOptimizerCheck.exe"
    res = dotnet_build.mcs_against_ref(refs, exe, [*user_sources(), NATIVE], "-target:exe")
    assert res.returncode == 0, res.stdout + res.stderr
    run = subprocess.run(["mono", str(exe)], capture_output=True, text=True, timeout=120, cwd=d)
    assert run.returncode == 0, run.stdout + run.stderr
    return dict(ln.split(" ", 1) for ln in run.stdout.splitlines())


def test_a_native_optimizer_is_read_for_its_options_only(native_out):
    out = native_out
    assert out["native"] == "True False"   # the fake LBFGS is native; the guarded wrapper owns no handle
    assert out["groups"] == "1 lr 0.25 members unreadable"
    assert out["state_owner"] == "none"
    assert out["note"].startswith("optimizer state not readable: FakeNative is libtorch's native optimizer")
    import json

    body = json.loads(out["body"])
    assert body["state"] is None and body["groups"][0]["members"] == [] and body["groups"][0]["members_readable"] is False
    assert body["prestep_findings"] == [] and out["problems"] == "0"   # nothing judged from what was not read
    assert sum(n.startswith("optimizer state not readable") for n in body["notes"]) == 1
    assert out["fingerprint_stable"] == "True"


def test_the_probe_never_enumerates_frees_or_keeps_a_native_optimizers_tensors(native_out):
    out = native_out
    # every read above, a recorded in-step check and three GCs later: not one enumeration of its members,
    # and its native handle is the one it had, neither closed nor invalidated
    assert out["enumerations"] == "0"
    assert out["handle"] == "5eed closed=False invalid=False"


def test_the_guarded_optimizer_forwards_to_the_optimizer_it_wraps(native_out):
    out = native_out
    assert out["wrapped"] == "GuardedOptimizer True"
    assert out["forwarded"] == "zero_grad(),step(),step() zero_grad=1 step=2 groups=1 unwrap=True"
    # recording (under optcheck), a check that cannot read the target does not raise into the step
    assert out["recording_step"].startswith("zero_grad=2 step=3 error=System.InvalidOperationException")
