"""A PNG of a run: loss, step time and memory over steps, findings marked. Torch-free.

Drawn with matplotlib's Agg canvas directly (no pyplot, no display, no global
backend switch), so it works on a headless CI machine and inside a process that
has already chosen another backend. matplotlib is the optional extra ``plot``
(``pip install 'optcheck[plot]'``); only ``--plot`` needs it. The run is read
through :class:`optcheck.report.reader.RunReader`, like ``check`` and ``compare``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from optcheck.errors import InputError
from optcheck.report.reader import RunReader
from optcheck.series import moving_mean, subsample
from optcheck.record.snapshot import to_float

MAX_POINTS = 4000          # raw series are thinned to about this many points
MAX_MARKED_FINDINGS = 24   # vertical lines drawn; the rest are counted in the legend
MiB = 2**20


def require_matplotlib(option: str = "--plot") -> None:
    """Raise :class:`InputError` (one line, exit 2) when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(f"{option} needs matplotlib, which is not installed: "
                         f"pip install 'optcheck[plot]' (or matplotlib)") from None


def _thin(x: np.ndarray, *ys: np.ndarray) -> tuple[np.ndarray, ...]:
    idx = subsample(len(x), MAX_POINTS)
    return (x[idx], *(y[idx] for y in ys))


def _centred(v: np.ndarray, window: int = 50) -> np.ndarray:
    return moving_mean(v, window, align="centred")[0]


def _series(records: list[dict], key: str, source=lambda r, k: r.get(k)) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for r in records:
        try:
            v = to_float(source(r, key))
        except (TypeError, ValueError):
            v = None
        if v is not None and "step" in r:
            xs.append(float(r["step"]))
            ys.append(v)
    return np.asarray(xs), np.asarray(ys)


