"""Build the TorchSharp worker with Mono's C# compiler ``mcs`` against a local TorchSharp folder. Torch-free.

Where there is no .NET SDK (this project's machine kind: no SDK, no NuGet), ``--torchsharp PATH``
to a folder holding a ``netstandard2.0`` ``TorchSharp.dll`` and its native ``libLibTorchSharp.so``
(``docs/torchsharp.md``, "Real TorchSharp here") is built here instead of with ``dotnet build``:
``mcs`` (C# 7, the language version the sources pin) compiles ``dotnet/Probe``, ``dotnet/Contract``
and ``dotnet/Worker`` against that ``TorchSharp.dll``, ``System.Memory.dll`` (netstandard2.0, which
TorchSharp's API uses: beside ``TorchSharp.dll``, in ``$OPTCHECK_TORCHSHARP_REF``, or NuGet's cache),
Mono's ``netstandard`` facade and ``System.Numerics``; the assembly is put beside copies of
``TorchSharp.dll``, the other managed DLLs of that folder and its native libraries. It runs on
CoreCLR (3.1 from PyPI's ``dotnetcore2`` or newer); Mono 6.8 cannot run real TorchSharp
(its ``System.Memory`` needs ``System.Runtime.CompilerServices.Unsafe`` 4.0.4.1).

:func:`build` is what :func:`optcheck.torchsharp_bridge.build.ensure_worker_assembly` calls;
:func:`usable` says whether it can serve a spec. Errors are one line (:class:`InputError`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from optcheck.errors import InputError

#: The netstandard facade of Mono that mcs compiles a netstandard2.0 reference against (Debian mono-devel).
MONO_FACADE = Path("/usr/lib/mono/4.5/Facades/netstandard.dll")
REF_ENV = "OPTCHECK_TORCHSHARP_REF"
TIMEOUT_S = 600


def mcs() -> str | None:
    """The ``mcs`` command, or None (Debian ``mono-mcs``)."""
    return shutil.which("mcs")


def usable(dll: Path) -> bool:
    """Whether ``mcs`` can build against the TorchSharp ``dll``: ``mcs`` and Mono's netstandard facade are
    installed and the DLL is a netstandard one (TorchSharp's ``lib/netstandard2.0``)."""
    from optcheck.torchsharp_bridge.runtime import target_framework

    framework = target_framework(dll) or ""
    return mcs() is not None and MONO_FACADE.is_file() and framework.startswith(".NETStandard")


def system_memory(dll: Path) -> tuple[Path | None, list[str]]:
    """The netstandard2.0 ``System.Memory.dll`` to compile against with ``dll``: beside it,
    ``$OPTCHECK_TORCHSHARP_REF/System.Memory.dll``, or the newest in NuGet's cache. Returns
    (the path or None, the places looked at)."""
    env = os.environ.get(REF_ENV)
    nuget = Path(os.environ.get("NUGET_PACKAGES") or Path.home() / ".nuget" / "packages")
    places = [dll.parent / "System.Memory.dll"] + ([Path(env).expanduser() / "System.Memory.dll"] if env else [])
    for p in places:
        if p.is_file():
            return p, [str(x) for x in places]
    cached = sorted(nuget.glob("system.memory/*/lib/netstandard2.0/System.Memory.dll"))
    looked = [str(x) for x in places] + [str(nuget / "system.memory/*/lib/netstandard2.0")]
    return (cached[-1] if cached else None), looked


def command(sources: list[Path], out: Path, refs: list[Path]) -> list[str]:
    """The ``mcs`` command line: a library, C# 7, optimised, against ``refs`` + Mono's netstandard facade."""
    return [mcs() or "mcs", "-target:library", "-langversion:7", "-optimize+", "-debug", "-nologo", f"-out:{out}",
            *(f"-r:{r}" for r in refs), f"-r:{MONO_FACADE}", "-r:System.Numerics.dll", "-nowarn:1685",
            *map(str, sources)]


def _copy_beside(torchsharp_dir: Path, out_dir: Path) -> list[str]:
    """TorchSharp.dll, the other managed DLLs of its folder (Google.Protobuf, SharpZipLib when there) and
    its native libraries, copied into ``out_dir``; System.Memory stays out (the runtime has its own)."""
    copied = []
    for f in sorted(torchsharp_dir.iterdir()):
        if not f.is_file() or f.name == "System.Memory.dll":
            continue
        if f.suffix == ".dll" or ".so" in f.suffixes or f.suffix == ".dylib":
            shutil.copy2(f, out_dir / f.name)
            copied.append(f.name)
    return copied


def build(dll: Path, sources: list[Path], out_dir: Path, assembly: str, log: Path, say) -> tuple[Path, dict]:
    """Compile ``sources`` against the TorchSharp ``dll`` into ``out_dir/assembly`` (replacing what is there).

    Returns:
        (the assembly's path, what to record in build.json: compiler, references, files copied).

    Raises:
        InputError: no ``mcs``, no System.Memory.dll to compile against, or a compile error (its first
            ``error`` line, the log's path and the command).
    """
    exe = mcs()
    if exe is None:
        raise InputError(f"--torchsharp {dll.parent}: no .NET SDK and no Mono C# compiler to build the worker with; "
                         f"install the .NET SDK 8+ or Debian's mono-mcs and mono-devel")
    memory, looked = system_memory(dll)
    if memory is None:
        raise InputError(f"--torchsharp {dll.parent}: building the worker with mcs needs TorchSharp's netstandard2.0 "
                         f"System.Memory.dll to compile against; looked in {', '.join(looked)}: put it beside "
                         f"TorchSharp.dll or set ${REF_ENV} to the folder holding it")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    target = out_dir / assembly
    cmd = command(sources, target, [dll, memory])
    say(f"building the TorchSharp worker with mcs against {dll} ({len(sources)} source files) into {out_dir} "
        f"(log: {log})")
    t0 = time.monotonic()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        output, code = (res.stdout or "") + (res.stderr or ""), res.returncode
    except (OSError, subprocess.SubprocessError) as e:
        output, code = f"error: {e}", -1
    log.write_text("$ " + " ".join(cmd) + "\n" + output)
    if code != 0 or not target.is_file():
        first = next((ln.strip() for ln in output.splitlines() if "error" in ln), output.strip()[:300])
        raise InputError(f"--torchsharp {dll.parent}: mcs could not compile the worker: {first}; log: {log}; "
                         f"command: {' '.join(cmd)}")
    copied = _copy_beside(dll.parent, out_dir)
    say(f"built {assembly} with mcs in {time.monotonic() - t0:.1f} s")
    return target, {"compiler": "mcs", "references": [str(dll), str(memory)], "copied": copied}
