"""dotnet/Worker compiles, against a signature stub of TorchSharp, and matches the PyTorch GPT.

TorchSharp cannot be restored here, so the worker is compiled with Debian's mcs against
tests/dotnet/torchsharp_stub/TorchSharpStub.cs: a signature check (members, overloads and
implicit conversions as TorchSharp 0.99.6 declares them), not an implementation. A misspelt
member or an ambiguous call then fails here instead of in acceptance. The parts that touch no
tensor (lr schedule, fault list, optimizer-state lookup) run on Mono against the stub.
"""

from __future__ import annotations

import importlib.util
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from optcheck import scenarios
from optcheck.config import SoakConfig
from optcheck.torchsharp_bridge.build import DEFAULT_VERSION

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("optcheck_tests_dotnet_build", REPO / "tests" / "dotnet" / "build.py")
dotnet_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dotnet_build)
find_torchsharp_ref, mcs_against_ref = dotnet_build.find_torchsharp_ref, dotnet_build.mcs_against_ref
CONTRACT = [*sorted((REPO / "dotnet" / "Contract").glob("*.cs")), *sorted((REPO / "dotnet" / "Contract" / "TorchSharp").glob("*.cs"))]
WORKER = REPO / "dotnet" / "Worker"
PROBE = REPO / "dotnet" / "Probe"
STUB = REPO / "tests" / "dotnet" / "torchsharp_stub" / "TorchSharpStub.cs"
LRCHECK = REPO / "tests" / "dotnet" / "worker_check" / "LrCheck.cs"

needs_mcs = pytest.mark.skipif(shutil.which("mcs") is None or shutil.which("mono") is None,
                               reason="mcs/mono not installed (Debian mono-mcs, mono-runtime)")


def mcs(out: Path, sources: list[Path], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mcs", "-out:" + str(out), *extra, *map(str, sources)],
                          capture_output=True, text=True, timeout=180)


def worker_sources(folder: Path = WORKER) -> list[Path]:
    return [STUB, *sorted(PROBE.glob("*.cs")), *CONTRACT, *sorted(folder.glob("*.cs"))]


@pytest.fixture(scope="module")
def torchsharp_ref() -> list[Path]:
    """TorchSharp DEFAULT_VERSION's real netstandard2.0 reference assembly (+ System.Memory), from
    $OPTCHECK_TORCHSHARP_REF or the NuGet cache; the test skips, saying why, when there is none."""
    if shutil.which("mcs") is None:
        pytest.skip("mcs not installed (Debian mono-mcs)")
    refs, why = find_torchsharp_ref(DEFAULT_VERSION)
    if not refs:
        pytest.skip(why)
    return refs


@pytest.fixture(scope="module")
def check_exe(tmp_path_factory) -> Path:
    if shutil.which("mcs") is None:
        pytest.skip("mcs not installed")
    exe = tmp_path_factory.mktemp("worker") / "LrCheck.exe"
    res = mcs(exe, [*worker_sources(), LRCHECK], "-main:LrCheck")
    assert res.returncode == 0, res.stdout + res.stderr
    return exe


@needs_mcs
def test_worker_compiles_against_the_torchsharp_signatures(tmp_path):
    res = mcs(tmp_path / "w.dll", worker_sources(), "-target:library", "-warnaserror+", "-nowarn:219")
    assert res.returncode == 0, res.stdout + res.stderr


def test_worker_compiles_against_the_real_torchsharp_api(tmp_path, torchsharp_ref):
    """dotnet/Worker + dotnet/Probe against TorchSharp's own TorchSharp.dll (0.107.0: Tensor's == / !=
    are element-wise, so every null check must be ReferenceEquals, and every API used must exist)."""
    sources = [*sorted(PROBE.glob("*.cs")), *CONTRACT, *sorted(WORKER.glob("*.cs"))]
    res = mcs_against_ref(torchsharp_ref, tmp_path / "w.dll", sources)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "w.dll").is_file()


