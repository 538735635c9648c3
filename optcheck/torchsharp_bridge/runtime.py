"""Find a .NET runtime and load it into this process with pythonnet. Torch-free.

CoreCLR is the default: TorchSharp users run .NET 8 or newer, and this module
rolls forward to the newest ``Microsoft.NETCore.App`` it finds (a generated
``runtimeconfig.json`` with ``rollForward: LatestMajor``, ``docs/dotnet.md``). It
looks in ``$DOTNET_ROOT``, beside the ``dotnet`` command, in the usual install
folders and inside PyPI's ``dotnetcore2`` package (CoreCLR 3.1, ``dotnetcore2/bin``).
Mono (Debian ``mono-runtime`` + ``libmono-2.0-dev`` + ``mono-devel``, whose
``Facades/netstandard.dll`` pythonnet's ``Python.Runtime`` needs) is the
alternative.

Discovery goes through ``clr_loader`` (pythonnet's loader) where it serves: the
runtimes under a root (``find_runtimes_in_root``) and ``find_libmono``. Kept here,
because clr_loader does not do it (``docs/dotnet.md``, "Runtimes"): the roots beyond
``$DOTNET_ROOT``/``dotnet`` (default folders, dotnetcore2), the ``host/fxr`` check, the
SDK list, Mono's facade and version, and the runtimeconfig (roll-forward, invariant
globalization, the ``netcoreapp3.1`` TFM that clr_loader would spell ``net3.1``).

A runtime can be loaded once per process (``pythonnet.load`` before ``import
clr``; ~0.4 s). Everything that cannot be found or loaded raises
:class:`optcheck.errors.InputError` with one line naming what is missing and how
to get it — never a traceback, never a crash: a Mono without the netstandard
facade would otherwise abort the process (SIGABRT) inside ``pythonnet.load``.
"""

from __future__ import annotations

import ctypes.util
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from optcheck.errors import InputError

KINDS = ("coreclr", "mono")
NETCORE_APP = "Microsoft.NETCore.App"
PYTHONNET_HINT = "pip install 'pythonnet>=3.0'"
CORECLR_HINT = ("install the .NET 8 (or newer) runtime, e.g. Debian/Ubuntu package dotnet-runtime-8.0, "
                "or `pip install dotnetcore2` (CoreCLR 3.1), or use --dotnet-runtime mono")
MONO_HINT = "apt-get install mono-runtime libmono-2.0-dev mono-devel, or use --dotnet-runtime coreclr"
_DEFAULT_ROOTS = ("/usr/share/dotnet", "/usr/lib/dotnet", "/usr/local/share/dotnet", "/opt/dotnet",
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
        cands += [(Path(p).expanduser(), p) for p in _DEFAULT_ROOTS]
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
            res = subprocess.run([cli, "--list-sdks"], capture_output=True, text=True, timeout=30)
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
        out = subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=30).stdout
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


def tfm(version: str) -> str:
    """Target framework moniker of a runtime version: 3.1.23 -> netcoreapp3.1, 8.0.1 -> net8.0."""
    parts = re.findall(r"\d+", version)
    major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    return f"netcoreapp{major}.{minor}" if major < 5 else f"net{major}.{minor}"


def needs_invariant_globalization(rt: DotnetRuntime) -> bool:
    """Whether CoreCLR ``rt`` must run with invariant globalization.

    ``$DOTNET_SYSTEM_GLOBALIZATION_INVARIANT`` decides when set ("1"/"true" or
    "0"/"false"). Otherwise: yes when libicu is missing, and yes for .NET Core 3.x,
    which probes only the ICU versions it knew (Debian 12's libicu72 is newer and
    3.1 then aborts at start: "Couldn't find a valid ICU package").
    """
    env = os.environ.get("DOTNET_SYSTEM_GLOBALIZATION_INVARIANT", "").strip().lower()
    if env in ("1", "true"):
        return True
    if env in ("0", "false"):
        return False
    return not icu_available() or (rt.version_info[:1] or (0,))[0] < 5


def write_runtimeconfig(rt: DotnetRuntime, directory: str | os.PathLike,
                        invariant_globalization: bool | None = None) -> Path:
    """Write ``optcheck.runtimeconfig.json`` asking for ``rt`` and rolling forward to the
    newest major (``LatestMajor``). Globalization is made invariant when
    :func:`needs_invariant_globalization` says so (``invariant_globalization=None``).
    Returns the file's path."""
    if invariant_globalization is None:
        invariant_globalization = needs_invariant_globalization(rt)
    cfg = {"runtimeOptions": {"tfm": tfm(rt.version), "rollForward": "LatestMajor",
                              "framework": {"name": NETCORE_APP, "version": rt.version},
                              "configProperties": {"System.Globalization.Invariant": bool(invariant_globalization)}}}
    path = Path(directory) / "optcheck.runtimeconfig.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path


# -- loading ---------------------------------------------------------------------------

_LOADED: DotnetRuntime | None = None


def loaded() -> DotnetRuntime | None:
    """The runtime loaded into this process, or None."""
    return _LOADED


