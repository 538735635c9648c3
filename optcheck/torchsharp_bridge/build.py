"""Build the TorchSharp worker assembly (``dotnet/Worker``) for one TorchSharp, and cache it.
Torch-free.

``--torchsharp VERSION`` builds ``dotnet/Worker/OptCheck.Worker.csproj`` against the NuGet
package ``TorchSharp-cpu`` at exactly VERSION (``[VERSION]``: NuGet may not substitute a
nearby version) with ``dotnet build``; ``--torchsharp PATH`` builds it
against a local TorchSharp build (``PATH`` = its ``TorchSharp.dll`` or the folder holding it,
with the native ``LibTorchSharp`` beside it), with Mono's ``mcs`` where there is no .NET SDK
(:mod:`optcheck.torchsharp_bridge.mcs_build`). Each build lives in its own folder of the cache,
``$OPTCHECK_CACHE/torchsharp/<key>/`` (default ``~/.cache/optcheck/torchsharp/<key>/``; key =
the version, or ``local-<hash of the path>``): ``src/`` (a copy of ``dotnet/Worker`` and
``dotnet/Probe``), ``bin/OptCheck.Worker.dll`` with TorchSharp and its native libraries beside
it, ``build.log`` and ``build.json``. A build is reused while the sources (and, for a local
TorchSharp, its ``TorchSharp.dll``) are unchanged. ``build.json`` records the version NuGet
actually restored (read from the restore's ``obj/project.assets.json``).

The C# sources come from the checkout's ``dotnet/`` folder, or, in an installed wheel, from
``optcheck/dotnet_src/`` (copied there by ``setup.py``'s ``build_py``: :func:`sources_dir`). The first
build says on stderr what it restores and compiles, and how long it took (the first restore downloads ~1.4 GB).

Every failure is one line naming the cause and the command to run
(:class:`optcheck.errors.InputError`, exit code 2): no ``dotnet`` on PATH (nor ``mcs`` for a local
netstandard TorchSharp), no SDK or one older than 8, a version NuGet does not have (NU1101 / NU1102:
the version asked for and what each source offers), no network (NU1301), a compile error (the first
``error`` line, the log's path and the command to re-run it by hand).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from optcheck.errors import InputError
from optcheck.torchsharp_bridge import mcs_build
from optcheck.torchsharp_bridge.msbuild import PACKAGE, explain_failure, restored_versions

#: The ITrainer in the worker assembly (dotnet/Worker/Trainer.cs).
TRAINER_TYPE = "OptCheck.Worker.GptTrainer"
ASSEMBLY = "OptCheck.Worker.dll"
#: Used when neither --torchsharp nor $OPTCHECK_TORCHSHARP is given: the newest TorchSharp-cpu on
#: NuGet when this was written (libtorch 2.10.0; 0.99.6, the version the recorded fixtures come
#: from, is no longer served).
DEFAULT_VERSION = "0.107.0"
MIN_SDK_MAJOR = 8
BUILD_TIMEOUT_S = 3600  # the first restore downloads libtorch (hundreds of MB)

SDK_HINT = ("install the .NET SDK 8 or newer (https://learn.microsoft.com/dotnet/core/install/linux, "
            "e.g. `sudo apt-get install dotnet-sdk-8.0`)")

_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+(?:[-.][0-9A-Za-z.-]+)?$")
_PACKAGED_DIR = Path(__file__).resolve().parents[1] / "dotnet_src"  # an installed wheel (setup.py build_py)
_CHECKOUT_DIR = Path(__file__).resolve().parents[2] / "dotnet"       # a checkout / editable install


def sources_dir() -> Path:
    """Where the C# sources are: ``optcheck/dotnet_src`` in an installed wheel, else the checkout's
    ``dotnet/`` (both hold ``Worker/`` and ``Probe/``)."""
    return _PACKAGED_DIR if (_PACKAGED_DIR / "Worker").is_dir() else _CHECKOUT_DIR


_DOTNET_DIR = sources_dir()


def sources_arg() -> str:
    """:func:`sources_dir` as ``python -m optcheck.torchsharp_bridge.build --sources`` prints it, for
    ``dotnet build -p:OptCheckSources=VALUE``: with a trailing ``/``. The .NET SDK 10.0.401 CLI misreads
    ``-p:Name=VALUE`` when VALUE ends in ``/dotnet`` (MSB1009 "Project file does not exist", the checkout's
    folder is named ``dotnet``); the same folder with a trailing ``/`` is taken (docs/torchsharp.md)."""
    return str(sources_dir()).rstrip("/") + "/"


@dataclass(frozen=True)
class Spec:
    """A parsed ``--torchsharp`` value.

    Attributes:
        text: the value as given.
        version: the NuGet version (``kind == "version"``), else None.
        dll: the local ``TorchSharp.dll`` (``kind == "path"``), else None.
    """

    text: str
    version: str | None = None
    dll: Path | None = None

    @property
    def kind(self) -> str:
        return "version" if self.version else "path"

    @property
    def key(self) -> str:
        """The cache folder name: the version, or ``local-`` + 12 hex of the DLL's path."""
        if self.version:
            return self.version
        return "local-" + hashlib.sha256(str(self.dll).encode()).hexdigest()[:12]


