"""Load-check TorchSharp's native library before TorchSharp's type initializer does.

When ``libLibTorchSharp.so`` cannot be loaded, TorchSharp's static constructor
throws ``TypeInitializationException`` and its text blames a missing
``libtorch-cpu-linux-x64`` package reference, whatever the loader's reason was.
The usual reason on Linux is a symbol version: TorchSharp 0.107.0's
``libLibTorchSharp.so`` needs ``GLIBCXX_3.4.32`` (libstdc++ of GCC 13.2), Debian 12
and Ubuntu 22.04 ship up to ``GLIBCXX_3.4.30`` (``docs/torchsharp.md``, "The native
library"). This module dlopens the library itself (``ctypes``, ``RTLD_NOW``), and on
failure turns the dynamic loader's message into one line that names what is missing,
what the system provides (read from the providing library's ELF version definitions
with pyelftools) and what would fix it.

Torch-free and .NET-free. ``python -m optcheck.torchsharp_bridge.native PATH`` prints
the verdict for one library (``optcheck doctor`` runs it in a subprocess so that its
own process loads no libtorch).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from pathlib import Path

#: File names of the native LibTorchSharp, per platform.
NATIVE_NAMES = ("libLibTorchSharp.so", "libLibTorchSharp.dylib", "LibTorchSharp.dll")

#: libstdc++ symbol versions and the GCC release that introduced them (libstdc++ manual,
#: "ABI Policy and Guidelines", section "History": abi.versioning.history).
GLIBCXX_GCC = {"GLIBCXX_3.4.28": "GCC 10.1", "GLIBCXX_3.4.29": "GCC 11.1", "GLIBCXX_3.4.30": "GCC 12.1",
               "GLIBCXX_3.4.31": "GCC 13.1", "GLIBCXX_3.4.32": "GCC 13.2", "GLIBCXX_3.4.33": "GCC 14.1"}

# glibc's dlerror texts (elf/dl-version.c, elf/dl-load.c)
_VERSION_RE = re.compile(r"^(?P<lib>.+?): version [`'](?P<ver>[^'`]+)' not found \(required by (?P<by>[^)]+)\)")
_MISSING_RE = re.compile(r"^(?P<lib>[^:]+): cannot open shared object file")
_MAX_PRELOADS = 16


def find_native(folder: str | os.PathLike) -> Path | None:
    """The native LibTorchSharp that TorchSharp would load for an assembly in ``folder``:
    beside it (a build output), else under ``runtimes/<rid>/native`` (a NuGet layout).
    None when there is none (the stand-in worker of the tests has none)."""
    base = Path(folder)
    cands = [base / n for n in NATIVE_NAMES]
    runtimes = base / "runtimes"
    if runtimes.is_dir():
        cands += sorted(runtimes.glob("*/native/" + NATIVE_NAMES[0]))
        cands += sorted(p for n in NATIVE_NAMES[1:] for p in runtimes.glob(f"*/native/{n}"))
    return next((c for c in cands if c.is_file()), None)


def version_definitions(path: str | os.PathLike) -> list[str]:
    """The symbol versions an ELF shared library defines (its ``.gnu.version_d``), e.g.
    ``["libstdc++.so.6", "GLIBCXX_3.4", ..., "GLIBCXX_3.4.30", "CXXABI_1.3", ...]``;
    [] when it has none or cannot be read."""
    try:
        from elftools.elf.elffile import ELFFile
        from elftools.elf.gnuversions import GNUVerDefSection
    except ImportError:  # pyelftools is in optcheck's torchsharp extra
        return []
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            out = []
            for sec in elf.iter_sections():
                if isinstance(sec, GNUVerDefSection):
                    for _verdef, auxs in sec.iter_versions():
                        for aux in auxs:
                            out.append(aux.name)
                            break  # the first aux entry is the version's own name; the rest are parents
            return out
    except Exception:  # noqa: BLE001 - OSError, ELFError, ...: not readable as ELF
        return []


def _key(version: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", version.rpartition("_")[2] or version))


def highest_provided(library: str | os.PathLike, like: str) -> str | None:
    """The highest version ``library`` defines with the same prefix as ``like``
    (``GLIBCXX_3.4.32`` -> the highest ``GLIBCXX_*``), or None."""
    prefix = like.rpartition("_")[0]
    if not prefix:
        return None
    same = [v for v in version_definitions(library) if v.rpartition("_")[0] == prefix]
    return max(same, key=_key) if same else None


def explain(message: str, path: str | os.PathLike) -> str:
    """One line from the loader's message for ``path`` that failed to load: what it needs,
    what the system provides, and what would fix it."""
    first = message.strip().splitlines()[0] if message.strip() else "unknown reason"
    m = _VERSION_RE.match(first)
    if m:
        lib, ver = m.group("lib"), m.group("ver")
        gcc = GLIBCXX_GCC.get(ver)
        need = f"needs {ver}" + (f" (libstdc++ of {gcc} or newer)" if gcc else "")
        have = highest_provided(lib, ver)
        has = f"{lib} provides up to {have}" if have else f"{lib} does not provide it"
        fix = ("install a newer libstdc++6 (Debian 13, Ubuntu 24.04) or put a newer libstdc++.so.6 on "
               "LD_LIBRARY_PATH" if ver.startswith("GLIBCXX_") else
               f"install a {Path(lib).name} that defines {ver}, or put one on LD_LIBRARY_PATH")
        return f"the native library {path} cannot be loaded: {need}; {has}; {fix}"
    m = _MISSING_RE.match(first)
    if m:
        return (f"the native library {path} cannot be loaded: it needs {m.group('lib')}, which is neither beside "
                f"it nor on the loader path; restore the package's native files or add their folder to "
                f"LD_LIBRARY_PATH")
    return f"the native library {path} cannot be loaded: {first}"


def load_check(path: str | os.PathLike) -> str | None:
    """dlopen ``path`` (``RTLD_NOW``) as TorchSharp would, after the libraries beside it
    that it needs (TorchSharp loads libtorch first, the same way). Returns None when it
    loads, else the one-line explanation (:func:`explain`). The library stays loaded."""
    p = Path(path).resolve()   # a bare name would make dlopen search the loader path instead
    mode = getattr(os, "RTLD_NOW", 2) | getattr(os, "RTLD_GLOBAL", 0)
    for _ in range(_MAX_PRELOADS):
        try:
            ctypes.CDLL(str(p), mode=mode)
            return None
        except OSError as e:
            msg = str(e)
        dep = _MISSING_RE.match(msg.strip().splitlines()[0] if msg.strip() else "")
        beside = p.parent / dep.group("lib") if dep else None
        if beside is None or not beside.is_file():
            return explain(msg, p)
        try:  # a dependency that lies beside it: load it first, as TorchSharp does for libtorch
            ctypes.CDLL(str(beside), mode=mode)
        except OSError as e:
            return explain(str(e), beside)
    return explain(msg, p)


def check_folder(folder: str | os.PathLike) -> tuple[Path | None, str | None]:
    """``(native library, problem)`` for the assembly folder ``folder``: the library
    :func:`find_native` finds (None: nothing to check) and :func:`load_check`'s verdict."""
    lib = find_native(folder)
    return lib, (load_check(lib) if lib is not None else None)


def main(argv: list[str] | None = None) -> int:
    """``python -m optcheck.torchsharp_bridge.native PATH``: ``ok PATH`` and exit 0, or the
    explanation and exit 1. PATH is a library or an assembly folder."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m optcheck.torchsharp_bridge.native LIBRARY|FOLDER", file=sys.stderr)
        return 2
    target = Path(args[0])
    if target.is_dir():
        lib, problem = check_folder(target)
        if lib is None:
            print(f"no native LibTorchSharp in {target}")
            return 1
    else:
        lib, problem = target, load_check(target)
    print(problem or f"ok {lib}")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
