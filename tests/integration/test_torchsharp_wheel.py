"""optcheck installed from its wheel finds and builds its TorchSharp worker sources.

Real: the wheel is built from a copy of this checkout by pip (``pip wheel --no-deps
--no-build-isolation``, setup.py's build_py copying dotnet/ into optcheck/dotnet_src/), installed
with ``pip install --no-deps`` into a fresh ``python3 -m venv --system-site-packages`` (the
dependencies come from the system site-packages), and run from there with no PYTHONPATH and
outside the checkout. Stand-in: ``dotnet build`` is tests/dotnet/fake_sdk/dotnet, because no
.NET SDK can be installed on this machine kind; it checks nothing but writes what a restore writes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE_SDK = REPO / "tests" / "dotnet" / "fake_sdk"


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in ("optcheck", "dotnet"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "bin", "obj"))
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(REPO / name, src / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
         "-q", "-w", tmp / "whl", src], env=env, cwd=tmp)
    [wheel] = (tmp / "whl").glob("optcheck-*.whl")
    run([sys.executable, "-m", "venv", "--system-site-packages", tmp / "venv"], env=env)
    py = tmp / "venv" / "bin" / "python"
    run([py, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", wheel], env=env, cwd=tmp)
    shutil.rmtree(src)  # nothing of the checkout copy is left to fall back on
    return tmp / "venv"


def venv_env(venv: Path, tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPTCHECK_TORCHSHARP")}
    env.update(PATH=f"{FAKE_SDK}{os.pathsep}{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               OPTCHECK_CACHE=str(tmp_path / "cache"), **extra)
    return env


def test_the_installed_package_has_its_csharp_sources(venv, tmp_path):
    py = venv / "bin" / "python"
    res = run([py, "-c", "import optcheck, optcheck.torchsharp_bridge.build as b; "
               "print(optcheck.__file__); print(b.sources_dir()); print(len(b.source_files()))"],
              env=venv_env(venv, tmp_path), cwd=tmp_path)
    pkg, sources, n = res.stdout.split()
    assert Path(pkg).is_relative_to(venv), pkg  # the wheel's copy, not the editable checkout
    assert Path(sources) == Path(pkg).parent / "dotnet_src"
    shipped = sorted(p.relative_to(Path(sources)).as_posix() for p in Path(sources).rglob("*") if p.is_file())
    expected = sorted(p.relative_to(REPO / "dotnet").as_posix() for p in
                      [*(REPO / "dotnet" / "Probe").glob("*.cs"), *(REPO / "dotnet" / "Contract").glob("*.cs"),
                       *(REPO / "dotnet" / "Contract" / "TorchSharp").glob("*.cs"), *(REPO / "dotnet" / "Worker").glob("*.cs"),
                       *(REPO / "dotnet" / "Worker").glob("*.csproj")])
    assert shipped == expected and int(n) == len(expected)
    for rel in expected:  # the same bytes as the checkout: one source of truth
        assert (Path(sources) / rel).read_bytes() == (REPO / "dotnet" / rel).read_bytes()


def test_the_installed_package_builds_the_worker_from_there(venv, tmp_path):
    py = venv / "bin" / "python"
    log = tmp_path / "dotnet-calls.log"
    res = run([py, "-m", "optcheck.torchsharp_bridge.build", "0.107.0"],
              env=venv_env(venv, tmp_path, FAKE_DOTNET_MODE="ok", FAKE_DOTNET_LOG=str(log)), cwd=tmp_path)
    dll = Path(res.stdout.strip())
    folder = tmp_path / "cache" / "torchsharp" / "0.107.0"
    assert dll == folder / "bin" / "OptCheck.Worker.dll" and dll.is_file()
    assert (folder / "src" / "Worker" / "OptCheck.Worker.csproj").is_file()
    assert (folder / "src" / "Probe" / "ProbeCore.cs").is_file()
    [call] = [ln for ln in log.read_text().splitlines() if ln.startswith("build ")]
    assert "-p:TorchSharpVersion=0.107.0" in call
    err = res.stderr.splitlines()
    assert len(err) == 2, res.stderr
    assert "restoring TorchSharp-cpu 0.107.0 from NuGet" in err[0] and "dotnet_src" in err[0]
    assert err[1].startswith("optcheck: built OptCheck.Worker.dll against TorchSharp-cpu 0.107.0 in ")
    assert json.loads((folder / "build.json").read_text())["torchsharp"] == "0.107.0"
