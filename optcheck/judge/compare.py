"""Compare two run directories: for upgrade and backend validation. Torch-free.

``compare_runs(A, B)`` reads what a soak (or a Monitor) wrote — ``metrics.jsonl``,
``findings.jsonl``, ``snapshots.jsonl``, ``summary.json`` — through
``optcheck.report.reader.RunReader`` and answers: the verdict first (identical, within numerical noise, or diverged,
from ``optcheck.judge.verdict``, the one function ``optcheck upgrade`` uses too; OC601
when diverged), which findings
does one run have and the other not, how do step time and peak memory compare,
and which library versions ran. ``optcheck compare RUN_A RUN_B`` prints it
(the table: ``optcheck.report.text.render_compare``).
Over 400 lines: the two runs' alignment, first difference and report are one pipeline over the same aligned records; split, each part would re-read them.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from optcheck.errors import InputError
from optcheck.run.exitcodes import CLEAN, FINDINGS
from optcheck.findings import Finding
from optcheck.report.reader import RunReader
from optcheck.rules.parity import RunDivergence
from optcheck.series import moving_mean
from optcheck.record.snapshot import strict_json
from optcheck.judge.policy import AUTO, MIGRATION, choose
from optcheck.judge.verdict import Verdict, judge, same_batches

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
        summary_last_step: the summary's ``last_step`` (None if absent).
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
    summary_last_step: int | None = None
    defects: list[str] = field(default_factory=list)

    def incomplete(self) -> str | None:
        """Why this run cannot be judged as a finished run (None when it can) — the one
        judgment of completeness of every judge (``compare``, ``baseline``, ``soak
        --baseline``, ``upgrade``): its status is crashed, interrupted, running or
        stopped; it stopped short of the steps it asked for; or its losses
        (``metrics.jsonl``) end before the step its summary says it reached (a
        truncated or lost record: the steps after it cannot be judged)."""
        if self.status and self.status not in COMPLETE:
            where = f" at step {self.last_step:,}" + (f" of {self.steps_requested:,}" if self.steps_requested else "")
            return f"{self.status}{where}"
        if self.steps_requested and self.last_step < self.steps_requested:
            return f"incomplete: {self.last_step:,} of {self.steps_requested:,} steps"
        if self.steps and self.summary_last_step and self.last_step < self.summary_last_step:
            return (f"incomplete records: metrics.jsonl ends at step {self.last_step:,}, the summary says "
                    f"{self.summary_last_step:,}")
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
        verdict: identical / within numerical noise / diverged (``optcheck.judge.verdict.judge``).
        incomplete: why a run cannot pass ("B: crashed at step 200 of 5,000",
            "B: shorter than A: 200 of 5,000 steps"), empty when both are complete.
        mismatch: migration only: optimizer options that differ where both sides have them.
        policy: ``rerun`` or ``migration`` (``optcheck.judge.policy``), as the verdict says.
        fail_on_new: findings only in B fail (``--fail-on-new``; always under ``migration``).
        exit_code: ``optcheck.run.exitcodes.FINDINGS`` when there is a finding, a run
            is incomplete, an option mismatch (or, with ``fail_on_new``, a finding only
            in B), else ``CLEAN``.
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
    mismatch: list[str] = field(default_factory=list)
    policy: str = "rerun"
    fail_on_new: bool = False

    @property
    def diverged(self) -> bool:
        return self.verdict.diverged if self.verdict is not None else self.loss.diverged

    def to_dict(self) -> dict:
        d = asdict(self)
        d["findings"] = [f.to_dict() for f in self.findings]
        d["diverged"] = self.diverged
        return d

    def to_json(self) -> str:
        return strict_json(self.to_dict(), indent=2)

    def render(self) -> str:
        """The comparison as a plain-text table (a few dozen lines)."""
        from optcheck.report.text import render_compare

        return render_compare(self)


# -- reading a run -------------------------------------------------------------

def read_run(path: str | os.PathLike | RunReader, label: str = "") -> tuple[RunInfo, dict[int, float], list[dict]]:
    """Read run directory ``path`` (or an open reader of it): (RunInfo, {step: loss}, findings as dicts).

    Raises:
        InputError: as :class:`optcheck.report.reader.RunReader` (not a run directory,
            an empty one, a newer schema, a record of the wrong shape).
    """
    run = path if isinstance(path, RunReader) else RunReader(path)
    summary, losses = run.summary, run.losses
    steps = sorted(losses)
    info = RunInfo(
        path=str(run.path), label=label or str(run.path), backend=summary.get("backend") or "",
        status=summary.get("status") or "", versions=run.versions(),
        steps=len(steps), last_step=steps[-1] if steps else int(summary.get("last_step") or 0),
        loss_first=losses[steps[0]] if steps else None, loss_last=losses[steps[-1]] if steps else None,
        step_time_s=float(np.median(run.step_times)) if run.step_times else None,
        peak_rss_bytes=run.peak_rss_bytes(), crash=summary.get("crash") or None,
        steps_requested=summary.get("steps_requested"), summary_last_step=summary.get("last_step"),
        defects=list(run.defects))
    return info, losses, run.findings


# -- the comparison -----------------------------------------------------------

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
    ma, bad_a = moving_mean(a, w)
    mb, bad_b = moving_mean(b, w)
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


def finding_difference(xs: list[dict], ys: list[dict]) -> list[dict]:
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
                 fail_on_new: bool = False, policy: str = AUTO) -> CompareResult:
    """Compare run directories ``run_a`` (the reference) and ``run_b``.

    Args:
        run_a, run_b: run directories written by ``optcheck soak`` or a Monitor.
        loss_rtol, loss_atol: tolerance of the smoothed losses (relative to A's,
            and absolute, in loss units: nats per token for the built-in GPT).
        window: trailing-mean window in steps.
        fail_on_new: also return the findings exit code when B has findings A has not.
        policy: ``auto``, ``rerun`` or ``migration`` (``optcheck.judge.policy.choose``): a migration
            (another backend or native library) is judged on the smoothed losses, as runs
            of different seeds are, with options compared where both sides have them.

    Two runs whose ``summary.json`` configs record the same seed, batch shape and corpus
    are judged step by step against the numerical-noise tolerance
    (``optcheck.judge.verdict.noise_tolerance``, not the seed-noise ``loss_rtol``/``loss_atol``);
    other pairs against the smoothed tolerance.

    Returns:
        A :class:`CompareResult`; ``findings`` holds one OC601 finding when the
        verdict is ``diverged``, at its first step.

    Raises:
        InputError: a path is not a run directory, a file in it is unreadable, the
            runs share no step, a tolerance is negative, an unknown policy, or the runs
            trained for different ``--steps`` (:func:`check_same_schedule`).
    """
    for name, v in (("--tolerance", loss_rtol), ("--atol", loss_atol)):
        if not math.isfinite(v) or v < 0:
            raise InputError(f"{name} {v}: must be a finite number >= 0")
    pa, pb = Path(run_a), Path(run_b)
    la, lb = ("A: " + pa.name, "B: " + pb.name) if pa.name != pb.name else ("A: " + str(pa), "B: " + str(pb))
    ra, rb = RunReader(pa, purpose="compare"), RunReader(pb, purpose="compare")
    check_same_schedule(ra.summary, rb.summary, f"{run_a} / {run_b}")
    try:
        chosen, why = choose(ra.summary, rb.summary, policy)
    except ValueError as e:
        raise InputError(f"--policy: {e}") from None
    a, loss_a, find_a = read_run(ra, la)
    b, loss_b, find_b = read_run(rb, lb)
    loss = compare_losses(loss_a, loss_b, rtol=loss_rtol, atol=loss_atol, window=window)
    verdict = judge(loss_a, loss_b, same_seed=same_batches(ra.summary, rb.summary), snaps_a=ra.snapshots,
                    snaps_b=rb.snapshots, summary_a=ra.summary, summary_b=rb.summary, smoothed=loss,
                    policy=chosen, policy_why=why, band=band_text(loss_atol, loss_rtol, loss.window))
    a.defects, b.defects = list(ra.defects), list(rb.defects)  # the snapshots' skipped lines too
    only_a, only_b = finding_difference(find_a, find_b), finding_difference(find_b, find_a)
    findings = []
    if verdict.diverged:
        findings.append(_divergence(verdict, loss, a, b, pa, pb, loss_rtol, loss_atol))
    mismatch = []
    if chosen == MIGRATION:  # a migration is judged as an upgrade is: new findings and mapped options count
        fail_on_new = True
        if verdict.where is not None and verdict.where.options:
            mismatch.append(f"options differ where both sides have them, at snapshot step {verdict.where.step:,}: "
                            + "; ".join(verdict.where.options))
    incomplete = [f"{name}: {why}" for name, why in (("A", a.incomplete()), ("B", b.incomplete())) if why]
    for short, long_, name in ((a, b, "A"), (b, a, "B")):
        if short.last_step < long_.last_step:
            incomplete.append(f"{name}: shorter than the other run: {short.last_step:,} of {long_.last_step:,} steps")
    code = FINDINGS if findings or incomplete or mismatch or (fail_on_new and only_b) else CLEAN
    return CompareResult(a=a, b=b, rtol=loss_rtol, atol=loss_atol, window=window, loss=loss, only_in_a=only_a,
                         only_in_b=only_b, step_time_ratio=_ratio(b.step_time_s, a.step_time_s),
                         peak_memory_ratio=_ratio(b.peak_rss_bytes, a.peak_rss_bytes), findings=findings,
                         exit_code=code, incomplete=incomplete, verdict=verdict, mismatch=mismatch,
                         policy=chosen, fail_on_new=fail_on_new)


def band_text(atol: float, rtol: float, window: int) -> str:
    """The smoothed tolerance in words: ``0.03 + 5% of A's 50-step trailing mean``."""
    return f"{atol:g} + {rtol:.0%} of A's {window}-step trailing mean"


