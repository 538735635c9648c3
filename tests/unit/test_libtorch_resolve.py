"""Where a LibTorchSharp built over a Python install of PyTorch takes its libtorch from, which libtorch a process
actually loaded (optcheck/torchsharp_bridge/libtorch.py), and the mcs build's choices (mcs_build.py). Torch-free
code read on real files: this Python's torch/lib, a process map, a folder laid out as each distribution lays it out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optcheck.errors import InputError
from optcheck.torchsharp_bridge import libtorch, mcs_build


def test_this_pythons_torch_lib_is_found_without_importing_torch():
    code = ("import sys; from optcheck.torchsharp_bridge import libtorch; lib = libtorch.python_torch_lib(); "
            "print(lib, 'torch' in sys.modules, libtorch.version_of(lib))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    import torch

    assert Path(out[0]) == Path(torch.__file__).parent / "lib" and out[1] == "False" and out[2] == torch.__version__


def test_libtorch_needs_its_own_libraries_and_lies_beside_them():
    lib = libtorch.python_torch_lib()
    assert "libtorch_cpu.so" in libtorch.needed(lib / "libtorch.so")
    assert not libtorch.needs_external(lib / "libtorch.so")  # libtorch_cpu.so lies beside it
    assert libtorch.needed(Path(__file__)) == []  # not ELF


@pytest.mark.parametrize("layout, version", [
    ({"version.py": "__version__ = '2.13.0+cpu'\ngit_version = 'abc'\n"}, "2.13.0+cpu"),  # a PyTorch wheel
    ({"build-version": "2.10.0+cpu\n"}, "2.10.0+cpu"),                                  # a libtorch archive
    ({}, None),
])
def test_the_release_is_read_from_the_files_around_the_library(tmp_path, layout, version):
    for name, text in layout.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "lib").mkdir()
    assert libtorch.version_of(tmp_path / "lib") == version


def test_a_nuget_package_folder_names_its_release(tmp_path):
    lib = tmp_path / "libtorch-cpu-linux-x64" / "2.10.0.0" / "runtimes" / "linux-x64" / "native"
    lib.mkdir(parents=True)
    assert libtorch.version_of(lib) == "2.10.0.0"


def test_the_loaded_libtorch_is_read_from_the_process_map(tmp_path):
    lib = tmp_path / "site-packages" / "torch" / "lib"
    lib.mkdir(parents=True)
    (lib.parent / "version.py").write_text("__version__ = '2.13.0+cpu'\n")
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
                    f"7f02-7f03 r-xp 00000000 08:01 2 {lib}/libtorch_cpu.so\n7f04-7f05 rw-p 00000000 00:00 0\n")
    assert libtorch.loaded(str(maps)) == lib / "libtorch_cpu.so"
    assert libtorch.loaded(str(tmp_path / "absent")) is None
    bare = tmp_path / "bin"  # a NuGet build's output folder: nothing around it names the release
    bare.mkdir()
    maps.write_text(f"7f02-7f03 r-xp 00000000 08:01 2 {bare}/libtorch_cpu.so\n")
    assert libtorch.loaded(str(maps)) == bare / "libtorch_cpu.so" and libtorch.version_of(bare) is None
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert libtorch.loaded(str(maps)) is None
    import torch  # this process, with PyTorch imported: its own libtorch, by file

    assert libtorch.loaded_versions() == {"libtorch": torch.__version__, "libtorch_lib": str(Path(torch.__file__).parent / "lib")}


def test_resolve_prefers_the_environment_then_ld_library_path_then_this_python(tmp_path, monkeypatch):
    monkeypatch.delenv(libtorch.ENV, raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    assert libtorch.resolve() == (libtorch.python_torch_lib().resolve(), "this Python's torch")
    own = tmp_path / "own"
    own.mkdir()
    shutil.copy2(libtorch.python_torch_lib() / "libtorch.so", own / "libtorch.so")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/nonexistent:{own}")
    assert libtorch.resolve() == (own.resolve(), "LD_LIBRARY_PATH")
    monkeypatch.setenv(libtorch.ENV, str(tmp_path))
    folder, why = libtorch.resolve()
    assert folder is None and why == f"${libtorch.ENV}={tmp_path} holds no libtorch.so"


def test_a_libtorchsharp_without_a_libtorch_is_one_line(tmp_path, monkeypatch):
    """A folder whose native LibTorchSharp links libtorch that is not beside it, and none to be found: one line
    naming what is missing (before any .NET runs), never TorchSharp's TypeInitializationException."""
    fake = tmp_path / "libLibTorchSharp.so"
    shutil.copy2(libtorch.python_torch_lib() / "libtorch.so", fake)  # an ELF that needs libtorch_cpu.so
    monkeypatch.setenv(libtorch.ENV, str(tmp_path / "nothing"))
    with pytest.raises(InputError) as e:
        libtorch.load_native(tmp_path)
    assert str(e.value).startswith(f"{fake} needs libtorch") and "holds no libtorch.so" in str(e.value)
    libtorch.load_native(tmp_path / "empty")  # no native library at all (a stand-in): nothing to do


