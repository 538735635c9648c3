"""The trend of a soak night by night: one row per run directory, with the
nights a library version changed and the nights that regressed marked. Torch-free.

Each night is read from its run directory's ``summary.json`` (through
``optcheck.report.reader``): final loss, final held-out loss, steps/s, peak
RSS, number of findings and their codes, versions. Nights are ordered by their
``started`` time (ISO 8601 UTC), then by folder name.

Marks (a night can carry several):

- ``version``: a library version differs from the previous night's
  (``torch 2.13.0 → 2.14.1``); keys compared: torch, torchsharp, dotnet, python, numpy.
- ``new findings``: the night has finding codes the previous night did not have.
- ``loss regression``: the final loss or the final held-out loss is above
  ``median + k · spread`` of all earlier nights' values, where
  ``spread = max(1.4826 · MAD, REL_FLOOR · |median|)`` (MAD: median absolute
  deviation; 1.4826 makes it estimate the standard deviation of normal noise;
  the floor keeps nights that repeat the same value from flagging noise).
  Needs ``MIN_NIGHTS`` earlier nights; ``k`` is ``K_MAD`` (default 5) unless
  given. Lower is better for both losses, so only a rise is marked.
- ``steps/s regression`` / ``peak RSS regression``: a step change: worse than
  the previous night by more than ``PERF_FLOOR`` (15 %, ``optcheck.judge.baseline``'s
  default tolerance) and beyond the band of all earlier nights (as for the
  losses, with the spread at least ``PERF_FLOOR / k`` of the median: step times
  move by +-20 % on a shared runner from load alone). A new level is marked on
  the night it appears, not again on the nights that keep it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from optcheck.report.reader import read_summary, run_dirs
from optcheck.report.text import num_text
from optcheck.units import format_bytes

VERSION_KEYS = ("torch", "torchsharp", "dotnet", "python", "numpy")
K_MAD = 5.0
REL_FLOOR = 0.01
MIN_NIGHTS = 2
#: Smallest band of steps/s and peak RSS, relative to the median (see the module docstring).
PERF_FLOOR = 0.15


@dataclass
class Night:
    """One run directory's figures. Losses in nats/token; ``peak_rss_bytes`` in bytes."""

    path: Path
    run: str
    started: str
    status: str
    loss_last: float | None
    val_loss_last: float | None
    steps_per_s: float | None
    peak_rss_bytes: int | None
    findings: int
    codes: list[str]
    versions: dict
    marks: list[str] = field(default_factory=list)


def read_nights(paths, skipped: list[str] | None = None) -> list[Night]:
    """The nights of ``paths`` (run directories, or folders of them), oldest first;
    a subfolder that cannot be read is named in ``skipped`` (``optcheck.report.reader.run_dirs``).

    Raises:
        InputError: a path that is not a run directory nor holds one, or cannot be read; a
            ``summary.json`` that is unreadable or of the wrong shape (an integer beyond
            int64 included).
    """
    nights = []
    for p in run_dirs(paths, skipped):
        s = read_summary(p)
        nights.append(Night(path=p, run=str(s.get("run") or p.name), started=str(s.get("started") or ""),
                            status=str(s.get("status") or "?"), loss_last=s.get("loss_last"),
                            val_loss_last=s.get("val_loss_last"), steps_per_s=s.get("steps_per_s"),
                            peak_rss_bytes=s.get("peak_rss_bytes"), findings=int(s.get("findings") or 0),
                            codes=sorted((s.get("findings_by_code") or {}).keys()),
                            versions={k: str(v) for k, v in (s.get("versions") or {}).items() if k in VERSION_KEYS}))
    nights.sort(key=lambda n: (n.started, n.path.name))
    return nights


def _above_band(earlier: list, value, k: float, floor: float | None = None, lower: bool = False) -> bool:
    """``value`` beyond ``median + k * spread`` of ``earlier`` (below ``median - k * spread``
    with ``lower``); the spread is at least ``REL_FLOOR`` of the median, or with ``floor``
    at least ``floor / k`` of it."""
    xs = np.array([v for v in earlier if isinstance(v, (int, float))], dtype=float)
    xs = xs[np.isfinite(xs)]
    if len(xs) < MIN_NIGHTS or not isinstance(value, (int, float)):
        return False
    med = float(np.median(xs))
    rel = REL_FLOOR if floor is None else floor / k
    spread = max(1.4826 * float(np.median(np.abs(xs - med))), rel * abs(med))
    return bool(value < med - k * spread) if lower else bool(value > med + k * spread)


def mark_nights(nights: list[Night], k: float = K_MAD) -> list[Night]:
    """Set each night's ``marks`` (see the module docstring for the criteria); returns ``nights``."""
    for i, n in enumerate(nights):
        n.marks = []
        if i == 0:
            continue
        prev = nights[i - 1]
        changed = [f"{key} {prev.versions.get(key, '-')} → {n.versions.get(key, '-')}" for key in VERSION_KEYS
                   if prev.versions.get(key) != n.versions.get(key)]
        if changed:
            n.marks.append("version: " + ", ".join(changed))
        new = [c for c in n.codes if c not in prev.codes]
        if new:
            n.marks.append("new findings: " + ", ".join(new))
        earlier = nights[:i]
        for label, attr in (("loss", "loss_last"), ("held-out loss", "val_loss_last")):
            if _above_band([getattr(e, attr) for e in earlier], getattr(n, attr), k):
                n.marks.append(f"{label} regression")
        for label, attr, lower in (("steps/s", "steps_per_s", True), ("peak RSS", "peak_rss_bytes", False)):
            v, before = getattr(n, attr), getattr(prev, attr)
            step = isinstance(v, (int, float)) and isinstance(before, (int, float)) and \
                (v < before * (1 - PERF_FLOOR) if lower else v > before * (1 + PERF_FLOOR))
            if step and _above_band([getattr(e, attr) for e in earlier], v, k, PERF_FLOOR, lower):
                n.marks.append(f"{label} regression")
    return nights


