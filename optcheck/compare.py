"""Compare two run directories: for upgrade and backend validation. Torch-free.

``compare_runs(A, B)`` reads what a soak (or a Monitor) wrote — ``metrics.jsonl``,
``findings.jsonl``, ``snapshots.jsonl``, ``summary.json`` (``optcheck.report.rundir``)
— and answers: the verdict first (identical, within numerical noise, or diverged,
from ``optcheck.verdict``, the one function ``optcheck upgrade`` uses too; OC601
when diverged), which findings
does one run have and the other not, how do step time and peak memory compare,
and which library versions ran. ``optcheck compare RUN_A RUN_B`` prints it.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from optcheck.errors import InputError
from optcheck.exitcodes import CLEAN, FINDINGS
from optcheck.report.text import num_text, versions_text
from optcheck.findings import Finding
from optcheck.report.records import read_findings, read_metrics, read_summary
from optcheck.rules.parity import RunDivergence
from optcheck.snapshot import StreamDefect, read_jsonl, to_float
from optcheck.units import format_bytes
from optcheck.verdict import Verdict, judge, same_batches

#: Defaults: two clean soaks of the built-in GPT with different seeds stay well
#: inside them; --lr 10x either way or another optimizer leave them.
DEFAULT_RTOL = 0.05
DEFAULT_ATOL = 0.03
DEFAULT_WINDOW = 50


@dataclass
class RunInfo:
    """What ``compare`` reads of one run directory.

    Attributes:
        path: the run directory.
        label: short name shown in tables ("A: runs/x").
        backend, status: from ``summary.json`` ("" when absent).
        versions: library versions (summary, else the first snapshot).
        steps: training steps with a loss in ``metrics.jsonl``.
        last_step: the last of them (0 if none).
        loss_first, loss_last: first and last training loss.
        step_time_s: median seconds per step (``metrics.jsonl``), or None.
        peak_rss_bytes: the summary's ``peak_rss_bytes``, else the largest
            ``memory.rss_bytes`` of the snapshots, or None.
        crash: the summary's crash record, or None.
        steps_requested: the summary's ``steps_requested`` (None if absent).
        defects: lines of its record files that were not JSON (skipped), as
            ``"metrics.jsonl:12: not a JSON line (...)"``.
    """

    path: str
    label: str = ""
    backend: str = ""
    status: str = ""
    versions: dict = field(default_factory=dict)
    steps: int = 0
    last_step: int = 0
    loss_first: float | None = None
    loss_last: float | None = None
    step_time_s: float | None = None
    peak_rss_bytes: float | None = None
    crash: dict | None = None
    steps_requested: int | None = None
    defects: list[str] = field(default_factory=list)

    def incomplete(self) -> str | None:
        """Why this run cannot be compared as a finished run (None when it can):
        its status is crashed, interrupted, running or stopped, or it stopped
        short of the steps it asked for."""
        if self.status and self.status not in COMPLETE:
            where = f" at step {self.last_step:,}" + (f" of {self.steps_requested:,}" if self.steps_requested else "")
            return f"{self.status}{where}"
        if self.steps_requested and self.last_step < self.steps_requested:
            return f"incomplete: {self.last_step:,} of {self.steps_requested:,} steps"
        return None


#: Statuses of a run that ended as planned.
COMPLETE = ("clean", "findings")


@dataclass
class LossComparison:
    """The two loss trajectories, aligned by step.

    Attributes:
        window: trailing-mean window (steps present in both runs).
        common_steps: steps present in both runs.
        compared: smoothed points compared (common steps from the ``window``-th on).
        max_abs_diff, max_abs_step: largest |mean_A - mean_B| and its step.
        max_rel_diff, max_rel_step: largest |mean_A - mean_B| / |mean_A| and its step.
        first_beyond_step: first step where |diff| > atol + rtol x |mean_A|, or None.
        mean_a, mean_b, tolerance: the smoothed losses and the tolerance there.
    """

    window: int
    common_steps: int
    compared: int
    max_abs_diff: float
    max_abs_step: int | None
    max_rel_diff: float
    max_rel_step: int | None
    first_beyond_step: int | None = None
    mean_a: float | None = None
    mean_b: float | None = None
    tolerance: float | None = None

    @property
    def diverged(self) -> bool:
        return self.first_beyond_step is not None


@dataclass
class CompareResult:
    """Everything ``optcheck compare`` reports; :meth:`render` is the table.

    Attributes:
        a, b: the two runs.
        rtol, atol, window: the tolerance used.
        loss: the trajectory comparison.
        only_in_a, only_in_b: findings (code, symbol, subjects, step, message) one
            run has and the other not, matched by code and subjects.
        step_time_ratio: median step time B / A (None if either is missing).
        peak_memory_ratio: peak RSS B / A (None if either is missing).
        findings: the OC601 finding when the verdict is ``diverged``.
        verdict: identical / within numerical noise / diverged (``optcheck.verdict.judge``).
        incomplete: why a run cannot pass ("B: crashed at step 200 of 5,000",
            "B: shorter than A: 200 of 5,000 steps"), empty when both are complete.
        exit_code: ``optcheck.exitcodes.FINDINGS`` when there is a finding, a run
            is incomplete (or, with ``fail_on_new``, a finding only in B), else ``CLEAN``.
    """

    a: RunInfo
    b: RunInfo
    rtol: float
    atol: float
    window: int
    loss: LossComparison
    only_in_a: list[dict]
    only_in_b: list[dict]
    step_time_ratio: float | None
    peak_memory_ratio: float | None
    findings: list[Finding]
    exit_code: int
    incomplete: list[str] = field(default_factory=list)
    verdict: Verdict | None = None

    @property
    def diverged(self) -> bool:
        return self.verdict.diverged if self.verdict is not None else self.loss.diverged

    def to_dict(self) -> dict:
        d = asdict(self)
        d["findings"] = [f.to_dict() for f in self.findings]
        d["diverged"] = self.diverged
        return d

    def to_json(self) -> str:
        return json.dumps(_finite(self.to_dict()), indent=2)

    def render(self) -> str:
        """The comparison as a plain-text table (a few dozen lines)."""
        return render(self)


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


# -- reading a run -------------------------------------------------------------

def _losses(path: Path, defects: list[StreamDefect]) -> tuple[dict[int, float], list[float]]:
    """{step: loss} (the last record of a step wins) and the step times of metrics.jsonl
    (checked against ``optcheck/schemas/metrics-1.json``; InputError naming line and field)."""
    losses: dict[int, float] = {}
    times: list[float] = []
    for rec in read_metrics(path, defects):
        loss = to_float(rec.get("loss"))
        if loss is not None:
            losses[rec["step"]] = loss
        t = to_float(rec.get("step_time_s"))
        if t is not None and math.isfinite(t) and t > 0:
            times.append(t)
    return losses, times


def _snapshot_facts(path: Path) -> tuple[float | None, dict]:
    """Peak ``memory.rss_bytes`` and the first ``versions`` of snapshots.jsonl."""
    f = path / "snapshots.jsonl"
    peak, versions = None, {}
    if not f.exists():
        return peak, versions
    try:
        for rec in read_jsonl(f, defects=[]):
            if isinstance(rec, dict) and rec.get("type") == "snapshot":
                rec = rec.get("snapshot")
            if not isinstance(rec, dict):
                continue
            if not versions and isinstance(rec.get("versions"), dict):
                versions = {str(k): str(v) for k, v in rec["versions"].items()}
            mem = rec.get("memory")
            rss = mem.get("rss_bytes") if isinstance(mem, dict) else None
            rss = float(rss) if isinstance(rss, (int, float)) and not isinstance(rss, bool) else None
            if rss is not None and math.isfinite(rss) and (peak is None or rss > peak):
                peak = rss
    except (ValueError, OSError) as e:
        raise InputError(f"{f}: unreadable ({e})") from None
    return peak, versions


def read_snapshots(path: str | os.PathLike) -> list[dict]:
    """The snapshot dicts of run directory ``path`` (``[]`` without snapshots.jsonl; lines that
    are not JSON are skipped, as :func:`read_run` notes them)."""
    f = Path(path) / "snapshots.jsonl"
    if not f.exists():
        return []
    try:
        recs = read_jsonl(f, defects=[])
    except (ValueError, OSError) as e:
        raise InputError(f"{f}: unreadable ({e})") from None
    out = []
    for rec in recs:
        if isinstance(rec, dict) and rec.get("type") == "snapshot":
            rec = rec.get("snapshot")
        if isinstance(rec, dict):
            out.append(rec)
    return out


def read_run(path: str | os.PathLike, label: str = "") -> tuple[RunInfo, dict[int, float], list[dict]]:
    """Read run directory ``path``: (RunInfo, {step: loss}, findings as dicts).

    Raises:
        InputError: ``path`` is not a directory, or holds neither ``metrics.jsonl``
            nor ``summary.json``, or a file in it is unreadable.
    """
    p = Path(path)
    if not p.is_dir():
        raise InputError(f"{path}: no such run directory")
    if not (p / "metrics.jsonl").exists() and not (p / "summary.json").exists():
        raise InputError(f"{path}: not a run directory (no metrics.jsonl or summary.json); "
                         f"give the --out directory of `optcheck soak` or of an optcheck.Monitor")
    summary: dict = read_summary(p) if (p / "summary.json").exists() else {}
    defects: dict[str, list[StreamDefect]] = {"metrics.jsonl": [], "findings.jsonl": []}
    losses, times = _losses(p, defects["metrics.jsonl"])
    peak = float(summary["peak_rss_bytes"]) if isinstance(summary.get("peak_rss_bytes"), (int, float)) else None
    snap_versions: dict = {}
    if peak is None or not summary.get("versions"):  # a run without a (final) summary: read the snapshots
        snap_peak, snap_versions = _snapshot_facts(p)
        peak = snap_peak if peak is None else peak
    findings = read_findings(p, defects["findings.jsonl"])
    steps = sorted(losses)
    info = RunInfo(
        path=str(p), label=label or str(p), backend=summary.get("backend") or "",
        status=summary.get("status") or "", versions=summary.get("versions") or snap_versions,
        steps=len(steps), last_step=steps[-1] if steps else int(summary.get("last_step") or 0),
        loss_first=losses[steps[0]] if steps else None, loss_last=losses[steps[-1]] if steps else None,
        step_time_s=float(np.median(times)) if times else None, peak_rss_bytes=peak,
        crash=summary.get("crash") or None, steps_requested=summary.get("steps_requested"),
        defects=[f"{name}:{d.line}: {d.reason}" for name, ds in defects.items() for d in ds])
    return info, losses, findings


# -- the comparison -----------------------------------------------------------

def _trailing_mean(v: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Trailing means over ``window`` points of the finite values, and the count of
    non-finite values in each window; both of length len(v) - window + 1."""
    finite = np.isfinite(v)
    c_val = np.concatenate([[0.0], np.cumsum(np.where(finite, v, 0.0))])
    c_ok = np.concatenate([[0], np.cumsum(finite)])
    sums = c_val[window:] - c_val[:-window]
    oks = c_ok[window:] - c_ok[:-window]
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums / oks
    return means, window - oks