def test_a_libtorchsharp_with_pyelftools_missing_names_pyelftools_not_libc10(tmp_path):
    """Issue 48 point 6: optcheck installed without its torchsharp extra: pyelftools cannot be imported (in a
    child process, as in such an install), so which libtorch the native library needs is unknown. The one line
    says pyelftools is missing and how to install it, not that the library "needs libc10.so"."""
    fake = tmp_path / "libLibTorchSharp.so"
    shutil.copy2(libtorch.python_torch_lib() / "libtorch.so", fake)  # an ELF that needs libtorch_cpu.so
    code = ("import sys; sys.modules['elftools'] = None\n"  # `import elftools` raises ImportError from here on
            "from pathlib import Path\nfrom optcheck.errors import InputError\n"
            "from optcheck.torchsharp_bridge import libtorch\n"
            "try:\n    libtorch.load_native(Path(sys.argv[1]))\nexcept InputError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", libtorch.ENV)}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True,
                         env=env).stdout.strip()
    assert out.startswith(f"the native library {fake} cannot be loaded: pyelftools is not installed"), out
    assert "pip install 'optcheck[torchsharp]'" in out and "pip install pyelftools" in out, out
    assert "neither beside it" not in out, out


def test_mcs_finds_system_memory_beside_torchsharp_then_in_the_reference_folder(tmp_path, monkeypatch):
    dll = tmp_path / "ts" / "TorchSharp.dll"
    dll.parent.mkdir()
    dll.write_bytes(b"x")
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "System.Memory.dll").write_bytes(b"m")
    monkeypatch.setenv("NUGET_PACKAGES", str(tmp_path / "nuget"))
    monkeypatch.delenv(mcs_build.REF_ENV, raising=False)
    found, looked = mcs_build.system_memory(dll)
    assert found is None and str(dll.parent / "System.Memory.dll") in looked
    monkeypatch.setenv(mcs_build.REF_ENV, str(ref))
    assert mcs_build.system_memory(dll)[0] == ref / "System.Memory.dll"
    (dll.parent / "System.Memory.dll").write_bytes(b"m")
    assert mcs_build.system_memory(dll)[0] == dll.parent / "System.Memory.dll"


def test_mcs_builds_only_against_a_netstandard_torchsharp(tmp_path):
    dll = tmp_path / "TorchSharp.dll"
    dll.write_bytes(b"MZ... .NETCoreApp,Version=v8.0 ...")
    assert not mcs_build.usable(dll)  # the net8.0 build needs the SDK
    dll.write_bytes(b"MZ... .NETStandard,Version=v2.0 ...")
    assert mcs_build.usable(dll) == (mcs_build.mcs() is not None and mcs_build.MONO_FACADE.is_file())


def test_an_mcs_build_without_system_memory_is_one_line(tmp_path, monkeypatch):
    dll = tmp_path / "TorchSharp.dll"
    dll.write_bytes(b".NETStandard,Version=v2.0")
    monkeypatch.setenv("NUGET_PACKAGES", str(tmp_path / "nuget"))
    monkeypatch.delenv(mcs_build.REF_ENV, raising=False)
    if mcs_build.mcs() is None:
        pytest.skip("mcs not installed (Debian mono-mcs)")
    with pytest.raises(InputError, match=r"needs TorchSharp's netstandard2.0 System.Memory.dll .* set \$OPTCHECK_TORCHSHARP_REF"):
        mcs_build.build(dll, [], tmp_path / "bin", "W.dll", tmp_path / "log", lambda m: None)
    assert not os.path.exists(tmp_path / "bin")


def test_a_libtorch_whose_release_nothing_names_keeps_torchsharps_constant(tmp_path, monkeypatch):
    """versions name the folder; the release only when a file around it says it (else the worker keeps
    TorchSharp's own torch.__version__, the only word on it)."""
    monkeypatch.setattr(libtorch, "loaded", lambda maps="/proc/self/maps": tmp_path / "bin" / "libtorch_cpu.so")
    assert libtorch.loaded_versions() == {"libtorch_lib": str(tmp_path / "bin")}
    monkeypatch.setattr(libtorch, "loaded", lambda maps="/proc/self/maps": None)
    assert libtorch.loaded_versions() == {}