@pytest.mark.parametrize("old, new, errors", [
    ("return ReferenceEquals(gain, null) ? y : y.mul(gain);", "return gain == null ? y : y.mul(gain);", {"CS0266"}),
    ("return !ReferenceEquals(p, null) && !p.IsInvalid;", "return p != null && !p.IsInvalid;", {"CS0218", "CS0019"}),
])
def test_a_tensor_null_check_with_operators_fails_against_the_real_api(tmp_path, torchsharp_ref, old, new, errors):
    bad = tmp_path / "Worker"
    shutil.copytree(WORKER, bad)
    planted = 0
    for f in bad.glob("*.cs"):
        text = f.read_text()
        if old in text:
            f.write_text(text.replace(old, new))
            planted += 1
    assert planted == 1, old
    res = mcs_against_ref(torchsharp_ref, tmp_path / "w.dll", [*sorted(PROBE.glob("*.cs")), *CONTRACT, *sorted(bad.glob("*.cs"))])
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert errors <= set(re.findall(r"error (CS\d+)", out)), out


@needs_mcs
@pytest.mark.parametrize("old, new, error", [
    # TorchSharp's optimizers have step(), not Step()
    ("Optimizer.step();", "Optimizer.Step();", "CS1061"),
    # grad is a method up to 0.102.5 and a property from 0.102.6: source that names either breaks on the other
    ("Tensor g = TensorFacts.Grad(p);\n                if (ReferenceEquals(g, null)) return false;",
     "Tensor g = p.grad();\n                if (ReferenceEquals(g, null)) return false;", "CS1061"),
    # Tensor's == / != are element-wise from 0.10x (they return a Tensor): a null check written with them
    ("if (ReferenceEquals(g, null)) return false;", "if (g == null) return false;", "CS0266"),
    ("return !ReferenceEquals(p, null) && !p.IsInvalid;", "return p != null && !p.IsInvalid;", "CS0218"),
    # TorchSharp has no scaled_dot_product_attention in 0.99
    ("att = nn.functional.softmax(att, -1);", "att = nn.functional.scaled_dot_product_attention(q, k, v);", "CS0117"),
])
def test_the_stub_catches_api_mistakes(tmp_path, old, new, error):
    bad = tmp_path / "Worker"
    shutil.copytree(WORKER, bad)
    for f in bad.glob("*.cs"):
        text = f.read_text()
        if old in text:
            f.write_text(text.replace(old, new))
            break
    else:
        pytest.fail(f"{old!r} not found in dotnet/Worker")
    res = mcs(tmp_path / "w.dll", worker_sources(bad), "-target:library")
    assert res.returncode != 0 and error in res.stdout + res.stderr


@needs_mcs
def test_lr_schedule_and_defaults_match_pytorch(check_exe):
    from optcheck.pytorch.train import lr_at

    steps = [0, 1, 50, 99, 100, 101, 5000, 19999, 20000, 25000]
    res = subprocess.run(["mono", str(check_exe), *map(str, steps)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    got = {int(ln.split()[1]): float(ln.split()[2]) for ln in res.stdout.splitlines() if ln.startswith("lr ")}
    cfg = SoakConfig()  # GptTrainer's defaults are SoakConfig's
    for s in steps:
        assert got[s] == lr_at(cfg, s), s  # same formula, same order of operations: bit-equal
    assert not math.isnan(got[1])


@needs_mcs
def test_fault_list_and_state_lookup(check_exe):
    res = subprocess.run(["mono", str(check_exe)], capture_output=True, text=True, timeout=60)
    out = dict(ln.split(" ", 1) for ln in res.stdout.splitlines())
    faults = out["scenarios"].split(",")
    assert sorted(faults) == sorted(n for n, s in scenarios.CATALOGUE.items() if "torchsharp" in s.backends)
    # the field is found where TorchSharp declares it; the probe reads it from the live optimizer itself
    # (none before Setup), no holder in between
    assert out["state_field"] == "TorchSharp.Modules.OptimizerHelper._state"
    assert out["state_owner"] == "none _state"
    # the built-in GPT takes the user path: a ModuleTrainer, its optimizer calls guarded
    assert out["base"] == "OptCheck.Contract.ModuleTrainer guarded True"
    # read through Keys + indexer, in insertion order (TorchSharp's OrderedDict cannot be enumerated untyped)
    assert out["state_read"] == "True 42,41 7,8"


def declared_fields(cls: str) -> list[str]:
    """Public Module / Parameter fields of C# class ``cls`` in dotnet/Worker/GPT.cs, in order."""
    text = (WORKER / "GPT.cs").read_text()
    m = re.search(r"class " + cls + r"\b.*?\n    \}", text, re.S)
    assert m, cls
    return re.findall(r"^\s+public (?:Parameter|Linear|Embedding|LayerNorm|CausalSelfAttention|MLP|ModuleList<Block>) "
                      r"(\w+);", m.group(0), re.M)


def test_gpt_field_names_and_order_are_the_pytorch_names():
    """TorchSharp names parameters after fields (RegisterComponents) in declaration order;
    PyTorch after attributes in assignment order. Both must give the same named_parameters()."""
    import torch.nn as nn

    from optcheck.pytorch.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=1))
    for cls, module in (("GPT", model), ("Block", model.h[0]), ("CausalSelfAttention", model.h[0].attn),
                        ("MLP", model.h[0].mlp), ("LayerNorm", model.ln_f)):
        torch_names = [n for n, m in module.named_children() if any(True for _ in m.parameters())
                       or isinstance(m, nn.Linear)] + [n for n, _ in module.named_parameters(recurse=False)]
        fields = declared_fields(cls)
        if cls == "LayerNorm":
            assert fields == ["weight", "bias", "gain"]  # gain: null until param-registered-late
            fields = fields[:2]
        assert fields == torch_names, cls


