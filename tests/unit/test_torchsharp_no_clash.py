"""Two projects that both compile optcheck's C# in do not clash (issue 28, item 8).

A user's project compiles optcheck's sources (examples/torchsharp-own-model/OwnModel.csproj:
dotnet/Probe, dotnet/Contract, dotnet/Worker/TorchSharpProbe.cs). Everything but the user contract
(namespace ``OptCheck.Contract``: ModuleTrainer, TorchSharpGuard, TorchSharpTarget, TrainerOptions,
PreStepGuard, PreStepCheckException, PreStepProblem) is ``internal``, so two such assemblies and a
third referencing both build with ``mcs -warnaserror+`` (no CS0433 / CS0436), and the probe's own
types (Driver, ProbeCore, JsonWriter, Bench, ...) are not visible outside the assembly that holds them.

Compiled with Debian's ``mcs`` against the TorchSharp signature stub (tests/dotnet/torchsharp_stub,
built once as its own TorchSharp.dll) and run on Mono; skipped, saying why, without them.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("optcheck_tests_dotnet_build", REPO / "tests" / "dotnet" / "build.py")
dotnet_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dotnet_build)
STUB = REPO / "tests" / "dotnet" / "torchsharp_stub" / "TorchSharpStub.cs"

#: what a user's assembly exports from optcheck's sources: the contract, nothing else
CONTRACT = {"OptCheck.Contract.ModuleTrainer", "OptCheck.Contract.TorchSharpGuard", "OptCheck.Contract.TorchSharpTarget",
            "OptCheck.Contract.TrainerOptions", "OptCheck.Contract.PreStepGuard",
            "OptCheck.Contract.PreStepCheckException", "OptCheck.Contract.PreStepProblem"}

TRAINER = """
using OptCheck.Contract;
using TorchSharp;
namespace {ns}
{{
    public sealed class Trainer : ModuleTrainer
    {{
        protected override void Setup(TrainerOptions o) {{ }}
        public override double Step(long step, long[] x, long[] y, int b, int t) {{ return 0; }}
    }}
}}
"""

THIRD = """
using System;
public static class Third
{
    public static int Main()
    {
        var a = new UserA.Trainer();
        var b = new UserB.Trainer();
        // inherited from each assembly's own ModuleTrainer: no ambiguity
        Console.WriteLine(string.Join(",", a.Scenarios) + " " + string.Join(",", b.Scenarios));
        Console.WriteLine(a.GetType().BaseType.Assembly.GetName().Name + " " + b.GetType().BaseType.Assembly.GetName().Name);
        return 0;
    }
}
"""

EXPORTED = """
using System;
using System.Reflection;
public static class Exported
{
    public static int Main(string[] args)
    {
        foreach (Type t in Assembly.LoadFrom(args[0]).GetExportedTypes()) Console.WriteLine("exported " + t.FullName);
        return 0;
    }
}
"""


def mcs(out: Path, sources: list[Path], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mcs", "-nologo", "-langversion:7", f"-out:{out}", *extra, *map(str, sources)],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A.dll and B.dll, each compiling optcheck's sources and a trainer of its own, beside TorchSharp.dll."""
    if shutil.which("mcs") is None or shutil.which("mono") is None:
        pytest.skip("mcs/mono not installed (Debian mono-mcs, mono-runtime)")
    d = tmp_path_factory.mktemp("clash")
    res = mcs(d / "TorchSharp.dll", [STUB], "-target:library", "-nowarn:0108,0114,0169,0414,0649")
    assert res.returncode == 0, res.stdout + res.stderr
    sources = [p for p in dotnet_build.TORCHSHARP_SOURCES]
    for ns, name in (("UserA", "A"), ("UserB", "B")):
        src = d / f"{name}.cs"
        src.write_text(TRAINER.format(ns=ns))
        res = mcs(d / f"{name}.dll", [*sources, src], "-target:library", f"-r:{d / 'TorchSharp.dll'}")
        assert res.returncode == 0, res.stdout + res.stderr
    return d


def test_a_third_assembly_references_both_without_a_clash(built):
    third = built / "Third.cs"
    third.write_text(THIRD)
    res = mcs(built / "Third.exe", [third], "-warnaserror+", f"-r:{built / 'A.dll'}", f"-r:{built / 'B.dll'}",
              f"-r:{built / 'TorchSharp.dll'}")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert not re.search(r"CS04(33|36)", out), out
    run = subprocess.run(["mono", str(built / "Third.exe")], capture_output=True, text=True, timeout=120, cwd=built)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == ["module-to-after-optimizer module-to-after-optimizer", "A B"]


def test_the_probe_is_not_visible_from_a_referencing_assembly(built):
    """What would clash if it were public: the referencing code cannot name it (CS0122, inaccessible)."""
    third = built / "Uses.cs"
    third.write_text("public static class Uses { public static object M() { return typeof(OptCheck.Probe.Driver); } }\n")
    res = mcs(built / "Uses.dll", [third], "-target:library", f"-r:{built / 'A.dll'}", f"-r:{built / 'TorchSharp.dll'}")
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "CS0122" in out, out


def test_a_users_assembly_exports_only_the_contract(built):
    lister = built / "Exported.cs"
    lister.write_text(EXPORTED)
    res = mcs(built / "Exported.exe", [lister])
    assert res.returncode == 0, res.stdout + res.stderr
    run = subprocess.run(["mono", str(built / "Exported.exe"), str(built / "A.dll")], capture_output=True, text=True,
                         timeout=120, cwd=built)
    assert run.returncode == 0, run.stdout + run.stderr
    exported = {ln.split(" ", 1)[1] for ln in run.stdout.splitlines() if ln.startswith("exported ")}
    assert exported == CONTRACT | {"UserA.Trainer"}


def test_the_contract_lives_in_its_own_folder_and_namespace():
    """dotnet/Contract holds the public types, namespace OptCheck.Contract; no other C# file optcheck compiles
    into a user's project declares a public type."""
    public = re.compile(r"^\s*public (?:sealed |static |abstract )*(?:class|interface|struct|enum) (\w+)", re.M)
    for path in dotnet_build.TORCHSHARP_SOURCES:
        text = path.read_text(encoding="utf-8")
        names = public.findall(text)
        if path.parent.name in ("Contract", "TorchSharp") and "Contract" in path.parts:
            assert "namespace OptCheck.Contract" in text, path
            assert {f"OptCheck.Contract.{n}" for n in names} <= CONTRACT, path
        else:
            assert names == [], f"{path.relative_to(REPO)} declares public {names}"
