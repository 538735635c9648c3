"""``optcheck doctor`` promises exit 0 (issue 26): a long ``OPTCHECK_CACHE``, a
``dotnet`` that prints bytes that are not UTF-8, a cached ``build.json`` that is a
list are each reported in the doctor's lines, never a traceback. Real CLI processes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _doctor(env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **env_extra)
    return subprocess.run([sys.executable, "-m", "optcheck", "doctor"], capture_output=True, text=True, env=env,
                          timeout=600)


def _ok(res: subprocess.CompletedProcess) -> None:
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Traceback" not in res.stderr + res.stdout
    assert "python:" in res.stdout and "TorchSharp builds" in res.stdout


def test_a_long_cache_path_is_reported_not_a_traceback(tmp_path):
    _ok(_doctor({"OPTCHECK_CACHE": str(tmp_path / ("c" * 300) / ("d" * 300) / ("e" * 4000))}))


def test_a_build_json_that_is_a_list_is_skipped(tmp_path):
    build = tmp_path / "cache" / "torchsharp" / "abc123"
    build.mkdir(parents=True)
    (build / "build.json").write_text("[1, 2, 3]")
    _ok(_doctor({"OPTCHECK_CACHE": str(tmp_path / "cache")}))


def test_a_dotnet_printing_non_utf8_bytes_is_reported(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    dotnet = fake / "dotnet"
    dotnet.write_text("#!/bin/sh\nprintf '\\377\\376 8.0.100 [/x\\351]\\n'\nprintf '\\377\\n' >&2\nexit 0\n")
    dotnet.chmod(dotnet.stat().st_mode | stat.S_IEXEC)
    res = _doctor({"PATH": f"{fake}:{os.environ['PATH']}", "DOTNET_ROOT": str(tmp_path / "none"),
                   "OPTCHECK_CACHE": str(tmp_path / "cache")})
    _ok(res)
