"""Build the .NET stand-in training loop for the tests: ``dotnet/Probe/*.cs`` +
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
SOURCES = sorted((REPO / "dotnet" / "Probe").glob("*.cs")) + sorted((REPO / "tests" / "dotnet").glob("*.cs"))


class BuildUnavailable(RuntimeError):
    """``mcs`` is not installed (Debian package mono-mcs)."""


def source_hash() -> str:
    h = hashlib.sha256()
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
    tmp = target / f"TestLoop.{os.getpid()}.tmp.dll"
    cmd = [mcs, "-target:library", "-langversion:7", "-debug", "-optimize+", "-nologo", f"-out:{tmp}",
           *map(str, SOURCES)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"mcs failed ({res.returncode}):\n{res.stdout}{res.stderr}")
    os.replace(tmp, dll)
    mdb = Path(str(tmp) + ".mdb")
    if mdb.exists():
        os.replace(mdb, str(dll) + ".mdb")
    return dll


if __name__ == "__main__":
    print(build_testloop())