def plot_run(run_dir: str | os.PathLike, png_path: str | os.PathLike, *, width_px: int = 1400,
             dpi: int = 100) -> Path:
    """Draw ``run_dir``'s loss, step time and memory over steps into ``png_path``.

    Panels (shared step axis): training loss (raw and a centred 50-step moving mean,
    held-out loss as dots), step time in ms (``metrics.jsonl``) and memory in MiB
    (``rss_bytes`` and, when recorded, ``live_tensor_bytes`` of the snapshots).
    Each finding is a vertical line labelled with its code at its step (the
    first ``MAX_MARKED_FINDINGS``); a crash is a red line at its step.

    Returns:
        The PNG's path. Its size is ``width_px`` x ~0.64 ``width_px`` pixels.

    Raises:
        InputError: ``run_dir`` is not a run directory (no metrics or snapshots),
            a record in it is unreadable (as :class:`RunReader`), matplotlib is
            missing, or the PNG cannot be written.
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    reader = RunReader(run_dir, purpose="plot")
    run = reader.path
    metrics, snaps = reader.metrics, reader.snapshots
    if not metrics and not snaps:
        raise InputError(f"{run_dir}: nothing to plot (no metrics.jsonl or snapshots.jsonl records)")
    findings, summary = reader.findings, reader.summary

    fig = Figure(figsize=(width_px / dpi, 0.64 * width_px / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    ax_loss, ax_time, ax_mem = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.5, 2]})

    # loss
    x, y = _series(metrics, "loss")
    if len(x) == 0:
        x, y = _series(snaps, "loss")
    if len(x):
        order = np.argsort(x, kind="stable")
        x, y = x[order], y[order]
        ma = _centred(y)
        tx, ty, tma = _thin(x, y, ma)
        ax_loss.plot(tx, ty, color="0.75", lw=0.6, label="loss")
        ax_loss.plot(tx, tma, color="C0", lw=1.6, label="loss, 50-step moving mean")
    vx, vy = _series(snaps, "val_loss")
    if len(vx):
        ax_loss.plot(vx, vy, "o", color="C1", ms=4, label="held-out loss")
    if not len(x) and not len(vx):
        ax_loss.text(0.5, 0.5, "no loss recorded", transform=ax_loss.transAxes, ha="center", color="0.5")
    ax_loss.set_ylabel("loss")

    # step time
    tx_, ts = _series(metrics, "step_time_s")
    if len(tx_) == 0:
        tx_, ts = _series(snaps, "step_time_s")
    if len(tx_):
        order = np.argsort(tx_, kind="stable")
        tx_, ts = tx_[order], ts[order] * 1000
        a, b, m = _thin(tx_, ts, _centred(ts))
        ax_time.plot(a, b, color="0.75", lw=0.5)
        ax_time.plot(a, m, color="C2", lw=1.4, label="step time, 50-step moving mean")
        finite = ts[np.isfinite(ts)]
        if len(finite):  # keep one slow step (a checkpoint, the first step) from flattening the rest
            ax_time.set_ylim(0, max(float(np.percentile(finite, 99.5)) * 1.3, 1e-3))
    else:
        ax_time.text(0.5, 0.5, "no step times recorded", transform=ax_time.transAxes, ha="center", color="0.5")
    ax_time.set_ylabel("step (ms)")

    # memory
    mem = lambda r, k: (r.get("memory") or {}).get(k)  # noqa: E731
    mx, rss = _series(snaps, "rss_bytes", mem)
    if len(mx):
        ax_mem.plot(mx, rss / MiB, color="C3", lw=1.4, marker="." if len(mx) < 200 else None, label="RSS")
    lx, lb = _series(snaps, "live_tensor_bytes", mem)
    if len(lx):
        ax_mem.plot(lx, lb / MiB, color="C4", lw=1.0, marker="." if len(lx) < 200 else None, label="live tensors")
    if not len(mx) and not len(lx):
        ax_mem.text(0.5, 0.5, "no memory recorded", transform=ax_mem.transAxes, ha="center", color="0.5")
    ax_mem.set_ylabel("memory (MiB)")
    ax_mem.set_xlabel("step")

    # findings and crash
    marked: dict[tuple, bool] = {}
    for f in findings:
        step = f.get("step")
        if not isinstance(step, (int, float)) or not math.isfinite(step):
            continue
        k = (f.get("code"), int(step))
        if k in marked or len(marked) >= MAX_MARKED_FINDINGS:
            continue
        marked[k] = True
    color = {"error": "crimson", "warning": "darkorange", "info": "0.4"}
    sev = {(f.get("code"), f.get("step")): f.get("severity") for f in findings}
    for i, (code, step) in enumerate(marked):
        c = color.get(sev.get((code, step)), "darkorange")
        for ax in (ax_loss, ax_time, ax_mem):
            ax.axvline(step, color=c, lw=1.0, ls="--", alpha=0.8)
        ax_loss.annotate(code, xy=(step, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -10 - 11 * (i % 4)),
                         textcoords="offset points", fontsize=8, color=c, rotation=0)
    crash = summary.get("crash") or {}
    if isinstance(crash.get("step"), (int, float)):
        for ax in (ax_loss, ax_time, ax_mem):
            ax.axvline(crash["step"], color="red", lw=2.0)
        what = crash.get("exc_type") or (f"signal {crash.get('signal')}" if crash.get("signal") else "crash")
        ax_loss.annotate(f"crash: {str(what).rsplit('.', 1)[-1]}", xy=(crash["step"], 0.02),
                         xycoords=("data", "axes fraction"), xytext=(-4, 4), textcoords="offset points",
                         ha="right", fontsize=9, color="red")

    for ax in (ax_loss, ax_time, ax_mem):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    n_find = len(findings)
    extra = f" ({len(marked)} marked)" if n_find > len(marked) else ""
    device = (summary.get("versions") or {}).get("device")  # "cpu", "cuda:0 NVIDIA H100 ..." (docs/gpu.md)
    title = (f"{summary.get('run') or run.name} — {summary.get('backend') or '?'}"
             f"{f' on {device}' if device else ''}, "
             f"{summary.get('status') or 'no summary'}, {n_find} finding(s){extra}")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out = Path(png_path)
    try:
        if out.parent and not out.parent.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png")
    except OSError as e:
        raise InputError(f"--plot {png_path}: cannot write there ({e.strerror or e})") from None
    return out