def render_history(nights: list[Night]) -> str:
    """The nights as a text table, one line per night, marks after ``<-``."""
    head = f"{'night':<20} {'status':<9} {'loss':>8} {'held-out':>8} {'steps/s':>8} {'peak RSS':>10} {'findings':>8}  versions"
    lines = [head]
    for n in nights:
        ver = ", ".join(f"{k} {v}" for k, v in n.versions.items() if k != "numpy")
        rss = format_bytes(n.peak_rss_bytes) if isinstance(n.peak_rss_bytes, (int, float)) \
            and np.isfinite(n.peak_rss_bytes) else "-"
        line = (f"{n.run[:20]:<20} {n.status:<9} {num_text(n.loss_last):>8} {num_text(n.val_loss_last):>8} "
                f"{num_text(n.steps_per_s, '{:.2f}'):>8} {rss:>10} {n.findings:>8}  {ver}")
        if n.marks:
            line += "   <- " + "; ".join(n.marks)
        lines.append(line)
    marked = sum(1 for n in nights if n.marks)
    lines.append(f"{len(nights)} night(s), {marked} marked")
    return "\n".join(lines)


def plot_history(nights: list[Night], png_path: str | os.PathLike, *, dpi: int = 100) -> list[str]:
    """A PNG of :func:`history_figure`.

    Returns:
        the labels drawn, as ``"<run>: <mark>"``, in night order.

    Raises:
        OSError: the file cannot be written.
    """
    fig, drawn = history_figure(nights, dpi=dpi)
    fig.savefig(Path(png_path), format="png")
    return drawn


def history_figure(nights: list[Night], *, dpi: int = 100):
    """The trend as a matplotlib ``Figure`` of four axes sharing x (one tick per night):
    losses, steps/s, peak RSS (MiB) and findings; a dashed vertical line at each version
    change on every axis, annotated with the change on the loss axis; a red cross and a
    red label on the loss axis at each loss regression, and a red label over the findings
    bar of each night with new findings.

    Returns:
        (figure, the labels drawn as ``"<run>: <mark>"`` in night order).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    x = np.arange(len(nights))
    drawn: list[str] = []
    fig = Figure(figsize=(12, 9), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(4, 1, sharex=True)

    def arr(attr, scale=1.0):
        return np.array([getattr(n, attr) / scale if isinstance(getattr(n, attr), (int, float)) else np.nan
                         for n in nights], dtype=float)

    axes[0].plot(x, arr("loss_last"), "o-", label="final loss")
    axes[0].plot(x, arr("val_loss_last"), "s-", label="final held-out loss")
    axes[0].set_ylabel("loss")
    axes[1].plot(x, arr("steps_per_s"), "o-", color="tab:green")
    axes[1].set_ylabel("steps/s")
    axes[2].plot(x, arr("peak_rss_bytes", 2**20), "o-", color="tab:purple")
    axes[2].set_ylabel("peak RSS (MiB)")
    axes[3].bar(x, [n.findings for n in nights], color="tab:orange")
    axes[3].set_ylabel("findings")
    for i, n in enumerate(nights):
        for m in n.marks:
            drawn.append(f"{n.run}: {m}")
            if m.startswith("version"):
                for ax in axes:
                    ax.axvline(i - 0.5, color="grey", linestyle="--")
                axes[0].annotate(m.removeprefix("version: "), (i - 0.5, 1.0), xycoords=("data", "axes fraction"),
                                 fontsize=8, va="top", ha="left", rotation=0)
            else:
                ax, y = next(((axes[j], v) for key, j, v in (
                    ("held-out loss", 0, n.val_loss_last), ("loss", 0, n.loss_last), ("steps/s", 1, n.steps_per_s),
                    ("peak RSS", 2, n.peak_rss_bytes / 2**20 if isinstance(n.peak_rss_bytes, (int, float)) else None))
                    if m.startswith(key) and isinstance(v, (int, float))), (None, None))
                if ax is not None:
                    ax.plot([i], [y], "x", color="red", markersize=14, mew=3)
                    ax.annotate(m, (i, y), fontsize=8, color="red", xytext=(5, 5), textcoords="offset points")
                else:
                    axes[3].annotate(m, (i, n.findings), fontsize=8, color="red", xytext=(0, 3),
                                     textcoords="offset points", ha="center")
    axes[0].legend(loc="lower left", fontsize=8)
    axes[3].set_xticks(x, [n.run for n in nights], rotation=30, ha="right", fontsize=8)
    fig.suptitle("optcheck history: night by night")
    fig.tight_layout()
    return fig, drawn
