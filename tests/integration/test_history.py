"""``optcheck history`` over five nights. One real short soak is run; the other
four nights are copies of its run directory with ``summary.json`` edited (start
time, versions, final loss, findings), since what is tested is the trend and its
marks, not training: night 3 moves torch 2.13.0 -> 2.14.1, night 5 plants a
loss regression and two new finding codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SMALL, run_cli
from optcheck.run import exitcodes


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    base = tmp_path_factory.mktemp("nights")
    real = base / "night1"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "40", "--every", "20", "--out", str(real),
                             *[a for a in SMALL if a not in ("--val-every", "100")], "--val-every", "20"])
    assert rc == exitcodes.CLEAN, stdout
    for i in range(1, 5):
        d = base / f"night{i + 1}"
        shutil.copytree(real, d)
        s = json.loads((d / "summary.json").read_text())
        s["run"], s["started"] = d.name, f"2026-11-{18 + i}T02:00:00+00:00"
        s["loss_last"] += 0.004 * (-1) ** i          # night-to-night noise
        s["versions"]["torch"] = "2.13.0" if i < 2 else "2.14.1"
        if i == 4:                                      # the planted regression
            s["loss_last"] += 0.5
            s["status"], s["findings"], s["findings_by_code"] = "findings", 2, {"OC101": 1, "OC102": 1}
        (d / "summary.json").write_text(json.dumps(s))
    s = json.loads((real / "summary.json").read_text())
    s["started"], s["versions"]["torch"] = "2026-11-18T02:00:00+00:00", "2.13.0"
    (real / "summary.json").write_text(json.dumps(s))
    return base


def _row(stdout: str, night: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith(night + " "))


def test_history_marks_the_version_change_and_the_regression(nights, tmp_path):
    png = tmp_path / "history.png"
    rc, stdout, _ = run_cli(["history", str(nights), "--plot", str(png)])
    assert rc == exitcodes.CLEAN, stdout
    assert "<-" not in _row(stdout, "night1") + _row(stdout, "night2") + _row(stdout, "night4")
    assert _row(stdout, "night3").endswith("<- version: torch 2.13.0 → 2.14.1")
    last = _row(stdout, "night5")
    assert "new findings: OC101, OC102" in last and "loss regression" in last and "held-out" not in last
    assert "5 night(s), 2 marked" in stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_draws_the_same_marks(nights, tmp_path):
    from optcheck.report.history import mark_nights, plot_history, read_nights

    drawn = plot_history(mark_nights(read_nights([nights])), tmp_path / "h.png")
    assert drawn == ["night3: version: torch 2.13.0 → 2.14.1", "night5: new findings: OC101, OC102",
                     "night5: loss regression"]


def test_noise_alone_is_not_a_regression(nights):
    from optcheck.report.history import mark_nights, read_nights

    first_four = mark_nights(read_nights([nights / f"night{i}" for i in (1, 2, 4)]))
    assert [n.marks for n in first_four] == [[], [], ["version: torch 2.13.0 → 2.14.1"]]


@pytest.mark.parametrize("args,needle", [
    (["/nonexistent/run"], "/nonexistent/run: no such run directory"),
    (["--k", "0", "."], "--k 0.0: must be a positive number"),
])
def test_history_bad_input_is_one_line_exit_2(args, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, stdout, stderr = run_cli(["history", *args])
    assert rc == exitcodes.USAGE and needle in stdout + stderr


def test_folder_without_runs_is_refused(tmp_path):
    rc, stdout, stderr = run_cli(["history", str(tmp_path)])
    assert rc == exitcodes.USAGE and "no run directory in it" in stdout + stderr


def test_unreadable_summary_is_one_line_exit_2(tmp_path):
    (tmp_path / "night1").mkdir()
    (tmp_path / "night1" / "summary.json").write_text("{torn", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "optcheck", "history", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == exitcodes.USAGE
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "summary.json: unreadable" in err[0] and "Traceback" not in proc.stderr


def _history(args, prefix=()) -> subprocess.CompletedProcess:
    import os
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([*prefix, sys.executable, "-m", "optcheck", "history", *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.parametrize("field", ["peak_rss_bytes", "steps_per_s"])
def test_an_integer_beyond_int64_in_an_old_summary_is_one_line_exit_2(field, tmp_path):
    """Issue 35: 10^400 in an old-format summary was an OverflowError / ufunc 'isfinite' traceback."""
    shutil.copytree(NIGHTS, tmp_path / "nights")
    p = tmp_path / "nights" / "night-2-torch2.13" / "summary.json"
    s = json.loads(p.read_text())
    assert "summary_version" not in s  # the old format: its fields are typed loosely
    s[field] = 10 ** 400
    p.write_text(json.dumps(s))
    proc = _history([str(tmp_path / "nights")])
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == exitcodes.USAGE and "Traceback" not in proc.stderr, proc.stderr
    assert len(err) == 1 and f"summary.json: {field}: an integer of 401 digits, out of range" in err[0], err


def _unreadable(path: Path) -> tuple:
    """Make ``path`` unreadable to the command about to run; the prefix to run it with. As root
    (which reads every file) the folder goes to another user and the command runs without the
    capabilities that bypass file permissions (util-linux ``setpriv``)."""
    import os
    if os.geteuid() != 0:
        path.chmod(0)
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: no folder is unreadable")
    os.chown(path, 65534, 65534)
    path.chmod(0o700)
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search")


def test_an_unreadable_night_folder_is_left_out_with_a_note(tmp_path):
    """Issue 35: another user's night folder (mode 700) was a PermissionError traceback."""
    shutil.copytree(NIGHTS, tmp_path / "nights")
    other = tmp_path / "nights" / "night-3-torch2.13"
    prefix = _unreadable(other)
    try:
        proc = _history([str(tmp_path / "nights")], prefix)
        assert proc.returncode == exitcodes.CLEAN and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines() == [f"optcheck: note: {other}: cannot read (Permission denied); "
                                                    f"left out"]
        assert "4 night(s)" in proc.stdout and "night-3" not in proc.stdout
        named = _history([str(other)], prefix)  # named itself: one line, exit 2
        assert named.returncode == exitcodes.USAGE and named.stderr.strip().splitlines() == [
            f"optcheck: error: {other}: cannot read (Permission denied)"], named.stderr
    finally:
        other.chmod(0o700)


