"""Where TorchSharp's libtorch comes from, and which libtorch a process actually loaded. Torch-free
(it never imports torch: it finds the files of a Python install of PyTorch, it does not load its Python).

NuGet's ``TorchSharp-cpu`` ships libtorch beside ``libLibTorchSharp.so``. A ``libLibTorchSharp.so``
built against a Python install's libtorch (TorchSharp's loader message names "TorchSharp over a
Python install of PyTorch" as a use case; ``docs/torchsharp.md``, "Real TorchSharp here") has none
beside it and no RUNPATH: it needs ``libtorch.so``, ``libtorch_cpu.so`` and ``libc10.so`` from
somewhere else. :func:`resolve` finds that folder — ``$OPTCHECK_LIBTORCH``, else the ``torch/lib``
of this interpreter's PyTorch — and :func:`preload` loads it (``RTLD_GLOBAL``) before .NET does:
the dynamic loader then satisfies ``libLibTorchSharp.so``'s ``DT_NEEDED`` entries by soname from
the libraries already loaded, so no ``LD_LIBRARY_PATH`` is needed before the process starts
(``libtorch.so`` has ``RUNPATH $ORIGIN``: it brings ``libtorch_cpu.so`` and ``libc10.so`` from its
own folder). Checked on this project's machine kind: TorchSharp 0.107.0 over ``torch==2.13.0``.

TorchSharp's ``torch.__version__`` is a constant of the managed assembly (``2.10.0.0`` for 0.107.0,
the libtorch NuGet pairs it with), not the library loaded: :func:`loaded` reads the process's own
memory map for the ``libtorch_cpu`` it holds and :func:`version_of` names that library's release
from the files around it (a PyTorch wheel's ``torch/version.py``, a libtorch archive's
``build-version``, the NuGet package folder's version).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
from pathlib import Path

from optcheck.errors import InputError
from optcheck.torchsharp_bridge import native

#: ``$OPTCHECK_LIBTORCH``: a folder holding ``libtorch.so`` (e.g. a ``torch/lib`` or a libtorch archive's ``lib``).
ENV = "OPTCHECK_LIBTORCH"
#: The libraries of libtorch that LibTorchSharp links (``DT_NEEDED``), in load order.
LIBTORCH_NAMES = ("libc10.so", "libtorch_cpu.so", "libtorch.so")
_PY_VERSION_RE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)
_NUGET_RE = re.compile(r"/libtorch-[a-z0-9-]+/(\d+\.\d+\.\d+[^/]*)/", re.I)


def python_torch_lib() -> Path | None:
    """``torch/lib`` of the PyTorch this interpreter would import (found, not imported); None without one."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        lib = Path(loc) / "lib"
        if (lib / "libtorch.so").is_file():
            return lib
    return None


#: What to say where pyelftools is missing: without it the libtorch a native library needs is unknown.
NO_ELFTOOLS = ("pyelftools is not installed, and optcheck reads with it which libtorch {lib} needs (to load "
               "that libtorch first, as TorchSharp does); install optcheck's torchsharp extra: "
               "pip install 'optcheck[torchsharp]' (or pip install pyelftools)")


def has_elftools() -> bool:
    """Whether pyelftools (optcheck's ``torchsharp`` extra) can be imported here."""
    try:
        import elftools.elf.elffile  # noqa: F401
    except ImportError:
        return False
    return True