def compare_losses(loss_a: dict[int, float], loss_b: dict[int, float], *, rtol: float = DEFAULT_RTOL,
                   atol: float = DEFAULT_ATOL, window: int = DEFAULT_WINDOW) -> LossComparison:
    """Compare two loss trajectories ``{step: loss}`` on the steps both have.

    Each is smoothed with a trailing mean over ``window`` common steps (fewer
    when there are fewer common steps); the smoothed point at a step is beyond
    tolerance when ``|mean_A - mean_B| > atol + rtol x |mean_A|``, or when only one
    run has a non-finite loss in the window.

    Raises:
        InputError: the runs have no step in common, or ``window`` < 1.
    """
    if window < 1:
        raise InputError(f"--window must be at least 1, got {window}")
    common = sorted(set(loss_a) & set(loss_b))
    if not common:
        raise InputError("the two runs have no training step in common: nothing to compare "
                         "(is metrics.jsonl empty in one of them?)")
    w = min(window, len(common))
    a = np.array([loss_a[s] for s in common], float)
    b = np.array([loss_b[s] for s in common], float)
    ma, bad_a = _trailing_mean(a, w)
    mb, bad_b = _trailing_mean(b, w)
    steps = np.array(common[w - 1:])
    one_sided = (bad_a > 0) != (bad_b > 0)
    with np.errstate(invalid="ignore"):
        diff = np.abs(ma - mb)
    diff = np.where(one_sided, np.inf, diff)
    diff = np.where(~one_sided & ~np.isfinite(diff), 0.0, diff)  # both non-finite throughout: no verdict
    tol = atol + rtol * np.abs(np.nan_to_num(ma, nan=0.0, posinf=0.0, neginf=0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(np.abs(ma) > 0, diff / np.abs(ma), np.where(diff > 0, np.inf, 0.0))
    i_abs, i_rel = int(np.argmax(diff)), int(np.argmax(rel))
    out = LossComparison(window=w, common_steps=len(common), compared=len(steps),
                         max_abs_diff=float(diff[i_abs]), max_abs_step=int(steps[i_abs]),
                         max_rel_diff=float(rel[i_rel]), max_rel_step=int(steps[i_rel]))
    beyond = np.nonzero(diff > tol)[0]
    if len(beyond):
        i = int(beyond[0])
        out.first_beyond_step = int(steps[i])
        out.mean_a, out.mean_b, out.tolerance = float(ma[i]), float(mb[i]), float(tol[i])
    return out


_REF = re.compile(r"<ref -?\d+>")


def _finding_key(f: dict) -> tuple[str, tuple[str, ...]]:
    subjects = tuple(sorted(_REF.sub("<ref>", str(s)) for s in f.get("subjects") or ()))
    return f.get("code", ""), subjects


def _difference(xs: list[dict], ys: list[dict]) -> list[dict]:
    """Findings of ``xs`` whose (code, subjects) no finding of ``ys`` has; first occurrence each."""
    other = {_finding_key(f) for f in ys}
    out, seen = [], set()
    for f in xs:
        k = _finding_key(f)
        if k in other or k in seen:
            continue
        seen.add(k)
        out.append({"code": f.get("code", ""), "symbol": f.get("symbol", ""), "subjects": list(f.get("subjects") or []),
                    "step": f.get("step"), "message": f.get("message", "")})
    return out


def _ratio(b: float | None, a: float | None) -> float | None:
    if a is None or b is None or not a or not math.isfinite(a) or not math.isfinite(b):
        return None
    return b / a


def compare_runs(run_a: str | os.PathLike, run_b: str | os.PathLike, *, loss_rtol: float = DEFAULT_RTOL,
                 loss_atol: float = DEFAULT_ATOL, window: int = DEFAULT_WINDOW,
                 fail_on_new: bool = False) -> CompareResult:
    """Compare run directories ``run_a`` (the reference) and ``run_b``.

    Args:
        run_a, run_b: run directories written by ``optcheck soak`` or a Monitor.
        loss_rtol, loss_atol: tolerance of the smoothed losses (relative to A's,
            and absolute, in loss units: nats per token for the built-in GPT).
        window: trailing-mean window in steps.
        fail_on_new: also return the findings exit code when B has findings A has not.

    Two runs whose ``summary.json`` configs record the same seed, batch shape and corpus
    are judged step by step against the numerical-noise tolerance
    (``optcheck.verdict.noise_tolerance``, not the seed-noise ``loss_rtol``/``loss_atol``);
    other pairs against the smoothed tolerance.

    Returns:
        A :class:`CompareResult`; ``findings`` holds one OC601 finding when the
        verdict is ``diverged``, at its first step.

    Raises:
        InputError: a path is not a run directory, a file in it is unreadable, the
            runs share no step, or a tolerance is negative.
    """
    for name, v in (("--tolerance", loss_rtol), ("--atol", loss_atol)):
        if not math.isfinite(v) or v < 0:
            raise InputError(f"{name} {v}: must be a finite number >= 0")
    pa, pb = Path(run_a), Path(run_b)
    la, lb = ("A: " + pa.name, "B: " + pb.name) if pa.name != pb.name else ("A: " + str(pa), "B: " + str(pb))
    a, loss_a, find_a = read_run(pa, la)
    b, loss_b, find_b = read_run(pb, lb)
    loss = compare_losses(loss_a, loss_b, rtol=loss_rtol, atol=loss_atol, window=window)
    sum_a = read_summary(pa) if (pa / "summary.json").exists() else {}
    sum_b = read_summary(pb) if (pb / "summary.json").exists() else {}
    verdict = judge(loss_a, loss_b, same_seed=same_batches(sum_a, sum_b), snaps_a=read_snapshots(pa),
                    snaps_b=read_snapshots(pb), summary_a=sum_a, summary_b=sum_b, smoothed=loss)
    only_a, only_b = _difference(find_a, find_b), _difference(find_b, find_a)
    findings = []
    if verdict.diverged:
        findings.append(_divergence(verdict, loss, a, b, pa, pb, loss_rtol, loss_atol))
    incomplete = [f"{name}: {why}" for name, why in (("A", a.incomplete()), ("B", b.incomplete())) if why]
    for short, long_, name in ((a, b, "A"), (b, a, "B")):
        if short.last_step < long_.last_step:
            incomplete.append(f"{name}: shorter than the other run: {short.last_step:,} of {long_.last_step:,} steps")
    code = FINDINGS if findings or incomplete or (fail_on_new and only_b) else CLEAN
    return CompareResult(a=a, b=b, rtol=loss_rtol, atol=loss_atol, window=window, loss=loss, only_in_a=only_a,
                         only_in_b=only_b, step_time_ratio=_ratio(b.step_time_s, a.step_time_s),
                         peak_memory_ratio=_ratio(b.peak_rss_bytes, a.peak_rss_bytes), findings=findings,
                         exit_code=code, incomplete=incomplete, verdict=verdict)


def _divergence(v: Verdict, loss: LossComparison, a: RunInfo, b: RunInfo, pa: Path, pb: Path, rtol: float,
                atol: float) -> Finding:
    """The OC601 finding of a ``diverged`` verdict, at its first step."""
    rule = RunDivergence()
    pseudo = {"step": v.first_step, "phase": "post-step", "backend": b.backend, "run": pb.name}
    if v.basis == "tolerance":
        msg = rule.message.format(step=f"{loss.first_beyond_step:,}", window=loss.window, a=loss.mean_a,
                                  b=loss.mean_b, tol=loss.tolerance)
        if math.isfinite(loss.max_rel_diff):
            msg += f"; largest relative difference {loss.max_rel_diff:.1%} at step {loss.max_rel_step:,}"
        else:
            msg += "; one run's loss is not finite"
    elif v.loss_a is not None:
        msg = (f"loss trajectories diverge from step {v.first_step:,}: loss {v.loss_a:.6g} (A) vs {v.loss_b:.6g} "
               f"(B), beyond the numerical-noise tolerance {v.tolerance:.2g} of same-seed runs; largest relative "
               f"difference {v.max_rel_diff:.2g} at step {v.max_step:,}")
    else:
        msg = (f"parameters diverge from step {v.first_step:,} although the losses agree within numerical noise "
               f"(largest relative difference {v.max_rel_diff:.2g})")
    if v.where is not None:
        msg += "; " + v.where.text()
    return rule.finding(
        pseudo, msg, subjects=[str(pa), str(pb)], key="loss",
        next_failure="the two sides train differently: results from one do not carry over to the other",
        basis=v.basis, window=loss.window, rtol=rtol, atol=atol, first_beyond_step=v.first_step,
        mean_a=loss.mean_a, mean_b=loss.mean_b, max_abs_diff=v.max_abs_diff if math.isfinite(v.max_abs_diff) else None,
        max_rel_diff=v.max_rel_diff if math.isfinite(v.max_rel_diff) else None,
        where=v.where.text() if v.where else None, differences=v.differences,
        versions_a=a.versions, versions_b=b.versions)


# -- the table ----------------------------------------------------------------

def _versions(v: dict) -> str:
    return versions_text(v) or "-"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows of (name, A, B[, B/A]) as aligned lines."""
    widths = [max(len(r[i]) if i < len(r) else 0 for r in rows) for i in range(3)]
    return [("  " + "  ".join(c.ljust(widths[i]) if i < 3 else c for i, c in enumerate(r))).rstrip() for r in rows]


def render(res: CompareResult) -> str:
    """``res`` as a plain-text table: runs, losses, times, memory, versions, findings, verdict."""
    a, b, L = res.a, res.b, res.loss
    rows = [
        ("", a.label, b.label, "B/A"),
        ("backend / status", f"{a.backend or '-'} / {a.status or '-'}", f"{b.backend or '-'} / {b.status or '-'}"),
        ("steps with a loss", f"{a.steps:,} (last {a.last_step:,})", f"{b.steps:,} (last {b.last_step:,})"),
        ("loss first -> last", f"{num_text(a.loss_first)} -> {num_text(a.loss_last)}", f"{num_text(b.loss_first)} -> {num_text(b.loss_last)}"),
        ("step time (median)", num_text(a.step_time_s and a.step_time_s * 1000, "{:.2f} ms"),
         num_text(b.step_time_s and b.step_time_s * 1000, "{:.2f} ms"), num_text(res.step_time_ratio, "{:.2f}x")),
        ("peak RSS", "-" if a.peak_rss_bytes is None else format_bytes(a.peak_rss_bytes),
         "-" if b.peak_rss_bytes is None else format_bytes(b.peak_rss_bytes), num_text(res.peak_memory_ratio, "{:.2f}x")),
        ("versions", _versions(a.versions), _versions(b.versions)),
    ]
    lines = [f"optcheck compare   {a.label}   vs   {b.label}"]
    if res.verdict is not None:
        lines += res.verdict.lines()
    lines += ["", *_table(rows)]
    for info in (a, b):
        if info.crash:
            c = info.crash
            lines.append(f"  {info.label} crashed at step {c.get('step')}: {c.get('exc_type') or c.get('signal')}: "
                         f"{str(c.get('message') or '')[:120]}")
    for info in (a, b):
        for d in info.defects[:10]:
            lines.append(f"  note: {info.label}: {d}; skipped, the rest was read")
    lines += ["", f"Loss trajectories: {L.common_steps:,} common steps compared, {L.window}-step trailing mean, "
                  f"tolerance {res.atol:g} + {res.rtol:.0%} of A's"]
    if L.max_abs_step is not None:
        rel = f"{L.max_rel_diff:.1%}" if math.isfinite(L.max_rel_diff) else "inf"
        lines.append(f"  largest difference {L.max_abs_diff:.4f} at step {L.max_abs_step:,}; "
                     f"largest relative {rel} at step {L.max_rel_step:,}")
    if L.diverged:
        lines.append(f"  first beyond tolerance at step {L.first_beyond_step:,}: "
                     f"{num_text(L.mean_a)} (A) vs {num_text(L.mean_b)} (B), tolerance {num_text(L.tolerance)}")
    else:
        lines.append("  within tolerance everywhere")
    for name, items in (("only in A", res.only_in_a), ("only in B", res.only_in_b)):
        lines.append(f"Findings {name}: " + ("none" if not items else str(len(items))))
        for f in items[:20]:
            subj = ", ".join(f["subjects"][:4]) + (" ..." if len(f["subjects"]) > 4 else "")
            lines.append(f"  {f['code']} {f['symbol']:<20} step {f['step']}: {subj}")
        if len(items) > 20:
            lines.append(f"  ... and {len(items) - 20} more")
    lines.append("")
    if res.incomplete:
        lines.append(f"FAIL (exit {res.exit_code}): cannot pass an incomplete run: {'; '.join(res.incomplete)}; "
                     f"{L.common_steps:,} common steps compared")
    if res.findings:
        lines.append(f"FAIL (exit {res.exit_code}): OC601 run-divergence: {res.findings[0].message}")
    elif res.exit_code and not res.incomplete:
        lines.append(f"FAIL (exit {res.exit_code}): findings only in B")
    elif not res.exit_code:
        lines.append(f"PASS (exit {res.exit_code})")
    return "\n".join(lines)

