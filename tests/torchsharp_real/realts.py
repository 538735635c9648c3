"""The real-TorchSharp tier's set-up: where real TorchSharp is, and building against it once.

Real TorchSharp runs here from a folder holding TorchSharp 0.107.0's own netstandard2.0 ``TorchSharp.dll``
and a ``libLibTorchSharp.so`` built against this Python's ``torch`` (``docs/torchsharp.md``, "Real TorchSharp
here"): ``$OPTCHECK_TORCHSHARP_NATIVE`` (``.ci/run`` sets it to CI's copy of such a folder). The tier
(marker ``torchsharp_real``, tests/torchsharp_real/) needs that folder, Mono's ``mcs`` and its netstandard
facade, a CoreCLR (PyPI ``dotnetcore2``), this Python's torch (its ``torch/lib`` is the libtorch) and a
netstandard2.0 ``System.Memory.dll`` to compile against (beside ``TorchSharp.dll``, ``$OPTCHECK_TORCHSHARP_REF``,
or ``../0.107.0`` beside the folder). Without them each test skips, and the session prints one line saying
why (tests/conftest.py); with ``$OPTCHECK_REQUIRE_TORCHSHARP_REAL=1`` (``.ci/run`` sets it where the folder is
there) they fail instead.

Everything is built once per content hash into ``$OPTCHECK_REAL_TORCHSHARP_CACHE`` (default: a folder of the
system's temporary directory), under a lock, so that the xdist workers and later sessions share it: the worker
through optcheck's own ``--torchsharp FOLDER`` build (``optcheck.torchsharp_bridge.build``, with mcs), and the
user code of ``tests/dotnet/real/`` (a trainer assembly and a plain .NET loop).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE_ENV = "OPTCHECK_TORCHSHARP_NATIVE"
REQUIRE_ENV = "OPTCHECK_REQUIRE_TORCHSHARP_REAL"
USER_SOURCES = sorted((ROOT / "tests" / "dotnet" / "real").glob("*.cs")) + [ROOT / "tests" / "dotnet" / "GuardReport.cs"]
#: the shipped example of a user's own model (README, examples/torchsharp-own-model/)
EXAMPLE = ROOT / "examples" / "torchsharp-own-model" / "OwnModel.cs"
#: optcheck's C# a user's assembly compiles in (examples/torchsharp-own-model/OwnModel.csproj)
OPTCHECK_SOURCES = sorted((ROOT / "dotnet" / "Probe").glob("*.cs")) + sorted((ROOT / "dotnet" / "Contract").glob("*.cs")) \
    + sorted((ROOT / "dotnet" / "Contract" / "TorchSharp").glob("*.cs")) + [ROOT / "dotnet" / "Worker" / "TorchSharpProbe.cs"]
#: A model small enough for a few hundred real-TorchSharp steps in a few seconds on one thread.
SMALL = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--batch-size", "8",
         "--val-every", "100"]


def native_folder() -> Path | None:
    """The folder of real TorchSharp: ``$OPTCHECK_TORCHSHARP_NATIVE``, when it holds both files."""
    env = os.environ.get(NATIVE_ENV)
    if not env:
        return None
    folder = Path(env).expanduser()
    ok = (folder / "TorchSharp.dll").is_file() and (folder / "libLibTorchSharp.so").is_file()
    return folder.resolve() if ok else None


def reference_dir(folder: Path) -> Path | None:
    """Where the netstandard2.0 System.Memory.dll to compile against is: beside TorchSharp.dll,
    ``$OPTCHECK_TORCHSHARP_REF``, or the NuGet reference folder ``../0.107.0`` beside ``folder``."""
    env = os.environ.get("OPTCHECK_TORCHSHARP_REF")
    for d in [folder] + ([Path(env).expanduser()] if env else []) + [folder.parent / "0.107.0"]:
        if (d / "System.Memory.dll").is_file():
            return d
    return None


def unavailable() -> str | None:
    """Why the tier cannot run here (one line), or None."""
    from optcheck.torchsharp_bridge import discovery, libtorch, mcs_build

    folder = native_folder()
    if folder is None:
        where = os.environ.get(NATIVE_ENV)
        if not where:
            return f"no real TorchSharp: ${NATIVE_ENV} is not set (a folder made as docs/torchsharp.md says)"
        return (f"no real TorchSharp: {where} holds no TorchSharp.dll + libLibTorchSharp.so (set ${NATIVE_ENV} to "
                f"such a folder, docs/torchsharp.md)")
    if mcs_build.mcs() is None or not mcs_build.MONO_FACADE.is_file():
        return "real TorchSharp: mcs or Mono's netstandard facade is missing (Debian mono-mcs, mono-devel)"
    if not discovery.coreclr_runtimes(None):
        return "real TorchSharp: no CoreCLR (pip install dotnetcore2)"
    if libtorch.resolve()[0] is None:
        return f"real TorchSharp: {libtorch.resolve()[1]}"
    if reference_dir(folder) is None:
        return f"real TorchSharp: no netstandard2.0 System.Memory.dll beside {folder} nor in $OPTCHECK_TORCHSHARP_REF"
    return None


def cache_root() -> Path:
    base = os.environ.get("OPTCHECK_REAL_TORCHSHARP_CACHE") or os.path.join(tempfile.gettempdir(), "optcheck-real-torchsharp")
    return Path(base)


@dataclass
class RealTorchSharp:
    """Real TorchSharp, ready: ``folder`` (TorchSharp.dll + libLibTorchSharp.so), ``env`` for ``optcheck``
    subprocesses, ``worker`` (optcheck's GPT worker as ``--torchsharp folder`` builds it), ``trainers``
    (tests/dotnet/real as a user's assembly, TorchSharp beside it), ``guard_loop`` (the plain .NET loop) and
    ``example`` (examples/torchsharp-own-model/OwnModel.cs as its README builds it, here with mcs)."""

    folder: Path
    env: dict = field(default_factory=dict)
    worker: Path | None = None
    trainers: Path | None = None
    guard_loop: Path | None = None
    example: Path | None = None

    def soak_args(self, *args: str) -> list[str]:
        """``optcheck soak`` on the built-in GPT as a user types it: ``--backend torchsharp --torchsharp FOLDER``."""
        return ["soak", "-q", "--backend", "torchsharp", "--torchsharp", str(self.folder), *args]

    def trainer_args(self, trainer: str, *args: str, options: dict | None = None) -> list[str]:
        """``optcheck soak`` on one of tests/dotnet/real's trainers (``--dotnet-assembly``)."""
        opts = [a for k, v in (options or {}).items() for a in ("--trainer-option", f"{k}={v}")]
        return ["soak", "-q", "--backend", "torchsharp", "--dotnet-assembly", str(self.trainers), "--dotnet-trainer",
                f"OptCheckReal.{trainer}", *opts, *args]

    def guard(self, *args: str) -> subprocess.CompletedProcess:
        """The plain .NET loop on CoreCLR (``dotnet exec``), with libtorch on LD_LIBRARY_PATH as a user sets it."""
        from optcheck.torchsharp_bridge import libtorch, runtime

        rt = runtime.select("coreclr")
        rc = runtime.write_runtimeconfig(rt, self.guard_loop.parent)
        env = {**self.env, "LD_LIBRARY_PATH": f"{self.guard_loop.parent}:{libtorch.resolve()[0]}",
               "DOTNET_SYSTEM_GLOBALIZATION_INVARIANT": "1"}
        return subprocess.run([str(Path(rt.root) / "dotnet"), "exec", "--runtimeconfig", str(rc), str(self.guard_loop),
                               *args], capture_output=True, text=True, timeout=180, env=env)


def _locked(folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    fh = open(folder / ".lock", "w")
    fcntl.flock(fh, fcntl.LOCK_EX)
    return fh


def _user_code(folder: Path, refs: list[Path]) -> tuple[Path, Path]:
    """tests/dotnet/real compiled with optcheck's sources (mcs), cached by the hash of every input."""
    from optcheck.torchsharp_bridge import mcs_build

    h = hashlib.sha256()
    for p in [*OPTCHECK_SOURCES, *USER_SOURCES, EXAMPLE, folder / "TorchSharp.dll"]:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    out = cache_root() / f"user-{h.hexdigest()[:16]}"
    dll, exe, example = out / "RealTrainers.dll", out / "GuardLoop.exe", out / "OwnModel.dll"
    lock = _locked(out)
    try:
        if not (dll.is_file() and exe.is_file() and example.is_file()):
            lib = [s for s in USER_SOURCES if s.name not in ("GuardLoop.cs", "GuardReport.cs")]
            for target, sources, kind in ((dll, lib, "library"), (exe, USER_SOURCES, "exe"), (example, [EXAMPLE], "library")):
                cmd = mcs_build.command([*OPTCHECK_SOURCES, *sources], target, refs)
                cmd[1] = f"-target:{kind}"
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                assert res.returncode == 0, res.stdout + res.stderr
            for f in ("TorchSharp.dll", "libLibTorchSharp.so"):
                shutil.copy2(folder / f, out / f)
    finally:
        lock.close()
    return dll, exe, example


def prepare() -> RealTorchSharp:
    """Build what the tier runs (once per content hash). Raises AssertionError with the compiler's output."""
    folder = native_folder()
    ref = reference_dir(folder)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPTCHECK_CACHE": str(cache_root() / "optcheck-cache"),
           "OPTCHECK_TORCHSHARP_REF": str(ref), "PYTHONPATH": os.pathsep.join(
               [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    res = subprocess.run([sys.executable, "-m", "optcheck.torchsharp_bridge.build", str(folder)], capture_output=True,
                         text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    worker = Path(res.stdout.strip().splitlines()[-1])
    trainers, guard, example = _user_code(folder, [folder / "TorchSharp.dll", ref / "System.Memory.dll"])
    return RealTorchSharp(folder=folder, env=env, worker=worker, trainers=trainers, guard_loop=guard, example=example)


@pytest.fixture(scope="session")
def real_ts() -> RealTorchSharp:
    """Real TorchSharp, built; skips (fails under ``$OPTCHECK_REQUIRE_TORCHSHARP_REAL=1``) where it cannot run.
    Test modules import it (``from realts import real_ts``)."""
    why = unavailable()
    if why:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"${REQUIRE_ENV}=1 and {why}", pytrace=False)
        pytest.skip(why)
    return prepare()
