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
