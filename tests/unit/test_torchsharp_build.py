"""optcheck/torchsharp_bridge/build.py: every failure path gives one clear line, builds are cached.

No .NET SDK can be installed here, so "no SDK" is tested with a PATH that has no `dotnet`, and
every other path with tests/dotnet/fake_sdk/dotnet — a shell script that stands in for the real
SDK only because none can be installed here: it prints what `dotnet build` prints (NuGet's
NU1101 / NU1102 / NU1301, a C# compile error) and exits 1, or writes a placeholder assembly.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optcheck.errors import InputError
from optcheck.torchsharp_bridge import build

REPO = Path(__file__).resolve().parents[2]
FAKE_SDK = REPO / "tests" / "dotnet" / "fake_sdk"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTCHECK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("OPTCHECK_TORCHSHARP", raising=False)
    return tmp_path / "cache" / "torchsharp"


@pytest.fixture
def no_dotnet(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert shutil.which("dotnet") is None


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Put the fake `dotnet` first on PATH; returns a function setting its mode; calls are logged."""
    log = tmp_path / "dotnet-calls.log"
    monkeypatch.setenv("PATH", f"{FAKE_SDK}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_DOTNET_LOG", str(log))

    def mode(m: str) -> Path:
        monkeypatch.setenv("FAKE_DOTNET_MODE", m)
        return log

    mode("ok")
    return mode


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("--torchsharp ")
    return msg


def test_no_sdk_names_dotnet_and_the_install_command(cache, no_dotnet):
    with pytest.raises(InputError) as e:
        build.ensure_worker_assembly("0.99.6")
    msg = one_line(e)
    assert "`dotnet` is not on PATH" in msg and "dotnet-sdk-8.0" in msg and "run the soak again" in msg