# -- five recorded nights (tests/fixtures/nights/README.md): real runs, torch 2.13.0 -> 2.14.1 ------------

NIGHTS = Path(__file__).resolve().parents[1] / "fixtures" / "nights"
UPGRADE = "version: torch 2.13.0+cpu → 2.14.1+cu130"


def test_recorded_nights_mark_the_torch_upgrade_and_the_planted_regression(tmp_path):
    png = tmp_path / "history.png"
    rc, stdout, _ = run_cli(["history", str(NIGHTS), "--plot", str(png)])
    assert rc == exitcodes.CLEAN, stdout
    for n in (1, 2, 3):
        assert "<-" not in _row(stdout, f"night-{n}-torch2.13")
    assert _row(stdout, "night-4-torch2.14").endswith(
        f"<- {UPGRADE}; steps/s regression; peak RSS regression")   # the cu130 wheel loads CUDA on CPU too
    assert _row(stdout, "night-5-torch2.14-re").endswith(
        "<- new findings: OC101, OC102, OC104; loss regression; held-out loss regression")
    assert "5 night(s), 2 marked" in stdout
    from matplotlib.image import imread

    img = imread(png)
    assert img.shape[:2] == (900, 1200) and img[..., :3].std() > 0.05   # drawn, not blank


def test_recorded_nights_plot_marks_the_same_nights(tmp_path):
    from optcheck.report.history import history_figure, mark_nights, read_nights

    nights = mark_nights(read_nights([NIGHTS]))
    fig, drawn = history_figure(nights)
    assert drawn == [f"night-4-torch2.14: {UPGRADE}", "night-4-torch2.14: steps/s regression",
                     "night-4-torch2.14: peak RSS regression",
                     "night-5-torch2.14-regression: new findings: OC101, OC102, OC104",
                     "night-5-torch2.14-regression: loss regression",
                     "night-5-torch2.14-regression: held-out loss regression"]
    loss_ax, speed_ax, rss_ax, findings_ax = fig.axes
    # the version change: a dashed line between night 3 (x=2) and night 4 (x=3) on every axis, labelled on the loss axis
    for ax in fig.axes:
        assert [tuple(line.get_xdata()) for line in ax.lines if line.get_linestyle() == "--"] == [(2.5, 2.5)]
    assert [t.get_text() for t in loss_ax.texts if "→" in t.get_text()] == ["torch 2.13.0+cpu → 2.14.1+cu130"]
    # the regressions: red crosses at night 5's losses, night 4's steps/s and peak RSS
    crosses = lambda ax: [(float(x.get_xdata()[0]), float(x.get_ydata()[0]))  # noqa: E731
                          for x in ax.lines if x.get_marker() == "x" and x.get_color() == "red"]
    n5, n4 = nights[4], nights[3]
    assert crosses(loss_ax) == [(4.0, n5.loss_last), (4.0, n5.val_loss_last)]
    assert crosses(speed_ax) == [(3.0, n4.steps_per_s)]
    assert crosses(rss_ax) == [(3.0, n4.peak_rss_bytes / 2**20)]
    assert [(t.get_text(), t.xy[0]) for t in findings_ax.texts] == [("new findings: OC101, OC102, OC104", 4)]


def test_recorded_nights_are_small():
    total = sum(f.stat().st_size for f in NIGHTS.rglob("*") if f.is_file())
    assert total < 500_000
