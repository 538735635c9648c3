"""``optcheck doctor``: lists runtimes, pythonnet, torch and cached TorchSharp builds; exit 0;
never imports torch in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_doctor_reports_and_exits_0(tmp_path):
    import json

    build = tmp_path / "torchsharp" / "0.105.0"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "OptCheck.Worker.dll").write_bytes(b"MZ")
    (build / "build.json").write_text(json.dumps({"torchsharp": "0.105.0", "sdk": "8.0.100",
                                                  "built_at": "2026-11-22T12:00:00Z", "source_sha256": "old"}))
    code = ("import sys\nfrom optcheck.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    rc = e.code\n"
            "print('RC', rc, 'TORCH', 'torch' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code, "doctor"], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, OPTCHECK_CACHE=str(tmp_path)))
    out = res.stdout
    assert "RC 0 TORCH False" in out, res.stderr
    for title in ("CoreCLR runtimes (Microsoft.NETCore.App):", ".NET SDKs:", "Mono:", "pythonnet:",
                  "torch (checked in a subprocess):", f"TorchSharp builds in {tmp_path / 'torchsharp'}:"):
        assert title in out
    assert f"0.105.0  [ok, stale: sources changed, rebuilt on next use] {build / 'bin' / 'OptCheck.Worker.dll'}" in out
    from optcheck.torchsharp_bridge import discovery, runtime

    for r in discovery.coreclr_runtimes():
        assert r.version in out
    assert (runtime.pythonnet_version() or "not installed") in out


def test_doctor_without_clr_loader_says_so_instead_of_mono_not_found(tmp_path):
    """pythonnet's loader (clr_loader) missing is not the same as no runtime installed: the
    doctor names the missing package and, where `mono` is on PATH, the Mono it found."""
    shadow = tmp_path / "clr_loader"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('No module named clr_loader (hidden by the test)')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), OPTCHECK_CACHE=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "optcheck", "doctor"], cwd=ROOT, capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    mono = out.split("Mono:\n", 1)[1].splitlines()[0].strip()
    core = out.split("CoreCLR runtimes (Microsoft.NETCore.App):\n", 1)[1].splitlines()[0].strip()
    for line in (mono, core):
        assert "not checked: clr_loader (pythonnet's loader) is not importable" in line and "pip install" in line
        assert "not found" not in line and "none found" not in line
    from optcheck.torchsharp_bridge import discovery

    if discovery.mono_version():
        assert mono.startswith(f"{discovery.mono_version()} installed (`mono --version`)")
