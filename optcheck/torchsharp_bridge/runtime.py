"""Choose a .NET runtime and load it into this process with pythonnet. Torch-free.

CoreCLR is the default: TorchSharp users run .NET 8 or newer, and this module
rolls forward to the newest ``Microsoft.NETCore.App`` found
(``optcheck.torchsharp_bridge.discovery``: ``$DOTNET_ROOT``, ``dotnet``, the usual
folders, PyPI's ``dotnetcore2``) with a generated ``runtimeconfig.json`` asking for
``rollForward: LatestMajor`` (``docs/dotnet.md``); clr_loader would spell the
``netcoreapp3.1`` TFM ``net3.1``, and does not decide invariant globalization.
Mono (Debian ``mono-runtime`` + ``libmono-2.0-dev`` + ``mono-devel``) is the
alternative.

A runtime can be loaded once per process (``pythonnet.load`` before ``import
clr``; ~0.4 s). Everything that cannot be found or loaded raises
:class:`optcheck.errors.InputError` with one line naming what is missing and how
to get it — never a traceback, never a crash: a Mono without the netstandard
facade would otherwise abort the process (SIGABRT) inside ``pythonnet.load``.

Also what a loaded runtime's objects say of themselves: an exception's .NET type and
message (:func:`dotnet_type_name`, :func:`dotnet_message`) and an assembly's target
framework read from its bytes (:func:`target_framework`).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from optcheck.errors import InputError
from optcheck.torchsharp_bridge.discovery import (CORECLR_HINT, DEFAULT_ROOTS, MONO_HINT, NETCORE_APP,
                                                  PYTHONNET_HINT, DotnetRuntime, coreclr_runtimes, icu_available,
                                                  mono_facade, mono_runtime, newest)

KINDS = ("coreclr", "mono")


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
    # Written beside and renamed over: another process reading this folder's config (two
    # workers, a user's own ``dotnet exec``) sees the old file or the new one, never half.
    fd, tmp = tempfile.mkstemp(prefix=".runtimeconfig-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(cfg, indent=2))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
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
            where = str(dotnet_root) if dotnet_root else "DOTNET_ROOT, dotnet on PATH, " + ", ".join(DEFAULT_ROOTS) + \
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
            if config_dir:
                cdir = Path(config_dir)
            else:  # hostfxr reads it while loading; removed when the process exits (not left in /tmp)
                cdir = Path(tempfile.mkdtemp(prefix="optcheck-rc-"))
                atexit.register(shutil.rmtree, cdir, True)
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


class StaticMethods:
    """The static methods of a .NET type that its assembly does not export, called through reflection.

    optcheck's C# is ``internal`` in every assembly that compiles it in (``OptCheck.Probe.Driver``,
    ``Bench``, ``ValueStats``: two projects that both compile the sources must not clash, CS0436), so
    pythonnet cannot import it; ``StaticMethods(t).ForType("X")`` calls ``t.ForType("X")`` through
    ``MethodInfo.Invoke`` (a Python int, float or bool is first made the parameter's own primitive type:
    CoreCLR's pythonnet would pass it boxed as a ``PyInt``, which ``Invoke`` refuses), and the
    objects it returns are called as usual (pythonnet binds the public members of any runtime type). An
    exception the method throws is raised as itself, not as the ``TargetInvocationException`` around it.
    Overloaded names are not supported (none of optcheck's are).
    """

    def __init__(self, dotnet_type) -> None:
        self.type = dotnet_type
        self._methods: dict[str, object] = {}

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        method = self._methods.get(name)
        if method is None:
            from System.Reflection import BindingFlags

            method = self.type.GetMethod(name, BindingFlags.Public | BindingFlags.NonPublic | BindingFlags.Static)
            if method is None:
                raise AttributeError(f"{self.type.FullName} has no static method {name}")
            self._methods[name] = method

        params = [str(p.ParameterType.FullName) for p in method.GetParameters()]

        def call(*args):
            if len(args) != len(params):
                raise TypeError(f"{self.type.FullName}.{name} takes {len(params)} arguments ({len(args)} given)")
            args = [_primitive(a, p) for a, p in zip(args, params)]
            try:
                return method.Invoke(None, args)
            except Exception as e:  # noqa: BLE001 - unwrap TargetInvocationException, keep any other
                inner = getattr(e, "InnerException", None)
                if inner is not None and str(e.GetType().FullName) == "System.Reflection.TargetInvocationException":
                    raise inner from None
                raise

        return call


def _primitive(value, type_name: str):
    """``value`` as the .NET primitive ``type_name`` when it is a Python number or bool, else itself."""
    if isinstance(value, (bool, int, float)):
        import System

        conv = {"System.Int32": System.Int32, "System.Int64": System.Int64, "System.Double": System.Double,
                "System.Single": System.Single, "System.Boolean": System.Boolean}.get(type_name)
        if conv is not None:
            return conv(value)
    return value


def internal_type(assembly, full_name: str) -> StaticMethods | None:
    """:class:`StaticMethods` of the type ``full_name`` in ``assembly`` (a ``System.Reflection.Assembly``,
    e.g. what :func:`load_assembly` returned), public or not; None when the assembly has no such type."""
    t = assembly.GetType(full_name)
    return None if t is None else StaticMethods(t)


def loaded_internal_type(full_name: str) -> StaticMethods:
    """:func:`internal_type` of ``full_name`` in the first loaded assembly that holds it (benchmarks).

    Raises:
        InputError: no loaded assembly holds it.
    """
    from System import AppDomain

    for assembly in AppDomain.CurrentDomain.GetAssemblies():
        found = internal_type(assembly, full_name)
        if found is not None:
            return found
    raise InputError(f"no loaded .NET assembly holds {full_name}")

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


def dotnet_type_name(exc: BaseException) -> str | None:
    """The .NET type full name of an exception that came out of .NET, else None."""
    get_type = getattr(exc, "GetType", None)
    if get_type is None or not hasattr(exc, "StackTrace"):
        return None
    try:
        return str(get_type().FullName)
    except Exception:  # noqa: BLE001
        return None


def dotnet_message(exc: BaseException) -> str:
    msg = getattr(exc, "Message", None)
    return str(msg) if msg is not None else str(exc)


_FRAMEWORK_RE = re.compile(rb"(\.NET(?:CoreApp|Framework|Standard),Version=v[0-9.]+)")


def target_framework(path: Path) -> str | None:
    """The ``TargetFrameworkAttribute`` an assembly was built for (``.NETCoreApp,Version=v8.0``), read from
    its bytes without loading it; None when the file has none (``mcs`` writes none) or cannot be read."""
    try:
        m = _FRAMEWORK_RE.search(path.read_bytes())
    except OSError:
        return None
    return m.group(1).decode("ascii") if m else None