def cache_root() -> Path:
    """``$OPTCHECK_CACHE/torchsharp`` or ``~/.cache/optcheck/torchsharp``."""
    base = os.environ.get("OPTCHECK_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "optcheck") / "torchsharp"


def default_spec() -> str:
    """``$OPTCHECK_TORCHSHARP`` (a version or a path), else :data:`DEFAULT_VERSION`."""
    return os.environ.get("OPTCHECK_TORCHSHARP") or DEFAULT_VERSION


def _native_beside(folder: Path) -> list[Path]:
    names = ("libLibTorchSharp.so", "libLibTorchSharp.dylib", "LibTorchSharp.dll")
    return [folder / n for n in names if (folder / n).exists()]


def parse_spec(spec: str) -> Spec:
    """Parse ``--torchsharp``: a NuGet version (``0.105.0``, ``0.106.0-preview1``) or a path to
    a local build's ``TorchSharp.dll`` (or its folder).

    Raises:
        InputError: an empty value, a path that does not exist, a folder without
            ``TorchSharp.dll``, or a local build without its native LibTorchSharp beside it.
    """
    text = (spec or "").strip()
    if not text:
        raise InputError("--torchsharp: expected a TorchSharp version such as 0.105.0 or a path to TorchSharp.dll")
    if _VERSION_RE.match(text):
        return Spec(text, version=text)
    p = Path(text).expanduser()
    if not p.exists():
        raise InputError(f"--torchsharp {text}: neither a TorchSharp version (like {DEFAULT_VERSION}) nor an existing "
                         f"path to a local build's TorchSharp.dll")
    dll = p / "TorchSharp.dll" if p.is_dir() else p
    if not dll.is_file() or dll.name.lower() != "torchsharp.dll":
        raise InputError(f"--torchsharp {text}: no TorchSharp.dll there; pass the TorchSharp.dll of a local "
                         f"TorchSharp build (or the folder holding it)")
    dll = dll.resolve()
    if not _native_beside(dll.parent):
        raise InputError(f"--torchsharp {text}: no native LibTorchSharp (libLibTorchSharp.so / .dylib / "
                         f"LibTorchSharp.dll) beside {dll}; TorchSharp loads it from beside TorchSharp.dll, so "
                         f"copy it there from the same build")
    return Spec(text, dll=dll)


# -- sources and the cache -------------------------------------------------------------------

def source_files(dotnet_dir: Path = _DOTNET_DIR) -> list[Path]:
    """The files a build copies: ``Worker/*.csproj``, ``Worker/*.cs``, ``Probe/*.cs`` and the user contract
    ``Contract/*.cs``, ``Contract/TorchSharp/*.cs``.

    Raises:
        InputError: the ``dotnet/`` sources are not there (optcheck not run from a checkout).
    """
    files = sorted((dotnet_dir / "Worker").glob("*.csproj")) + sorted((dotnet_dir / "Worker").glob("*.cs")) \
        + sorted((dotnet_dir / "Probe").glob("*.cs")) + sorted((dotnet_dir / "Contract").glob("*.cs")) \
        + sorted((dotnet_dir / "Contract" / "TorchSharp").glob("*.cs"))
    if not any(f.suffix == ".csproj" for f in files):
        raise InputError(f"the TorchSharp worker sources are not at {dotnet_dir}/Worker (an installed optcheck "
                         f"has them in optcheck/dotnet_src, a checkout in dotnet/); reinstall optcheck "
                         f"(`pip install --force-reinstall optcheck`) or run it from a checkout")
    return files


def source_hash(dotnet_dir: Path = _DOTNET_DIR) -> str:
    """SHA-256 over the relative paths and contents of :func:`source_files`."""
    h = hashlib.sha256()
    for f in source_files(dotnet_dir):
        h.update(str(f.relative_to(dotnet_dir)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _dll_stamp(dll: Path) -> str:
    return f"{dll.stat().st_size}:{dll.stat().st_mtime_ns}"


@contextlib.contextmanager
def _locked(folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # two soaks building the same version wait for each other
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_record(folder: Path) -> dict | None:
    """``build.json`` of a cached build; None when missing, unreadable or not a JSON object."""
    try:
        rec = json.loads((folder / "build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def _is_current(rec: dict | None, spec: Spec, src_hash: str, folder: Path) -> bool:
    if not rec or rec.get("source_sha256") != src_hash or not (folder / "bin" / ASSEMBLY).is_file():
        return False
    if spec.dll is not None:
        return rec.get("torchsharp_dll") == str(spec.dll) and rec.get("dll_stamp") == _dll_stamp(spec.dll)
    return rec.get("requested", rec.get("torchsharp")) == spec.version


# -- running the SDK -------------------------------------------------------------------------

def find_sdk(spec_text: str) -> tuple[str, str]:
    """The ``dotnet`` command and the newest SDK version it has.

    Raises:
        InputError: no ``dotnet`` on PATH, no SDK, or only SDKs older than 8.
    """
    cli = shutil.which("dotnet")
    if cli is None:
        raise InputError(f"--torchsharp {spec_text}: building the TorchSharp worker needs the .NET SDK, and `dotnet` "
                         f"is not on PATH; {SDK_HINT}, then run the soak again")
    try:
        res = subprocess.run([cli, "--list-sdks"], capture_output=True, text=True, timeout=60, env=_env())
        lines = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]
    except (OSError, subprocess.SubprocessError) as e:
        raise InputError(f"--torchsharp {spec_text}: `{cli} --list-sdks` failed ({e}); {SDK_HINT}") from None
    versions = [ln.split()[0] for ln in lines if re.match(r"\d+\.\d+", ln)]
    if not versions:
        raise InputError(f"--torchsharp {spec_text}: `{cli}` has no .NET SDK (only runtimes: `dotnet --list-sdks` "
                         f"is empty); {SDK_HINT}")
    newest = max(versions, key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)[:3]))
    if int(newest.split(".")[0]) < MIN_SDK_MAJOR:
        raise InputError(f"--torchsharp {spec_text}: the worker targets net8.0 and the newest .NET SDK here is "
                         f"{newest}; {SDK_HINT}")
    return cli, newest


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
    env.setdefault("DOTNET_NOLOGO", "1")
    env.setdefault("DOTNET_SKIP_FIRST_TIME_EXPERIENCE", "1")
    return env


def build_command(cli: str, project: Path, out: Path, spec: Spec) -> list[str]:
    """The ``dotnet build`` command line for ``spec``."""
    cmd = [cli, "build", str(project), "-c", "Release", "-o", str(out), "--nologo"]
    if spec.version:
        cmd.append(f"-p:TorchSharpVersion={spec.version}")
    else:
        cmd.append(f"-p:TorchSharpDll={spec.dll}")
    return cmd


def _copy_sources(src: Path, dotnet_dir: Path) -> Path:
    if src.exists():
        shutil.rmtree(src)
    for f in source_files(dotnet_dir):
        dest = src / f.relative_to(dotnet_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
    return next((src / "Worker").glob("*.csproj"))


def _say(msg: str) -> None:
    print(f"optcheck: {msg}", file=sys.stderr, flush=True)


def ensure_worker_assembly(spec: str | None = None, *, rebuild: bool = False, dotnet_dir: Path | None = None,
                           say=_say) -> Path:
    """The worker assembly (``…/bin/OptCheck.Worker.dll``) built for ``spec`` — a TorchSharp
    version or a path to a local ``TorchSharp.dll`` (None: :func:`default_spec`) — building it
    with ``dotnet build`` unless the cache holds a build of the same sources.

    Returns:
        Path of ``OptCheck.Worker.dll``; ``TorchSharp.dll`` and the native libraries lie beside it.

    Raises:
        InputError: one line naming the cause and the command to run (see module docstring).

    ``say`` gets one line before a build (what is restored and compiled) and one after (how long it took).
    """
    dotnet_dir = dotnet_dir or sources_dir()
    sp = parse_spec(spec or default_spec())
    src_hash = source_hash(dotnet_dir)
    folder = cache_root() / sp.key
    with _locked(folder):
        rec = _read_record(folder)
        if not rebuild and _is_current(rec, sp, src_hash, folder):
            return folder / "bin" / ASSEMBLY
        try:
            cli, sdk = find_sdk(sp.text)
        except InputError:  # no SDK: a local netstandard TorchSharp is built with Mono's mcs (mcs_build.py)
            if sp.dll is None or not mcs_build.usable(sp.dll):
                raise
            _copy_sources(folder / "src", dotnet_dir)
            dll, extra = mcs_build.build(sp.dll, sorted((folder / "src").rglob("*.cs")), folder / "bin", ASSEMBLY,
                                         folder / "build.log", say)
            _write_record(folder, sp, src_hash, dll, "mcs " + (mcs_build.mcs() or ""), extra)
            return dll
        project = _copy_sources(folder / "src", dotnet_dir)
        out = folder / "bin"
        log = folder / "build.log"
        cmd = build_command(cli, project, out, sp)
        n_src = len(source_files(dotnet_dir))
        if sp.version:
            what = (f"restoring {PACKAGE} {sp.version} from NuGet (with libtorch for Linux, macOS and Windows: about "
                    f"1.4 GB the first time, then from the NuGet cache)")
        else:
            what = f"referencing the local TorchSharp {sp.dll}"
        say(f"building the TorchSharp worker: {what}, compiling {n_src} source files from {dotnet_dir} with "
            f".NET SDK {sdk} into {out} (log: {log})")
        t0 = time.monotonic()
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=_env(),
                                 cwd=str(folder))
            output = (res.stdout or "") + (res.stderr or "")
            code = res.returncode
        except subprocess.TimeoutExpired:
            output, code = f"error: dotnet build did not finish within {BUILD_TIMEOUT_S} s", -1
        except OSError as e:
            output, code = f"error: {e}", -1
        log.write_text("$ " + " ".join(cmd) + "\n" + output)
        dll = out / ASSEMBLY
        if code != 0 or not dll.is_file():
            if code == 0:
                output += f"\nerror: the build succeeded but wrote no {dll}"
            raise InputError(explain_failure(output, sp, log, cmd, DEFAULT_VERSION))
        restored = restored_versions(project).get(PACKAGE) if sp.version else None
        if sp.version and restored and restored != sp.version:  # cannot happen with [VERSION], unless NuGet changes
            raise InputError(f"--torchsharp {sp.text}: asked NuGet for exactly {PACKAGE} {sp.version} and it restored "
                             f"{restored}; log: {log}")
        say(f"built {dll.name} against {f'{PACKAGE} {restored or sp.version}' if sp.version else sp.dll} in "
            f"{time.monotonic() - t0:.1f} s")
        _write_record(folder, sp, src_hash, dll, sdk, {"restored_from_nuget": bool(restored)}, restored)
        return dll


def _write_record(folder: Path, sp: Spec, src_hash: str, dll: Path, sdk: str, extra: dict,
                  restored: str | None = None) -> None:
    """``build.json`` of a finished build (``sdk``: the .NET SDK's version, or ``mcs`` and its path)."""
    record = {"torchsharp": restored or sp.version or str(sp.dll), "requested": sp.version or str(sp.dll),
              "kind": sp.kind, "spec": sp.text, "source_sha256": src_hash, "sdk": sdk, "assembly": str(dll),
              "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **extra}
    if sp.dll is not None:
        record.update(torchsharp_dll=str(sp.dll), dll_stamp=_dll_stamp(sp.dll))
    (folder / "build.json").write_text(json.dumps(record, indent=1) + "\n")


def built_worker(spec: str | None = None) -> tuple[str, str, str]:
    """What a TorchSharp soak's :class:`optcheck.config.TorchSharpConfig` needs for ``spec``
    (building the worker if needed): its ``version``, ``assembly`` and ``trainer``.

    Raises:
        InputError: as :func:`ensure_worker_assembly`.
    """
    text = spec or default_spec()
    return text, str(ensure_worker_assembly(text)), TRAINER_TYPE


def cached_builds(dotnet_dir: Path | None = None) -> list[dict]:
    """The worker builds in the cache, for ``optcheck doctor``: one dict per folder with
    ``key``, ``torchsharp`` (version or DLL path), ``assembly``, ``sdk``, ``built_at``,
    ``ok`` (the assembly exists) and ``current`` (built from today's sources)."""
    root = cache_root()
    if not root.is_dir():
        return []
    try:
        src_hash = source_hash(dotnet_dir or sources_dir())
    except InputError:
        src_hash = None
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        rec = _read_record(folder)
        if rec is None:
            continue
        dll = folder / "bin" / ASSEMBLY
        out.append({"key": folder.name, "torchsharp": rec.get("torchsharp"), "assembly": str(dll),
                    "sdk": rec.get("sdk"), "built_at": rec.get("built_at"), "ok": dll.is_file(),
                    "current": src_hash is not None and rec.get("source_sha256") == src_hash})
    return out


if __name__ == "__main__":  # pragma: no cover - `python -m optcheck.torchsharp_bridge.build [SPEC | --sources]`

    from optcheck.run.exitcodes import USAGE

    if "--sources" in sys.argv[1:]:  # the folder a user's csproj compiles optcheck's C# from (OptCheckSources)
        print(sources_arg())
        sys.exit(0)
    args = [a for a in sys.argv[1:] if a != "--rebuild"]
    try:
        print(ensure_worker_assembly(args[0] if args else None, rebuild="--rebuild" in sys.argv))
    except InputError as e:
        print(f"optcheck: {e}", file=sys.stderr)
        sys.exit(USAGE)
