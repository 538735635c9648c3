"""Build the .NET stand-in training loop for the tests: ``dotnet/Probe/*.cs``, ``dotnet/Contract/*.cs`` +
``tests/dotnet/*.cs`` compiled with Debian's ``mcs`` (C# 7) into one assembly,
cached by the hash of the sources so that a test session compiles it once.

``build_testloop()`` returns the path of ``TestLoop.dll``; it holds
``OptCheck.Probe.Driver`` and the trainers ``OptCheckTest.LazyTrainer``,
``EagerTrainer``, ``TiedTrainer``, ``NativeTrainer`` (``tests/dotnet/TestLoop.cs``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: optcheck's TorchSharp-free C#: the probe (internal) and the user contract's TorchSharp-free part (public)
PROBE_SOURCES = sorted((REPO / "dotnet" / "Probe").glob("*.cs")) + sorted((REPO / "dotnet" / "Contract").glob("*.cs"))
#: what a user's TorchSharp project compiles in (examples/torchsharp-own-model/OwnModel.csproj): the above, the
#: contract's TorchSharp part and the TorchSharp readers
TORCHSHARP_SOURCES = PROBE_SOURCES + sorted((REPO / "dotnet" / "Contract" / "TorchSharp").glob("*.cs")) \
    + [REPO / "dotnet" / "Worker" / "TorchSharpProbe.cs"]
SOURCES = PROBE_SOURCES + sorted((REPO / "tests" / "dotnet").glob("*.cs"))


class BuildUnavailable(RuntimeError):
    """``mcs`` is not installed (Debian package mono-mcs)."""


def source_hash() -> str:
    h = hashlib.sha256(b"assembly-name-TestLoop")  # builds before this named the assembly TestLoop.PID.tmp
    for p in SOURCES:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("OPTCHECK_TESTLOOP_CACHE") or os.path.join(tempfile.gettempdir(), "optcheck-testloop")
    return Path(base)


def build_testloop(out_dir: str | os.PathLike | None = None) -> Path:
    """Compile the test loop (once per source hash) and return the ``.dll`` path.

    Raises:
        BuildUnavailable: no ``mcs``.
        RuntimeError: the compiler failed (its output in the message).
    """
    mcs = shutil.which("mcs")
    if mcs is None:
        raise BuildUnavailable("mcs not found: apt-get install mono-mcs")
    target = Path(out_dir) if out_dir else cache_dir() / source_hash()
    dll = target / "TestLoop.dll"
    if dll.exists():
        return dll
    target.mkdir(parents=True, exist_ok=True)
    # compiled under its own name (the assembly's name is the file's) in a private folder, then moved
    tmpdir = target / f".build.{os.getpid()}"
    tmpdir.mkdir(exist_ok=True)
    tmp = tmpdir / "TestLoop.dll"
    cmd = [mcs, "-target:library", "-langversion:7", "-debug", "-optimize+", "-nologo", f"-out:{tmp}",
           *map(str, SOURCES)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise RuntimeError(f"mcs failed ({res.returncode}):\n{res.stdout}{res.stderr}")
    mdb = Path(str(tmp) + ".mdb")
    if mdb.exists():
        os.replace(mdb, str(dll) + ".mdb")
    os.replace(tmp, dll)
    shutil.rmtree(tmpdir, ignore_errors=True)
    return dll


if __name__ == "__main__":
    print(build_testloop())


# -- TorchSharp's real reference assembly --------------------------------------------------

#: A folder holding TorchSharp's netstandard2.0 TorchSharp.dll and System.Memory.dll (which its API references).
REF_ENV = "OPTCHECK_TORCHSHARP_REF"
MONO_FACADE = Path("/usr/lib/mono/4.5/Facades/netstandard.dll")


def find_torchsharp_ref(version: str) -> tuple[list[Path], str]:
    """The reference assemblies to compile against TorchSharp ``version``'s real API with ``mcs``:
    ``$OPTCHECK_TORCHSHARP_REF/{TorchSharp,System.Memory}.dll``, else the user's NuGet cache
    (``~/.nuget/packages/torchsharp/VERSION/lib/netstandard2.0/TorchSharp.dll`` and the newest
    ``system.memory/*/lib/netstandard2.0/System.Memory.dll``).

    Returns:
        (the two DLL paths, where they came from), or ([], why none was found).
    """
    env = os.environ.get(REF_ENV)
    if env:
        folder = Path(env).expanduser()
        dlls = [folder / "TorchSharp.dll", folder / "System.Memory.dll"]
        missing = [d.name for d in dlls if not d.is_file()]
        if missing:
            return [], f"${REF_ENV}={env} has no {' / '.join(missing)}"
        return dlls, f"${REF_ENV}={env}"
    nuget = Path(os.environ.get("NUGET_PACKAGES") or Path.home() / ".nuget" / "packages")
    ts = nuget / "torchsharp" / version / "lib" / "netstandard2.0" / "TorchSharp.dll"
    mem = sorted(nuget.glob("system.memory/*/lib/netstandard2.0/System.Memory.dll"))
    if ts.is_file() and mem:
        return [ts, mem[-1]], f"the NuGet cache {nuget}"
    return [], (f"no TorchSharp {version} reference assembly: set ${REF_ENV} to a folder holding its "
                f"netstandard2.0 TorchSharp.dll and System.Memory.dll, or restore TorchSharp {version} "
                f"with NuGet (looked for {ts})")


def mcs_against_ref(refs: list[Path], out: Path, sources: list[Path], *extra: str) -> subprocess.CompletedProcess:
    """``mcs -target:library`` of ``sources`` against the reference assemblies ``refs`` (Mono's
    netstandard facade and System.Numerics too, which TorchSharp's netstandard2.0 API needs)."""
    cmd = ["mcs", "-target:library", "-nologo", f"-out:{out}", *(f"-r:{r}" for r in refs),
           f"-r:{MONO_FACADE}", "-r:System.Numerics.dll", "-nowarn:1685", *extra, *map(str, sources)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


# -- C# harnesses over the stand-in ----------------------------------------------------------

def build_harness(source: Path, out_dir: Path) -> Path:
    """Compile the harness ``source`` (a C# program using TestLoop.dll) into ``out_dir`` beside a copy of
    TestLoop.dll; returns the ``.exe``.

    Raises:
        BuildUnavailable: no ``mcs``.
        RuntimeError: the compiler failed (its output in the message).
    """
    dll = build_testloop()
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(dll, out_dir / "TestLoop.dll")
    exe = out_dir / (source.stem + ".exe")
    res = subprocess.run(["mcs", "-nologo", f"-out:{exe}", f"-r:{out_dir / 'TestLoop.dll'}", str(source)],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"mcs failed ({res.returncode}):\n{res.stdout}{res.stderr}")
    return exe


def harness_or_skip(source: Path, out_dir: Path) -> Path:
    """:func:`build_harness` for a pytest fixture: skips the test, saying why, without mono or mcs."""
    import pytest

    if shutil.which("mono") is None or shutil.which("mcs") is None:
        pytest.skip("mono/mcs not installed (Debian mono-runtime, mono-mcs)")
    try:
        return build_harness(source, out_dir)
    except BuildUnavailable as e:
        pytest.skip(str(e))


def run_harness(exe: Path, *args: str, codes: tuple[int, ...] = (0, 3)) -> tuple[int, dict[str, list[str]]]:
    """Run a harness on Mono: (exit code, its "key value" lines as key -> [values]).

    Raises:
        AssertionError: it exited with a code not in ``codes`` (its output in the message).
    """
    res = subprocess.run(["mono", str(exe), *args], capture_output=True, text=True, timeout=120)
    assert res.returncode in codes, res.stdout + res.stderr
    out: dict[str, list[str]] = {}
    for ln in res.stdout.splitlines():
        k, _, v = ln.partition(" ")
        out.setdefault(k, []).append(v)
    return res.returncode, out