def method_bodies(text: str, signature: str) -> list[str]:
    """The bodies of every C# method whose declaration line matches ``signature`` (a regex)."""
    bodies = []
    for m in re.finditer(signature, text):
        start = text.index("{", m.end())
        depth, i = 0, start
        while True:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        bodies.append(text[start:i + 1])
    return bodies


FACTORY = re.compile(r"torch\.(?:ones|zeros|arange|tensor|empty|full|rand\w*)\(")


@pytest.mark.parametrize("file, signature", [
    ("GPT.cs", r"public override Tensor forward\("),
    ("Trainer.cs", r"double StepBody\("),  # Step() runs StepBody inside or outside its DisposeScope
    ("Trainer.cs", r"double Forward\("),
])
def test_tensors_made_in_the_step_take_the_inputs_or_models_device(file, signature):
    """A CUDA TorchSharp build fails at the first forward when a mask, positions or a batch is made on
    the CPU: every tensor factory in forward / the step names a device (the input's or the model's)."""
    bodies = method_bodies((WORKER / file).read_text(), signature)
    assert bodies, signature
    calls = [ln.strip() for body in bodies for ln in body.splitlines() if FACTORY.search(ln)]
    if file == "GPT.cs":
        assert len(calls) >= 2  # the causal mask and the positions
    assert calls and all("device:" in c for c in calls), calls


_USING_TENSOR = re.compile(r"using\s*\(\s*(?:Tensor|Parameter|torch\.Tensor)\s+\w+\s*=")


def test_no_csharp_disposes_a_tensor_with_using():
    """mcs compiles the null check of ``using (Tensor t = ...)`` with TorchSharp's element-wise ``!=``
    (``Tensor.op_Inequality(Tensor, Scalar)``): leaving the block throws NullReferenceException on TorchSharp
    0.10x (what --same-init hit on real TorchSharp, docs/torchsharp.md). optcheck's C# and the examples use a
    DisposeScope instead; the pattern is caught here, in every C# file mcs compiles."""
    files = [*REPO.joinpath("dotnet").rglob("*.cs"), *REPO.joinpath("examples").rglob("*.cs"),
             *REPO.joinpath("tests", "dotnet").rglob("*.cs")]
    assert len(files) > 20
    code = {f: re.sub(r"//.*", "", f.read_text()) for f in files}  # comments may name the pattern
    bad = [f"{f.relative_to(REPO)}: {m.group(0)}" for f, text in code.items() for m in _USING_TENSOR.finditer(text)]
    assert bad == []
    assert _USING_TENSOR.search("using (Tensor t = torch.tensor(data)) {") and not _USING_TENSOR.search(
        "using (torch.NewDisposeScope()) np.parameter.copy_(torch.tensor(data));")