def needed(native: str | os.PathLike) -> list[str]:
    """The ``DT_NEEDED`` sonames of an ELF library (pyelftools); [] when it has none, is not ELF, or
    pyelftools is missing (:func:`has_elftools` tells which)."""
    try:
        from elftools.elf.dynamic import DynamicSection
        from elftools.elf.elffile import ELFFile
    except ImportError:
        return []
    try:
        with open(native, "rb") as f:
            return [t.needed for sec in ELFFile(f).iter_sections() if isinstance(sec, DynamicSection)
                    for t in sec.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    except Exception:  # noqa: BLE001 - OSError, ELFError: not readable as ELF
        return []


def needs_external(native: str | os.PathLike) -> bool:
    """Whether ``native`` (a ``libLibTorchSharp.so``) links libtorch that does not lie beside it."""
    folder = Path(native).parent
    return any(n in LIBTORCH_NAMES and not (folder / n).exists() for n in needed(native))


def resolve() -> tuple[Path | None, str]:
    """(the libtorch folder to load, where it came from): ``$OPTCHECK_LIBTORCH``, else the first folder of
    ``LD_LIBRARY_PATH`` holding ``libtorch.so``, else this interpreter's ``torch/lib``; (None, why not)."""
    env = os.environ.get(ENV)
    if env:
        folder = Path(env).expanduser()
        if (folder / "libtorch.so").is_file():
            return folder.resolve(), f"${ENV}"
        return None, f"${ENV}={env} holds no libtorch.so"
    for entry in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if entry and (Path(entry) / "libtorch.so").is_file():
            return Path(entry).resolve(), "LD_LIBRARY_PATH"
    lib = python_torch_lib()
    if lib is not None:
        return lib.resolve(), "this Python's torch"
    return None, (f"no libtorch: this Python has no torch (pip install torch==<the version LibTorchSharp was built "
                  f"against>), and ${ENV} is not set to a folder holding libtorch.so")


def preload(folder: str | os.PathLike) -> str | None:
    """Load libtorch from ``folder`` into this process (``RTLD_NOW | RTLD_GLOBAL``), so that a
    LibTorchSharp loaded afterwards binds to it. Returns None, or the loader's first line."""
    mode = getattr(os, "RTLD_NOW", 2) | getattr(os, "RTLD_GLOBAL", 0)
    for name in LIBTORCH_NAMES:
        path = Path(folder) / name
        if not path.exists():
            continue
        try:
            ctypes.CDLL(str(path), mode=mode)
        except OSError as e:
            return (str(e).strip().splitlines() or [type(e).__name__])[0]
    return None


def version_of(folder: str | os.PathLike) -> str | None:
    """The release of the libtorch in ``folder`` from the files around it: ``../version.py`` (a PyTorch
    wheel's ``torch/lib``: ``2.13.0+cpu``), ``../build-version`` (a libtorch archive's ``lib``), or the
    version folder of a NuGet ``libtorch-*`` package in its path; None when none says."""
    folder = Path(folder)
    try:
        m = _PY_VERSION_RE.search((folder.parent / "version.py").read_text(encoding="utf-8"))
        if m:
            return m.group(1)
    except OSError:
        pass
    try:
        text = (folder.parent / "build-version").read_text(encoding="utf-8").strip()
        if text:
            return text.splitlines()[0]
    except OSError:
        pass
    m = _NUGET_RE.search(str(folder).replace(os.sep, "/") + "/")
    return m.group(1) if m else None


def loaded(maps: str = "/proc/self/maps") -> Path | None:
    """The ``libtorch_cpu`` file this process has mapped (its real path); None when none is, or the
    process map cannot be read (not Linux)."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                if re.search(r"/libtorch_cpu\.(so|dylib)(\.[0-9.]+)?$", path):
                    return Path(path)
    except OSError:
        return None
    return None


def loaded_versions() -> dict[str, str]:
    """``{"libtorch": release, "libtorch_lib": folder}`` of the libtorch this process has loaded, for a
    run's versions; {} when none is mapped, no ``libtorch`` when no file around it names its release (a NuGet
    build's output folder: TorchSharp's own constant is then the best there is)."""
    lib = loaded()
    if lib is None:
        return {}
    release = version_of(lib.parent)
    return {"libtorch_lib": str(lib.parent), **({"libtorch": release} if release else {})}


def load_native(folder: Path) -> None:
    """Load TorchSharp's native library of the assembly folder ``folder`` before .NET does, and libtorch first
    where it does not lie beside it (:func:`resolve`: ``$OPTCHECK_LIBTORCH``, a folder
    of ``LD_LIBRARY_PATH``, or this Python's ``torch/lib``); a folder without one (a stand-in) is left alone.

    Raises:
        InputError: one line: no libtorch for a LibTorchSharp that needs one, or why either cannot be loaded
            (TorchSharp's own type initializer would blame a missing package reference instead).
    """
    lib = native.find_native(folder)
    if lib is None:
        return
    where = ""
    if needs_external(lib):
        lt, source = resolve()
        if lt is None:
            raise InputError(f"{lib} needs libtorch (libtorch.so, libtorch_cpu.so, libc10.so) and none lies beside "
                             f"it: {source}")
        err = preload(lt)
        where = f"libtorch {version_of(lt) or '?'} from {source} ({lt})"
        if err:
            raise InputError(f"{where} cannot be loaded: {err}")
    problem = native.load_check(lib)
    if problem and not where and not has_elftools():
        # needed() could not read which libtorch it needs: none was loaded first, and the loader's
        # "needs libc10.so" would blame the library; what is missing is pyelftools
        raise InputError(f"the native library {lib} cannot be loaded: " + NO_ELFTOOLS.format(lib=lib.name))
    if problem and where and "undefined symbol" in problem:
        problem += (f"; it was built against another libtorch than {where}: rebuild it against that one, or set "
                    f"${ENV} to the libtorch it was built against")
    if problem:
        raise InputError(problem)
