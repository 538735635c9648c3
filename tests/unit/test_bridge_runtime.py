"""optcheck.torchsharp_bridge.discovery (finding runtimes) and .runtime (runtimeconfig, choosing,
one-line errors); the TorchSharp worker's import path stays torch-free."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from optcheck.errors import InputError
from optcheck.torchsharp_bridge import discovery, runtime
from optcheck.torchsharp_bridge.discovery import DotnetRuntime


def test_worker_import_path_is_torch_free():
    code = ("import sys, optcheck.torchsharp_bridge.worker, optcheck.torchsharp_bridge.fixtures, "
            "optcheck.torchsharp_bridge.convert, optcheck.torchsharp_bridge.runtime, "
            "optcheck.torchsharp_bridge.discovery; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_tfm_and_version_order():
    assert runtime.tfm("3.1.23") == "netcoreapp3.1"
    assert runtime.tfm("8.0.11") == "net8.0"
    rts = [DotnetRuntime("coreclr", v, "/x", "t") for v in ("3.1.23", "10.0.1", "8.0.11")]
    assert discovery.newest(rts).version == "10.0.1"
    assert discovery.newest([]) is None


def test_runtimeconfig_written_by_others_is_never_read_half_written(tmp_path):
    """Two processes (CI's -n 2 workers, a user's second run) write the same folder's
    runtimeconfig while a third reads it as hostfxr does: every read parses. Before, the
    truncate-then-write left a moment with an empty or partial file ("Malformed token")."""
    writer = ("import sys; from optcheck.torchsharp_bridge import runtime; "
              "from optcheck.torchsharp_bridge.discovery import DotnetRuntime; "
              "rt = DotnetRuntime('coreclr', '3.1.23', '/x', 't'); "
              "[runtime.write_runtimeconfig(rt, sys.argv[1]) for _ in range(400)]")
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(tmp_path)]) for _ in range(2)]
    path, reads, bad = tmp_path / "optcheck.runtimeconfig.json", 0, []
    while any(p.poll() is None for p in procs):
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        reads += 1
        try:
            json.loads(text)
        except ValueError:
            bad.append(text)
    assert all(p.returncode == 0 for p in procs)
    assert reads > 0 and not bad, f"{len(bad)} of {reads} reads were partial: {bad[:1]!r}"
    assert [f.name for f in tmp_path.iterdir()] == ["optcheck.runtimeconfig.json"]  # no temporary left


def test_runtimeconfig_rolls_forward(tmp_path, monkeypatch):
    monkeypatch.delenv("DOTNET_SYSTEM_GLOBALIZATION_INVARIANT", raising=False)
    rt = DotnetRuntime("coreclr", "3.1.23", "/x", "t")
    cfg = json.loads(runtime.write_runtimeconfig(rt, tmp_path).read_text())["runtimeOptions"]
    assert cfg["rollForward"] == "LatestMajor"
    assert cfg["framework"] == {"name": "Microsoft.NETCore.App", "version": "3.1.23"}
    assert cfg["tfm"] == "netcoreapp3.1"
    assert cfg["configProperties"]["System.Globalization.Invariant"] is True   # 3.x never finds a new ICU


def test_invariant_globalization_follows_the_environment(monkeypatch):
    rt8 = DotnetRuntime("coreclr", "8.0.1", "/x", "t")
    monkeypatch.setenv("DOTNET_SYSTEM_GLOBALIZATION_INVARIANT", "1")
    assert runtime.needs_invariant_globalization(rt8) is True
    monkeypatch.setenv("DOTNET_SYSTEM_GLOBALIZATION_INVARIANT", "0")
    assert runtime.needs_invariant_globalization(DotnetRuntime("coreclr", "3.1.2", "/x", "t")) is False
    monkeypatch.delenv("DOTNET_SYSTEM_GLOBALIZATION_INVARIANT")
    assert runtime.needs_invariant_globalization(rt8) is (not discovery.icu_available())


def test_unknown_kind_is_one_line():
    with pytest.raises(InputError, match=r"--dotnet-runtime 'netfx': expected one of coreclr, mono"):
        runtime.select("netfx")


def test_nonexistent_runtime_dir_is_one_line(tmp_path):
    with pytest.raises(InputError) as e:
        runtime.select("coreclr", tmp_path / "nope")
    assert "no such directory" in str(e.value) and "dotnetcore2" in str(e.value) and "\n" not in str(e.value)


def test_a_root_without_runtimes_says_how_to_install_one(tmp_path):
    (tmp_path / "shared").mkdir()
    with pytest.raises(InputError) as e:
        runtime.select("coreclr", tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"no .NET runtime (Microsoft.NETCore.App with host/fxr) found in {tmp_path}")
    assert "dotnet-runtime-8.0" in msg and "--dotnet-runtime mono" in msg


def test_a_fake_root_is_found_with_its_versions(tmp_path):
    for v in ("6.0.5", "8.0.2"):
        (tmp_path / "shared" / "Microsoft.NETCore.App" / v).mkdir(parents=True)
    (tmp_path / "host" / "fxr" / "8.0.2").mkdir(parents=True)
    found = discovery.coreclr_runtimes(tmp_path)
    assert [r.version for r in found] == ["6.0.5", "8.0.2"]
    assert runtime.select("coreclr", tmp_path).version == "8.0.2"


def test_dotnetcore2_runtime_is_found_when_installed():
    root = discovery.dotnetcore2_root()
    if root is None:
        pytest.skip("dotnetcore2 not installed")
    assert any(r.source == "dotnetcore2" and r.version.startswith("3.1") for r in discovery.coreclr_runtimes())


def test_no_pythonnet_is_one_line():
    code = ("import sys; sys.modules['pythonnet'] = None\n"
            "from optcheck.torchsharp_bridge import runtime\n"
            "from optcheck.errors import InputError\n"
            "try:\n    runtime.load('coreclr')\nexcept InputError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ("pythonnet is not installed, and the TorchSharp backend drives .NET through it: "
                   "pip install 'pythonnet>=3.0'")


def test_no_clr_loader_is_one_line():
    code = ("import sys; sys.modules['clr_loader'] = None\n"
            "from optcheck.torchsharp_bridge import discovery, runtime\n"
            "from optcheck.errors import InputError\n"
            "print(discovery.coreclr_runtimes(), discovery.find_libmono())\n"
            "try:\n    runtime.select('coreclr')\nexcept InputError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[] None", "pythonnet is not installed (no clr_loader), and the TorchSharp backend "
                                           "drives .NET through it: pip install 'pythonnet>=3.0'"]


def test_runtimes_are_read_through_clr_loader(tmp_path, monkeypatch):
    """coreclr_runtimes lists a root with clr_loader's find_runtimes_in_root, keeping only
    Microsoft.NETCore.App; find_libmono is clr_loader's."""
    import clr_loader
    import clr_loader.util.find as clr_find

    for name, v in (("Microsoft.NETCore.App", "8.0.2"), ("Microsoft.AspNetCore.App", "9.0.1")):
        (tmp_path / "shared" / name / v).mkdir(parents=True)
    (tmp_path / "host" / "fxr" / "8.0.2").mkdir(parents=True)
    seen = []
    real = clr_find.find_runtimes_in_root
    monkeypatch.setattr(clr_find, "find_runtimes_in_root", lambda root: seen.append(root) or real(root))
    assert [r.version for r in discovery.coreclr_runtimes(tmp_path)] == ["8.0.2"] and seen == [tmp_path]
    monkeypatch.setattr(clr_loader, "find_libmono", lambda: discovery.Path("/x/libmonosgen-2.0.so.1"))
    assert discovery.find_libmono() == discovery.Path("/x/libmonosgen-2.0.so.1")