def pythonnet_version() -> str | None:
    """pythonnet's installed version, or None (no import of pythonnet)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("pythonnet")
    except PackageNotFoundError:
        return None


def select(kind: str = "coreclr", dotnet_root: str | os.PathLike | None = None) -> DotnetRuntime:
    """The runtime :func:`load` would load, without loading anything.

    Raises:
        InputError: unknown kind; no runtime of that kind (naming where it looked and
            how to install one); Mono without the netstandard facade.
    """
    if kind not in KINDS:
        raise InputError(f"--dotnet-runtime {kind!r}: expected one of {', '.join(KINDS)}")
    try:
        import clr_loader  # noqa: F401  (pythonnet's loader: discovery below goes through it)
    except ImportError:
        raise InputError(f"pythonnet is not installed (no clr_loader), and the TorchSharp backend drives .NET "
                         f"through it: {PYTHONNET_HINT}") from None
    if kind == "coreclr":
        if dotnet_root is not None and not Path(dotnet_root).expanduser().is_dir():
            raise InputError(f"--dotnet-root {dotnet_root}: no such directory; {CORECLR_HINT}")
        rt = newest(coreclr_runtimes(dotnet_root))
        if rt is None:
            where = str(dotnet_root) if dotnet_root else "DOTNET_ROOT, dotnet on PATH, " + ", ".join(_DEFAULT_ROOTS) + \
                ", dotnetcore2"
            raise InputError(f"no .NET runtime ({NETCORE_APP} with host/fxr) found in {where}: {CORECLR_HINT}")
        return rt
    rt = mono_runtime()
    if rt is None:
        raise InputError(f"Mono not found (no libmonosgen-2.0.so): {MONO_HINT}")
    if mono_facade() is None:
        raise InputError("Mono lacks Facades/netstandard.dll, which pythonnet's Python.Runtime needs "
                         "(loading would abort the process): apt-get install mono-devel")
    return rt


def load(kind: str = "coreclr", dotnet_root: str | os.PathLike | None = None,
         config_dir: str | os.PathLike | None = None) -> DotnetRuntime:
    """Load a .NET runtime into this process with pythonnet and ``import clr``.

    Idempotent for the same kind; a process can hold one runtime only.

    Args:
        kind: "coreclr" (newest installed ``Microsoft.NETCore.App``, rolled forward)
            or "mono".
        dotnet_root: look for CoreCLR only here.
        config_dir: where to write the runtimeconfig (default: a temporary folder).

    Returns:
        The runtime loaded (version: CoreCLR's framework version asked for).

    Raises:
        InputError: pythonnet missing, no runtime, the runtime failed to load, or
            another kind is already loaded in this process.
    """
    global _LOADED
    if _LOADED is not None:
        if _LOADED.kind != kind:
            raise InputError(f"a {_LOADED.kind} runtime is already loaded in this process; cannot load {kind}")
        return _LOADED
    try:
        import pythonnet
    except ImportError:
        raise InputError(f"pythonnet is not installed, and the TorchSharp backend drives .NET through it: "
                         f"{PYTHONNET_HINT}") from None
    rt = select(kind, dotnet_root)
    try:
        if kind == "coreclr":
            cdir = Path(config_dir) if config_dir else Path(tempfile.mkdtemp(prefix="optcheck-rc-"))
            cfg = write_runtimeconfig(rt, cdir)
            pythonnet.load("coreclr", runtime_config=str(cfg), dotnet_root=rt.root)
        else:
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # clr_loader warns about Mono < 6.12; 6.8 works here
                pythonnet.load("mono")
        import clr  # noqa: F401  (initialises Python.NET in the runtime)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - any loader failure becomes one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"cannot load the .NET runtime {rt.describe()}: {msg}; "
                         f"{CORECLR_HINT if kind == 'coreclr' else MONO_HINT}") from None
    _LOADED = rt
    return rt


def runtime_description() -> str:
    """The loaded runtime as .NET describes itself, e.g. ".NET Core 3.1.23" or "Mono 6.8.0.105"."""
    from System import Environment, Type
    mono = Type.GetType("Mono.Runtime")
    if mono is not None:
        from System.Reflection import BindingFlags
        m = mono.GetMethod("GetDisplayName", BindingFlags.NonPublic | BindingFlags.Static)
        if m is not None:
            return "Mono " + str(m.Invoke(None, None))
        return "Mono"
    try:
        from System.Runtime.InteropServices import RuntimeInformation
        return str(RuntimeInformation.FrameworkDescription)
    except ImportError:
        return f".NET {Environment.Version}"


def load_assembly(path: str | os.PathLike, option: str = "--dotnet-assembly"):
    """Load the worker assembly at ``path`` (``Assembly.LoadFrom``) into the loaded runtime.

    Raises:
        InputError: the file is missing, or the runtime cannot load it (not a .NET
            assembly, built for a newer runtime, a dependency missing).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise InputError(f"{option} {path}: no such file; build the worker assembly first "
                         f"(see dotnet/README.md)")
    if _LOADED is None:
        raise InputError("no .NET runtime loaded (call optcheck.torchsharp_bridge.runtime.load first)")
    from System.Reflection import Assembly
    try:
        return Assembly.LoadFrom(str(p.resolve()))
    except Exception as e:  # noqa: BLE001 - BadImageFormatException, FileLoadException, ...
        name = e.GetType().FullName if hasattr(e, "GetType") else type(e).__name__
        msg = getattr(e, "Message", None) or str(e)
        raise InputError(f"{option} {path}: the {_LOADED.kind} runtime cannot load it ({name}: "
                         f"{str(msg).splitlines()[0]})") from None


def native_library_hint(message: str) -> str:
    """One line for a ``DllNotFoundException``: which native library and how to make it
    findable with Python as the host (``docs/dotnet.md``)."""
    m = re.search(r"shared library '([^']+)'", message) or re.search(r"'([^']+)'", message)
    lib = m.group(1) if m else "a native library"
    return (f"the .NET worker could not load native library {lib}: with Python as the host it must lie beside "
            f"the assembly that P/Invokes it (TorchSharp: LibTorchSharp beside TorchSharp.dll) or be on "
            f"LD_LIBRARY_PATH before the worker starts")


if __name__ == "__main__":  # pragma: no cover - a manual probe
    print(select(sys.argv[1] if len(sys.argv) > 1 else "coreclr").describe())
