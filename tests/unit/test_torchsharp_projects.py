"""The MSBuild projects in the repository load, and the own-model example builds with its README's
command.

- Every ``.csproj`` / ``.props`` / ``.targets`` is well-formed XML (Python's XML parser runs
  everywhere; MSBuild refuses a project that is not, MSB4025 — e.g. ``--`` inside a comment).
- ``python -m optcheck.torchsharp_bridge.build --sources`` prints a folder the ``dotnet`` CLI takes
  as a ``-p:`` value: SDK 10.0.401 misreads one that ends in ``/dotnet`` (MSB1009), so it ends in ``/``.
- Where a .NET SDK is installed, the README's exact ``dotnet build`` line is run on a copy of the
  example (skipped elsewhere, saying why).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torchsharp-own-model"
_SKIP_DIRS = {".git", "node_modules", "bin", "obj", ".venv", "venv", "build", "dist"}


def project_files() -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        out += [Path(dirpath) / f for f in filenames if f.endswith((".csproj", ".props", ".targets"))]
    return sorted(out)


def test_there_are_projects_to_check():
    names = {p.relative_to(REPO).as_posix() for p in project_files()}
    assert {"dotnet/Worker/OptCheck.Worker.csproj", "examples/torchsharp-own-model/OwnModel.csproj"} <= names


@pytest.mark.parametrize("path", project_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_project_file_is_well_formed_xml(path):
    root = ET.parse(path).getroot()   # raises ParseError on "--" in a comment, a stray "&", ...
    assert root.tag == "Project"


def test_a_comment_with_two_hyphens_is_what_the_parser_rejects(tmp_path):
    """The check above would have caught the example's old comment (``--dotnet-assembly``)."""
    bad = tmp_path / "bad.csproj"
    bad.write_text("<!-- optcheck soak --dotnet-assembly out/OwnModel.dll -->\n<Project />\n")
    with pytest.raises(ET.ParseError):
        ET.parse(bad)


def sources_value() -> str:
    res = subprocess.run([sys.executable, "-m", "optcheck.torchsharp_bridge.build", "--sources"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_sources_value_is_one_the_dotnet_cli_takes():
    value = sources_value()
    assert value.endswith("/") and not value.endswith("/dotnet")
    folder = Path(value)
    assert (folder / "Contract" / "PreStepGuard.cs").is_file() and (folder / "Contract" / "TorchSharp" / "ModuleTrainer.cs").is_file()


def readme_build_command() -> str:
    lines = [ln.strip() for ln in (EXAMPLE / "README.md").read_text().splitlines() if ln.strip().startswith("dotnet build")]
    assert len(lines) == 1, lines
    return lines[0]


def test_readme_build_command_uses_the_sources_printer():
    cmd = readme_build_command()
    assert "-p:OptCheckSources=$(python3 -m optcheck.torchsharp_bridge.build --sources)" in cmd


def _sdk() -> str | None:
    dotnet = shutil.which("dotnet")
    if dotnet is None:
        return None
    res = subprocess.run([dotnet, "--list-sdks"], capture_output=True, text=True, timeout=60)
    return res.stdout.strip() or None


@pytest.mark.slow
def test_readme_build_command_builds_the_example(tmp_path):
    """The README's exact command, in a copy of the example (the build restores TorchSharp-cpu from NuGet)."""
    sdks = _sdk()
    if sdks is None:
        pytest.skip("no .NET SDK here (`dotnet --list-sdks` lists none, or no `dotnet` on PATH): "
                    "the README's dotnet build runs where one is installed")
    work = tmp_path / "torchsharp-own-model"
    shutil.copytree(EXAMPLE, work)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    bindir = tmp_path / "bin"   # `python3` in the command must be this interpreter (it imports this optcheck)
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    res = subprocess.run(["bash", "-c", readme_build_command()], cwd=work, env=env, capture_output=True, text=True,
                         timeout=3600)
    assert res.returncode == 0, f"{sdks}\n{res.stdout[-4000:]}\n{res.stderr[-2000:]}"
    assert (work / "out" / "OwnModel.dll").is_file()
    assert not re.search(r"\bMSB(1009|4025)\b", res.stdout)
