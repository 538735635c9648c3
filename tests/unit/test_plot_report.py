"""optcheck.report.plot: a PNG of loss, step time and memory with findings marked."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from optcheck.errors import InputError
from optcheck.report.plot import plot_run
from optcheck.run.rundir import RunDir
from optcheck.record.snapshot import SCHEMA

MiB = 2**20


def make_run(path, steps=2000, crash_at=None):
    rng = np.random.default_rng(0)
    rd = RunDir(path)
    last = crash_at or steps
    for s in range(1, last + 1):
        rd.metric(s, float(1.5 + 4 * np.exp(-s / 150) + rng.normal(0, 0.1)), float(0.016 + rng.normal(0, 0.001)))
    for s in range(0, last + 1, 50):
        rd.snapshot({"schema": SCHEMA, "backend": "pytorch", "run": "r", "step": s, "phase": "post-step",
                     "trigger": "cadence", "params": [], "groups": [], "val_loss": 2.0 if s and s % 500 == 0 else None,
                     "memory": {"rss_bytes": 400 * MiB + (s > 200) * (s - 200) * 100_000,
                                "live_tensor_bytes": 2 * MiB + s * 1000}})
    rd.finding({"code": "OC401", "symbol": "memory-growth", "severity": "warning", "step": 700, "message": "m",
                "subjects": ["rss_bytes"]})
    for code in ("OC101", "OC102", "OC104"):
        rd.finding({"code": code, "symbol": "x", "severity": "error", "step": 900, "message": "m", "subjects": ["w"]})
    crash = {"exc_type": "System.Collections.Generic.KeyNotFoundException", "step": crash_at} if crash_at else None
    rd.summary({"run": "r", "backend": "pytorch", "status": "crashed" if crash else "findings", "crash": crash})
    rd.close()
    return path


def test_png_is_written_and_opens_with_a_sane_size(tmp_path):
    run = make_run(tmp_path / "run", crash_at=1500)
    png = plot_run(run, tmp_path / "out" / "run.png")
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (1400, 896)
        pixels = np.asarray(im.convert("RGB"), dtype=float)
    assert pixels.std() > 10, "the image is not blank"
    # findings and the crash are drawn in red/orange: there are strongly red pixels
    red = (pixels[..., 0] > 180) & (pixels[..., 1] < 90) & (pixels[..., 2] < 90)
    assert red.sum() > 200


def test_partial_run_without_summary_or_metrics(tmp_path):
    rd = RunDir(tmp_path / "r")
    rd.snapshot({"schema": SCHEMA, "backend": "pytorch", "run": "r", "step": 0, "phase": "pre-step",
                 "trigger": "start", "params": [], "groups": [], "memory": {"rss_bytes": 300 * MiB}})
    rd.close()
    png = plot_run(tmp_path / "r", tmp_path / "r.png", width_px=800)
    with Image.open(png) as im:
        assert im.size == (800, 512)


def test_bad_inputs(tmp_path):
    with pytest.raises(InputError, match="no such run directory"):
        plot_run(tmp_path / "missing", tmp_path / "x.png")
    RunDir(tmp_path / "empty").close()
    with pytest.raises(InputError, match="nothing to plot"):
        plot_run(tmp_path / "empty", tmp_path / "x.png")
    run = make_run(tmp_path / "run", steps=100)
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="--plot"):
        plot_run(run, tmp_path / "file" / "x.png")


WITHOUT_MATPLOTLIB = """
import sys
sys.modules["matplotlib"] = None  # `import matplotlib` now raises ImportError, as when it is not installed
from optcheck.cli import main
sys.argv = ["optcheck", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("command", [["soak", "-q", "--steps", "5"], ["history"]])
def test_plot_without_matplotlib_is_one_line_before_anything_runs(tmp_path, command):
    import subprocess
    import sys

    args = [*command, "--plot", str(tmp_path / "p.png")]
    args += ["--out", str(tmp_path / "run")] if command[0] == "soak" else [str(tmp_path)]
    proc = subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB, *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["optcheck: error: --plot needs matplotlib, which is not installed: "
                                        "pip install 'optcheck[plot]' (or matplotlib)"]
    assert not (tmp_path / "run").exists() and not (tmp_path / "p.png").exists()
