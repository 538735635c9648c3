"""Find the .NET runtimes installed here, without loading any. Torch-free.

CoreCLR: every ``Microsoft.NETCore.App`` under ``$DOTNET_ROOT``, beside the
``dotnet`` command, in the usual install folders and inside PyPI's ``dotnetcore2``
package (CoreCLR 3.1, ``dotnetcore2/bin``); a root counts only with a ``host/fxr``.
Mono: ``libmonosgen-2.0.so`` (Debian ``mono-runtime`` + ``libmono-2.0-dev``) and
``Facades/netstandard.dll`` (``mono-devel``), which pythonnet's ``Python.Runtime``
needs. Also the SDKs (``optcheck doctor``) and whether libicu is installed.

Discovery goes through ``clr_loader`` (pythonnet's loader) where it serves: the
runtimes under a root (``find_runtimes_in_root``) and ``find_libmono``. Kept here,
because clr_loader does not do it (``docs/dotnet.md``, "Runtimes"): the roots beyond
``$DOTNET_ROOT``/``dotnet`` (default folders, dotnetcore2), the ``host/fxr`` check, the
SDK list, Mono's facade and version. Choosing one and loading it:
``optcheck.torchsharp_bridge.runtime``.
"""

from __future__ import annotations

import ctypes.util
import glob
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

NETCORE_APP = "Microsoft.NETCore.App"
PYTHONNET_HINT = "pip install 'pythonnet>=3.0'"
CORECLR_HINT = ("install the .NET 8 (or newer) runtime, e.g. Debian/Ubuntu package dotnet-runtime-8.0, "
                "or `pip install dotnetcore2` (CoreCLR 3.1), or use --dotnet-runtime mono")
MONO_HINT = "apt-get install mono-runtime libmono-2.0-dev mono-devel, or use --dotnet-runtime coreclr"
DEFAULT_ROOTS = ("/usr/share/dotnet", "/usr/lib/dotnet", "/usr/local/share/dotnet", "/opt/dotnet",
                  "~/.dotnet")
_MONO_FACADES = ("/usr/lib/mono/4.5/Facades", "/usr/local/lib/mono/4.5/Facades",
                 "/opt/mono/lib/mono/4.5/Facades")


@dataclass(frozen=True)
class DotnetRuntime:
    """One runtime that could be loaded.

    Attributes:
        kind: "coreclr" or "mono".
        version: e.g. "8.0.11", "3.1.23" (CoreCLR: the Microsoft.NETCore.App
            version), "6.8.0.105" (Mono; "" when unknown).
        root: CoreCLR: the dotnet root (holds ``host/fxr`` and the ``shared`` framework folder);
            Mono: the path of ``libmonosgen-2.0.so``.
        source: where it was found ("DOTNET_ROOT", "dotnet on PATH", "dotnetcore2",
            a default folder, "libmono").
    """

    kind: str
    version: str
    root: str
    source: str

    @property
    def version_info(self) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", self.version)[:4])

    def describe(self) -> str:
        return f"{self.kind} {self.version or '?'} ({self.root}, from {self.source})"


# -- finding ---------------------------------------------------------------------------