def test_mono_without_libmono_or_facade_is_one_line(monkeypatch):
    monkeypatch.setattr(discovery, "find_libmono", lambda: None)
    with pytest.raises(InputError, match=r"^Mono not found \(no libmonosgen-2.0.so\): apt-get install"):
        runtime.select("mono")
    monkeypatch.setattr(discovery, "find_libmono", lambda: discovery.Path("/usr/lib/libmonosgen-2.0.so.1"))
    monkeypatch.setattr(discovery, "_MONO_FACADES", ("/nonexistent/Facades",))
    with pytest.raises(InputError, match=r"Mono lacks Facades/netstandard\.dll.*: apt-get install mono-devel$"):
        runtime.select("mono")


def test_native_library_hint_names_the_library():
    msg = "Unable to load shared library 'LibTorchSharp' or one of its dependencies."
    hint = runtime.native_library_hint(msg)
    assert "LibTorchSharp" in hint and "LD_LIBRARY_PATH" in hint and "\n" not in hint


def test_coreclr_runtimeconfig_folder_is_removed_when_the_process_exits(tmp_path):
    """``load("coreclr")`` writes its runtimeconfig to a temporary folder for hostfxr; a
    process that loaded CoreCLR and exited leaves no ``optcheck-rc-*`` folder behind."""
    if discovery.dotnetcore2_root() is None:
        pytest.skip("dotnetcore2 not installed")
    code = ("import glob, os, tempfile; from optcheck.torchsharp_bridge import runtime; runtime.load('coreclr'); "
            "print(len(glob.glob(os.path.join(tempfile.gettempdir(), 'optcheck-rc-*'))))")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.split()[-1] == "1"  # there while the runtime runs
    assert list(tmp_path.glob("optcheck-rc-*")) == []  # gone after the exit
