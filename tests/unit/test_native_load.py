"""The native-library load check (``optcheck.torchsharp_bridge.native``) on real shared
libraries built here with gcc: ``libLibTorchSharp.so`` stands for TorchSharp's and needs
``dep_fn@OPTCHECK_9.9`` from ``libdep.so``; the ``libdep.so`` installed beside it defines
only up to ``OPTCHECK_9.8`` (a version no system has), so dlopen fails exactly as
TorchSharp 0.107.0's library does on a libstdc++ without ``GLIBCXX_3.4.32``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optcheck.torchsharp_bridge import native

ROOT = Path(__file__).resolve().parents[2]
GCC = shutil.which("gcc") or shutil.which("cc")
pytestmark = pytest.mark.skipif(GCC is None or not sys.platform.startswith("linux"),
                                reason="needs gcc and the GNU dynamic loader (Linux) to build versioned libraries")

DEP_C = "int dep_fn(void) { return 42; }\nint dep_old(void) { return 1; }\n"
NEEDS_C = "int dep_fn(void);\nint needs_fn(void) { return dep_fn(); }\n"


def _map(newest: str) -> str:
    return f"OPTCHECK_9.1 {{ global: dep_old; local: *; }};\nOPTCHECK_{newest} {{ global: dep_fn; }} OPTCHECK_9.1;\n"


def _gcc(*args, cwd):
    subprocess.run([GCC, "-shared", "-fPIC", *args], cwd=cwd, check=True, capture_output=True)


def build(folder: Path, *, dep_defines: str) -> Path:
    """``folder`` with libLibTorchSharp.so (linked against libdep.so at OPTCHECK_9.9, RUNPATH
    $ORIGIN) and a libdep.so whose newest version is ``dep_defines``."""
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "src"
    src.mkdir(exist_ok=True)
    (src / "dep.c").write_text(DEP_C)
    (src / "needs.c").write_text(NEEDS_C)
    (src / "new.map").write_text(_map("9.9"))
    (src / "have.map").write_text(_map(dep_defines))
    _gcc("-o", "libdep.so", "dep.c", "-Wl,--version-script=new.map", "-Wl,-soname,libdep.so", cwd=src)
    _gcc("-o", str(folder / "libLibTorchSharp.so"), "needs.c", "-L.", "-ldep", "-Wl,-rpath,$ORIGIN", cwd=src)
    _gcc("-o", str(folder / "libdep.so"), "dep.c", "-Wl,--version-script=have.map", "-Wl,-soname,libdep.so",
         cwd=src)
    return folder


def load_check(path: Path) -> tuple[int, str]:
    """``native.load_check`` in a fresh process (``python -m optcheck.torchsharp_bridge.native``):
    a library once loaded stays loaded, so each check needs its own process."""
    res = subprocess.run([sys.executable, "-m", "optcheck.torchsharp_bridge.native", str(path)],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    return res.returncode, res.stdout.strip()


def test_a_library_whose_versions_are_there_loads(tmp_path):
    folder = build(tmp_path / "bin", dep_defines="9.9")
    assert native.find_native(folder) == folder / "libLibTorchSharp.so"
    assert load_check(folder / "libLibTorchSharp.so") == (0, f"ok {folder / 'libLibTorchSharp.so'}")
    assert load_check(folder) == (0, f"ok {folder / 'libLibTorchSharp.so'}")
    assert "OPTCHECK_9.9" in native.version_definitions(folder / "libdep.so")


def test_a_missing_symbol_version_is_named_with_what_the_system_provides(tmp_path):
    folder = build(tmp_path / "bin", dep_defines="9.8")
    assert native.version_definitions(folder / "libdep.so")[-2:] == ["OPTCHECK_9.1", "OPTCHECK_9.8"]
    rc, line = load_check(folder / "libLibTorchSharp.so")
    assert rc == 1 and line == (f"the native library {folder / 'libLibTorchSharp.so'} cannot be loaded: needs OPTCHECK_9.9; "
                    f"{folder / 'libdep.so'} provides up to OPTCHECK_9.8; install a libdep.so that defines "
                    f"OPTCHECK_9.9, or put one on LD_LIBRARY_PATH")


def test_a_missing_dependency_is_named(tmp_path):
    folder = build(tmp_path / "bin", dep_defines="9.9")
    (folder / "libdep.so").unlink()
    rc, line = load_check(folder / "libLibTorchSharp.so")
    assert rc == 1 and "needs libdep.so, which is neither beside it nor on the loader path" in line


def test_the_nuget_layout_is_searched(tmp_path):
    folder = build(tmp_path / "bin" / "runtimes" / "linux-x64" / "native", dep_defines="9.9")
    assert native.find_native(tmp_path / "bin") == folder / "libLibTorchSharp.so"
    assert native.find_native(tmp_path) is None


def test_glibcxx_message_reads_the_system_libstdcxx():
    """The issue's case, with the loader's text as glibc writes it and this machine's real
    libstdc++: the highest GLIBCXX version is read from its version definitions."""
    libstdcxx = Path("/lib/x86_64-linux-gnu/libstdc++.so.6")
    if not libstdcxx.exists():
        pytest.skip("no /lib/x86_64-linux-gnu/libstdc++.so.6 here")
    have = native.highest_provided(libstdcxx, "GLIBCXX_3.4.32")
    assert have and have.startswith("GLIBCXX_3.4.")
    msg = f"{libstdcxx}: version `GLIBCXX_3.4.99' not found (required by /x/libLibTorchSharp.so)"
    line = native.explain(msg, "/x/libLibTorchSharp.so")
    assert f"needs GLIBCXX_3.4.99; {libstdcxx} provides up to {have}" in line
    line = native.explain(msg.replace("3.4.99", "3.4.32"), "/x/libLibTorchSharp.so")
    assert "needs GLIBCXX_3.4.32 (libstdc++ of GCC 13.2 or newer)" in line and "LD_LIBRARY_PATH" in line


def _env(tmp_path):
    return dict(os.environ, PYTHONPATH=str(ROOT), OPTCHECK_CACHE=str(tmp_path / "cache"))


def test_soak_stops_before_dotnet_with_the_loaders_reason(tmp_path):
    """The torch-free TorchSharp worker load-checks the library beside the worker assembly
    before any .NET code runs: one line, exit 2."""
    folder = build(tmp_path / "bin", dep_defines="9.8")
    (folder / "OptCheck.Worker.dll").write_bytes(b"MZ")
    res = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--backend", "torchsharp",
                          "--dotnet-assembly", str(folder / "OptCheck.Worker.dll"), "--steps", "5",
                          "--out", str(tmp_path / "run")], capture_output=True, text=True, env=_env(tmp_path),
                         cwd=tmp_path, timeout=300)
    assert res.returncode == 2, res.stderr
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in res.stderr, res.stderr
    assert err[0].startswith("optcheck: error: the native library ")
    assert "needs OPTCHECK_9.9" in err[0] and f"{folder / 'libdep.so'} provides up to OPTCHECK_9.8" in err[0]


def test_doctor_checks_the_native_library_of_each_cached_build(tmp_path):
    build_dir = tmp_path / "cache" / "torchsharp" / "0.107.0"
    folder = build(build_dir / "bin", dep_defines="9.8")
    (folder / "OptCheck.Worker.dll").write_bytes(b"MZ")
    (build_dir / "build.json").write_text(json.dumps({"torchsharp": "0.107.0", "sdk": "10.0.100",
                                                      "built_at": "2026-11-23T12:00:00Z", "source_sha256": "x"}))
    res = subprocess.run([sys.executable, "-m", "optcheck", "doctor"], capture_output=True, text=True,
                         env=_env(tmp_path), cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "native library:" in ln)
    assert "needs OPTCHECK_9.9" in line and "provides up to OPTCHECK_9.8" in line
    # and a loadable one reads as such
    build(build_dir / "bin", dep_defines="9.9")
    res = subprocess.run([sys.executable, "-m", "optcheck", "doctor"], capture_output=True, text=True,
                         env=_env(tmp_path), cwd=tmp_path, timeout=300)
    line = next(ln for ln in res.stdout.splitlines() if "native library:" in ln)
    assert line.strip() == f"native library: {folder / 'libLibTorchSharp.so'} loads"