def dotnetcore2_root() -> Path | None:
    """``dotnetcore2/bin`` of PyPI's dotnetcore2 package (CoreCLR 3.1), without importing it."""
    spec = importlib.util.find_spec("dotnetcore2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        root = Path(loc) / "bin"
        if (root / "shared" / NETCORE_APP).is_dir():
            return root
    return None


def dotnet_roots(explicit: str | os.PathLike | None = None) -> list[tuple[Path, str]]:
    """Candidate dotnet roots, in search order: ``explicit``, ``$DOTNET_ROOT``, the
    folder of ``dotnet`` on PATH, default install folders, dotnetcore2.
    Returns ``(root, source)`` pairs of existing folders, without duplicates."""
    cands: list[tuple[Path, str]] = []
    if explicit:
        cands.append((Path(explicit).expanduser(), "--dotnet-root"))
    else:
        if os.environ.get("DOTNET_ROOT"):
            cands.append((Path(os.environ["DOTNET_ROOT"]), "DOTNET_ROOT"))
        cli = shutil.which("dotnet")
        if cli:
            cands.append((Path(os.path.realpath(cli)).parent, "dotnet on PATH"))
        cands += [(Path(p).expanduser(), p) for p in DEFAULT_ROOTS]
        dc2 = dotnetcore2_root()
        if dc2 is not None:
            cands.append((dc2, "dotnetcore2"))
    seen, out = set(), []
    for root, source in cands:
        key = os.path.realpath(root)
        if key in seen or not root.is_dir():
            continue
        seen.add(key)
        out.append((root, source))
    return out


def coreclr_runtimes(explicit_root: str | os.PathLike | None = None) -> list[DotnetRuntime]:
    """Every ``Microsoft.NETCore.App`` version installed under the candidate roots
    (clr_loader's ``find_runtimes_in_root``; a root counts only when it also has
    ``host/fxr``, which pythonnet loads). Empty when clr_loader is not installed."""
    try:
        from clr_loader.util.find import find_runtimes_in_root
    except ImportError:
        return []
    out = []
    for root, source in dotnet_roots(explicit_root):
        if not (root / "shared").is_dir() or not (root / "host" / "fxr").is_dir():
            continue
        for ver in sorted(r.version for r in find_runtimes_in_root(root) if r.name == NETCORE_APP):
            out.append(DotnetRuntime("coreclr", ver, str(root), source))
    return out


def dotnet_sdks() -> list[str]:
    """Installed .NET SDKs as ``"VERSION [PATH]"`` lines (``dotnet --list-sdks``, or
    the ``sdk/`` folders of the candidate roots when there is no ``dotnet`` command)."""
    cli = shutil.which("dotnet")
    if cli:
        try:
            res = subprocess.run([cli, "--list-sdks"], capture_output=True, text=True, errors="replace", timeout=30)
            return [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    out = []
    for root, _ in dotnet_roots():
        for p in sorted(glob.glob(str(root / "sdk" / "*"))):
            if os.path.isdir(p) and re.match(r"\d", os.path.basename(p)):
                out.append(f"{os.path.basename(p)} [{os.path.dirname(p)}]")
    return out


def find_libmono() -> Path | None:
    """``libmonosgen-2.0.so`` as pythonnet's loader finds it (clr_loader's ``find_libmono``),
    or None."""
    try:
        from clr_loader import find_libmono as clr_find_libmono
        return clr_find_libmono()
    except (ImportError, RuntimeError):  # RuntimeError: "Could not find libmono"
        return None


def mono_facade() -> Path | None:
    """Mono's ``Facades/netstandard.dll`` (Debian package mono-devel), or None."""
    for d in _MONO_FACADES:
        p = Path(d) / "netstandard.dll"
        if p.exists():
            return p
    return None


def mono_version() -> str:
    """Mono's version from ``mono --version`` ("" when there is no ``mono`` command)."""
    cli = shutil.which("mono")
    if not cli:
        return ""
    try:
        out = subprocess.run([cli, "--version"], capture_output=True, text=True, errors="replace", timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"version (\S+)", out)
    return m.group(1) if m else ""


def mono_runtime() -> DotnetRuntime | None:
    """The Mono runtime pythonnet can load, or None when libmono is missing."""
    lib = find_libmono()
    if lib is None:
        return None
    return DotnetRuntime("mono", mono_version(), str(lib), "libmono")


def newest(runtimes: list[DotnetRuntime]) -> DotnetRuntime | None:
    """The runtime with the highest version (roll forward to the newest installed)."""
    return max(runtimes, key=lambda r: r.version_info, default=None)


def icu_available() -> bool:
    """True when libicu is installed (.NET's globalization needs it unless invariant)."""
    if ctypes.util.find_library("icuuc"):
        return True
    return bool(glob.glob("/usr/lib/*/libicuuc.so.*") or glob.glob("/usr/lib/libicuuc.so.*"))