def check_same_schedule(summary_a: dict, summary_b: dict, what: str) -> None:
    """Refuse two runs whose configs train for different ``--steps``: the learning-rate
    schedule (warm-up, then cosine decay to ``--min-lr`` over ``--steps``) follows it, so
    they part right after the warm-up (step 141 of 2,000 against 1,000 steps) whatever
    else is equal. Runs without a recorded config (a Monitor's) are not checked.

    Raises:
        InputError: one line naming both values and what to do instead.
    """
    sa, sb = (summary_a.get("config") or {}).get("steps"), (summary_b.get("config") or {}).get("steps")
    if isinstance(sa, int) and isinstance(sb, int) and sa != sb and not {summary_a.get("source"), summary_b.get(
            "source")} & {"monitor"}:
        warm = (summary_a.get("config") or {}).get("warmup_steps")
        after = f" after the {warm}-step warm-up" if isinstance(warm, int) else ""
        raise InputError(f"{what}: the runs trained for different --steps ({sa:,} vs {sb:,}); the learning-rate "
                         f"schedule follows --steps, so they part{after} whatever else is equal: compare runs "
                         f"of the same --steps (a shorter one of them still compares on its steps)")


def _divergence(v: Verdict, loss: LossComparison, a: RunInfo, b: RunInfo, pa: Path, pb: Path, rtol: float,
                atol: float) -> Finding:
    """The OC601 finding of a ``diverged`` verdict, at its first step."""
    rule = RunDivergence()
    pseudo = {"step": v.first_step, "phase": "post-step", "backend": b.backend, "run": pb.name}
    if v.basis in ("tolerance", MIGRATION):
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
        mean_a=loss.mean_a, mean_b=loss.mean_b, max_abs_diff=v.max_abs_diff,
        max_rel_diff=v.max_rel_diff,
        where=v.where.text() if v.where else None, differences=v.differences,
        versions_a=a.versions, versions_b=b.versions)