def test_no_sdk_through_the_module_cli_exits_2_with_one_line(cache, tmp_path):
    env = dict(os.environ, PATH=str(tmp_path), OPTCHECK_CACHE=str(tmp_path / "c"))
    res = subprocess.run([sys.executable, "-m", "optcheck.torchsharp_bridge.build", "0.105.0"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "`dotnet` is not on PATH" in res.stderr


def test_runtime_without_sdk(cache, fake):
    fake("runtime-only")
    with pytest.raises(InputError) as e:
        build.ensure_worker_assembly("0.99.6")
    assert "has no .NET SDK" in one_line(e)


def test_sdk_older_than_8(cache, fake):
    fake("sdk6")
    with pytest.raises(InputError) as e:
        build.ensure_worker_assembly("0.99.6")
    msg = one_line(e)
    assert "6.0.428" in msg and "net8.0" in msg


def test_version_nuget_does_not_have_nu1102(cache, fake):
    fake("nu1102")
    with pytest.raises(InputError) as e:
        build.ensure_worker_assembly("0.99.99")
    msg = one_line(e)
    assert "NuGet has no TorchSharp-cpu 0.99.99 (asked for exactly [0.99.99])" in msg
    assert "the sources offer: nuget.org has 64 versions (nearest 0.100.0)" in msg
    assert "--torchsharp 0.107.0" in msg and "nuget.org/packages/TorchSharp-cpu" in msg


def test_csproj_asks_nuget_for_exactly_the_version():
    """NuGet reads a bare Version="V" as ">= V" and takes the next version when V is gone, with only
    warning NU1603; "[V]" is exactly V. NU1603 must not be hidden in NoWarn either."""
    text = (REPO / "dotnet" / "Worker" / "OptCheck.Worker.csproj").read_text()
    assert 'Include="$(TorchSharpPackage)" Version="[$(TorchSharpVersion)]"' in text
    assert "NU1603" not in text.split("<NoWarn>")[1].split("</NoWarn>")[0]
    assert f">{build.DEFAULT_VERSION}</TorchSharpVersion>" in text


def test_version_no_source_serves_names_it_and_what_each_source_offers(cache, fake, capsys):
    fake("not-served")
    with pytest.raises(InputError) as e:
        build.ensure_worker_assembly("0.99.6")
    msg = one_line(e)
    assert msg.startswith("--torchsharp 0.99.6: NuGet has no TorchSharp-cpu 0.99.6 (asked for exactly [0.99.6]); "
                          "the sources offer: nuget.org has 37 versions (nearest 0.100.0), /root/local-feed has none;")
    assert build.cached_builds() == []  # nothing labelled 0.99.6 is left in the cache
    assert not (cache / "0.99.6" / "build.json").exists()


def test_build_json_and_cache_record_the_version_restored(cache, fake, capsys):
    fake("ok")
    dll = build.ensure_worker_assembly("0.107.0")
    rec = json.loads((dll.parent.parent / "build.json").read_text())
    assert rec["torchsharp"] == "0.107.0" and rec["requested"] == "0.107.0" and rec["restored_from_nuget"]
    assert dll.parent.parent.name == "0.107.0"
    err = capsys.readouterr().err.splitlines()
    # the first build says what it restores and compiles, then how long it took
    assert err[0].startswith("optcheck: building the TorchSharp worker: restoring TorchSharp-cpu 0.107.0 from NuGet")
    assert "about 1.4 GB" in err[0] and "source files from" in err[0]
    assert re.fullmatch(r"optcheck: built OptCheck.Worker.dll against TorchSharp-cpu 0.107.0 in \d+\.\d s", err[1])
    build.ensure_worker_assembly("0.107.0")
    assert capsys.readouterr().err == ""  # a cached build is silent


def test_a_substituted_version_stops_the_build(cache, fake, monkeypatch):
    fake("substituted")
    monkeypatch.setenv("FAKE_DOTNET_RESTORED", "0.107.0")
    with pytest.raises(InputError) as e:
        build.ensure_worker_assembly("0.99.6")
    assert "asked NuGet for exactly TorchSharp-cpu 0.99.6 and it restored 0.107.0" in one_line(e)
    assert not (cache / "0.99.6" / "build.json").exists()


def test_package_nuget_does_not_have_nu1101(cache, fake):
    fake("nu1101")
    with pytest.raises(InputError) as e:
        build.ensure_worker_assembly("0.105.0")
    assert "NuGet has no TorchSharp-cpu 0.105.0" in one_line(e)


def test_restore_without_network_nu1301(cache, fake):
    fake("nu1301")
    with pytest.raises(InputError) as e:
        build.ensure_worker_assembly("0.105.0")
    msg = one_line(e)
    assert "NuGet is unreachable" in msg and "api.nuget.org" in msg
    assert "--torchsharp PATH/TorchSharp.dll" in msg


def test_compile_error_names_file_line_log_and_command(cache, fake):
    fake("cs-error")
    with pytest.raises(InputError) as e:
        build.ensure_worker_assembly("0.105.0")
    msg = one_line(e)
    assert "GPT.cs(90,56): error CS0121" in msg and not msg.rstrip().endswith("]")
    log = cache / "0.105.0" / "build.log"
    assert f"full log: {log}" in msg and log.is_file() and "CS0121" in log.read_text()
    assert "re-run by hand: `" in msg and "-p:TorchSharpVersion=0.105.0" in msg


def test_build_is_cached_and_rebuilt_when_sources_change(cache, fake, tmp_path):
    log = fake("ok")
    dotnet_dir = tmp_path / "dotnet"
    shutil.copytree(REPO / "dotnet", dotnet_dir, ignore=shutil.ignore_patterns("bin", "obj"))
    dll = build.ensure_worker_assembly("0.105.0", dotnet_dir=dotnet_dir)
    assert dll == cache / "0.105.0" / "bin" / "OptCheck.Worker.dll" and dll.is_file()
    calls = log.read_text().splitlines()
    builds = [c for c in calls if c.startswith("build ")]
    assert len(builds) == 1 and "-p:TorchSharpVersion=0.105.0" in builds[0] and "-c Release" in builds[0]
    # the build compiles a copy of the sources, not the checkout
    assert (cache / "0.105.0" / "src" / "Worker" / "OptCheck.Worker.csproj").is_file()
    assert (cache / "0.105.0" / "src" / "Probe" / "Interfaces.cs").is_file()
    assert build.ensure_worker_assembly("0.105.0", dotnet_dir=dotnet_dir) == dll
    assert len([c for c in log.read_text().splitlines() if c.startswith("build ")]) == 1  # reused
    [rec] = build.cached_builds(dotnet_dir)
    assert rec["torchsharp"] == "0.105.0" and rec["ok"] and rec["current"] and rec["sdk"] == "10.0.100"
    (dotnet_dir / "Worker" / "Trainer.cs").write_text((dotnet_dir / "Worker" / "Trainer.cs").read_text() + "\n// x\n")
    assert build.cached_builds(dotnet_dir)[0]["current"] is False
    build.ensure_worker_assembly("0.105.0", dotnet_dir=dotnet_dir)
    assert len([c for c in log.read_text().splitlines() if c.startswith("build ")]) == 2  # rebuilt


def test_failed_build_is_not_reused(cache, fake):
    fake("nu1301")
    with pytest.raises(InputError):
        build.ensure_worker_assembly("0.105.0")
    assert build.cached_builds() == []
    fake("ok")
    assert build.ensure_worker_assembly("0.105.0").is_file()


def test_local_torchsharp_build(cache, fake, tmp_path):
    log = fake("ok")
    local = tmp_path / "TorchSharp-build"
    local.mkdir()
    (local / "TorchSharp.dll").write_bytes(b"MZ")
    with pytest.raises(InputError) as e:
        build.ensure_worker_assembly(str(local / "TorchSharp.dll"))
    assert "no native LibTorchSharp" in one_line(e)
    (local / "libLibTorchSharp.so").write_bytes(b"\x7fELF")
    dll = build.ensure_worker_assembly(str(local))  # the folder works too
    assert dll.parent.parent.name.startswith("local-")
    [call] = [c for c in log.read_text().splitlines() if c.startswith("build ")]
    assert f"-p:TorchSharpDll={local / 'TorchSharp.dll'}" in call and "TorchSharpVersion" not in call


def test_parse_spec():
    assert build.parse_spec("0.105.0").version == "0.105.0"
    assert build.parse_spec("0.106.0-preview1").version == "0.106.0-preview1"
    for bad, words in (("", "expected a TorchSharp version"), ("/nonexistent/TorchSharp.dll", "neither"),
                       ("latest", "neither")):
        with pytest.raises(InputError, match=words):
            build.parse_spec(bad)


def test_parse_spec_folder_without_dll(tmp_path):
    with pytest.raises(InputError, match="no TorchSharp.dll there"):
        build.parse_spec(str(tmp_path))


def test_default_spec_from_environment(monkeypatch):
    monkeypatch.delenv("OPTCHECK_TORCHSHARP", raising=False)
    assert build.default_spec() == build.DEFAULT_VERSION
    monkeypatch.setenv("OPTCHECK_TORCHSHARP", "0.105.0")
    assert build.default_spec() == "0.105.0"


def test_built_worker_names_the_trainer(cache, fake):
    version, assembly, trainer = build.built_worker("0.105.0")
    assert trainer == "OptCheck.Worker.GptTrainer"
    assert Path(assembly).is_file() and version == "0.105.0"
    assert "class GptTrainer" in (REPO / "dotnet" / "Worker" / "Trainer.cs").read_text()
