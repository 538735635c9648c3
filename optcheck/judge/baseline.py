"""Tonight against a kept run: ``optcheck soak ... --baseline DIR`` and ``optcheck baseline RUN DIR``. Torch-free.

The baseline is a run directory kept from an earlier night (``summary.json``,
``metrics.jsonl``, ``findings.jsonl``), or a folder of ``seed-N`` runs written by
``optcheck soak --seeds 1,2,3 --out DIR``. The new run fails the job (exit 1) only
on a **regression**, one check each:

* ``findings``: a finding at or above ``--fail-on`` (code and parameters, as
  ``optcheck compare`` matches them) the baseline does not have. Findings the
  baseline has too, and new ones below ``--fail-on``, are listed, not failed.
* ``loss``: the final training loss (trailing mean of the last ``window`` steps)
  is above the baseline's band, and ``held-out loss``: the last held-out loss is above its band.
  With **several baseline seeds** the band is ``optcheck.judge.verdict.seed_band`` at the
  last step: the seeds' mean + ``k`` (5) seed standard deviations; the held-out band is
  the seeds' mean + the larger of 5 standard deviations of their held-out losses and that
  training-loss half-width. With **one baseline run** the band is the stated tolerance
  of ``optcheck compare`` (``0.03 + 5 %`` of the baseline's value: two clean soaks of the
  built-in GPT with different seeds stay well inside it, docs/verdict.md).
  Only a rise fails: a lower loss is not a regression.
* ``speed``: the worker's **CPU time per training step** (``cost.train_cpu_block_s`` of
  ``summary.json``: ``time.process_time()`` per block of 10 steps, snapshots included) —
  the median over blocks, the first block left out — is higher than the baseline's (its
  seeds' blocks pooled) by more than ``speed_tolerance`` (default 25 %) *and* by more than
  the noise band (3 standard errors of the ratio, from the blocks' own spread). A run of
  fewer than ``MIN_SPEED_STEPS`` (60) steps is "not compared: too few steps". CPU time is
  what the run itself spent: a busy
  neighbour on a shared runner stretches the wall-clock step time up to 2.3x, the CPU time
  per step by at most 1.18x (``benchmarks/bench_speed_noise.py``: 20 clean reruns against
  one baseline with another soak beside them, 2 CPUs at load 10-15). Runs without blocks
  (an older optcheck) fall back to ``cost.train_cpu_s`` / steps, runs without CPU time (a
  Monitor) to the median wall-clock step time of ``metrics.jsonl``; the check says which.
* ``peak RSS``: higher than the baseline's (the largest of its seeds) by more than
  ``memory_tolerance`` (default 15 %).

The trajectory itself goes through ``optcheck.judge.verdict`` (``judge`` for one run,
``judge_seed_band`` for seeds): identical, within numerical noise, or diverged. A
trajectory that diverges while the final losses stay inside the band (a dependency
changed, another seed) is **reported, not failed** ("differs"), with what differs
between the runs (``torch 2.13.0 → 2.14.1``).

Not comparable (:class:`~optcheck.errors.InputError`, exit 2, one line): the baseline
is missing, not a run directory, unfinished, or trained another model (backend,
steps, batch and model shape, optimizer) or on another corpus (``corpus.sha256``).
When the new run itself did not finish the comparison is reported as "not compared"
and cannot pass: exit 1, or the run's own exit code when it crashed, could not record
or was interrupted (3, 4, 130). Finished means the same for every judge
(``optcheck.judge.compare.RunInfo.incomplete``): status clean or findings, every step
asked for taken, and the losses recorded up to the step the summary names.

Where the bands' sizes come from, and the measurements behind them: ``docs/nightly.md``.
Over 400 lines: the one regression policy: every check (findings, loss band, speed, memory) and the headline naming them, used by soak --baseline and upgrade alike.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from optcheck.run import exitcodes
from optcheck.judge.compare import (DEFAULT_ATOL, DEFAULT_RTOL, DEFAULT_WINDOW, band_text, compare_losses,
                              finding_difference, read_run)
from optcheck.errors import InputError
from optcheck.judge.folded import paired_streams
from optcheck.findings import SEVERITIES, severity_rank
from optcheck.report.reader import RunReader, rank_dirs, read_summary
from optcheck.run.sequencer import CPU_BLOCK_STEPS
from optcheck.series import moving_mean
from optcheck.units import format_bytes
from optcheck.judge.seeds import seed_runs
from optcheck.judge.verdict import judge, judge_seed_band, same_batches, seed_band

#: Blocks of CPU time per step (``cost.train_cpu_block_s``) each run needs after its first (warm-up:
#: allocation, lazy initialisation) for a speed verdict: 5 blocks of 10 steps, so a run of
#: MIN_SPEED_STEPS = 60 steps. Below it the speed is "not compared: too few steps" (a 10-step run's
#: CPU time per step is mostly its start: two identical environments measured 1.29x apart, issue 35).
MIN_SPEED_BLOCKS = 5
MIN_SPEED_STEPS = (MIN_SPEED_BLOCKS + 1) * CPU_BLOCK_STEPS
#: Standard errors of the ratio of the two medians that make the noise band (see speed_check).
K_NOISE = 3.0
#: Rise of the worker's CPU time per step allowed. Measured (benchmarks/bench_speed_noise.py, 2 CPUs at
#: load 10-15, another soak beside): 20 clean 300-step reruns ranged 0.90x-1.18x of the baseline's CPU time
#: per step (their wall-clock median step time 0.83x-2.32x), so 25 % leaves a margin over the noise.
SPEED_TOLERANCE = 0.25
MEMORY_TOLERANCE = 0.15
#: Seed standard deviations of the band of a several-seed baseline.
K_SEEDS = 5.0
#: Config keys two runs must share to be compared (``summary.json`` config; ``extra.`` nested).
MUST_MATCH = ("backend", "steps", "batch_size", "block_size", "n_layer", "n_head", "n_embd", "dropout",
              "vocab_size", "extra.optimizer")
REGRESSION, OK, DIFFERS, NOT_COMPARED = "regression", "ok", "differs", "not compared"


def parse_fraction(text, option: str) -> float:
    """``"15%"`` or ``"0.15"`` -> 0.15. Raises InputError unless a finite number >= 0."""
    s = str(text).strip()
    try:
        v = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise InputError(f"{option} {text}: a fraction >= 0 such as 0.15 or 15%")
    return v


@dataclass
class Tolerances:
    """What counts as worse. Fractions of the baseline's value; losses in nats per token."""

    speed: float = SPEED_TOLERANCE
    memory: float = MEMORY_TOLERANCE
    loss_rtol: float | None = None   # one-run band; None: optcheck.judge.compare.DEFAULT_RTOL
    loss_atol: float | None = None   # None: optcheck.judge.compare.DEFAULT_ATOL
    k: float = K_SEEDS
    window: int | None = None        # None: optcheck.judge.compare.DEFAULT_WINDOW
    fail_on: str = "warning"         # new findings below this severity are listed, not failed


@dataclass
class Baseline:
    """A kept run (``runs`` of one) or seed set (``runs`` of two or more), read and checked."""

    path: Path
    runs: list[Path]
    summaries: list[dict]
    reads: list[tuple] = field(default_factory=list)  # optcheck.judge.compare.read_run of each run
    streams: list[tuple] = field(default_factory=list)  # a folded run's (K, Baseline of rank-K); [] otherwise

    @property
    def seeds(self) -> list:
        return [(s.get("config") or {}).get("seed") for s in self.summaries]

    def text(self) -> str:
        s = self.summaries[0]
        from optcheck.report.text import versions_text

        what = f"{len(self.streams)} streams, judged rank by rank" if self.streams else \
            f"{len(self.runs)} seeds ({', '.join(map(str, self.seeds))})" if len(self.runs) > 1 \
            else f"1 run, seed {self.seeds[0]}"
        return f"{self.path} ({what}; {versions_text(s.get('versions')) or 'versions unknown'})"


def _flat(config: dict) -> dict:
    out = {k: v for k, v in (config or {}).items() if k != "extra"}
    out.update({f"extra.{k}": v for k, v in ((config or {}).get("extra") or {}).items()})
    return out


def load_baseline(path: str | os.PathLike) -> Baseline:
    """Read the baseline at ``path``: a finished run directory, or a folder of ``seed-N`` runs.

    Raises:
        InputError: missing, not a run directory nor a seed set, a ``summary.json``
            unreadable, or a baseline run that did not finish (crashed, interrupted, short).
    """
    p = Path(path)
    if not p.is_dir():
        raise InputError(f"--baseline {path}: no such run directory (keep last night's --out folder, "
                         f"or leave --baseline out on the first night)")
    if rank_dirs(p):  # a folded run: each stream a baseline of its own (optcheck/judge/folded.py)
        return Baseline(p, [p], [read_summary(p)], streams=[(k, load_baseline(d)) for k, d in rank_dirs(p)])
    runs = [p] if (p / "summary.json").is_file() else seed_runs(p)
    if not runs:
        raise InputError(f"--baseline {path}: not a run directory (no summary.json, no seed-N runs in it)")
    summaries, reads = [], []
    for r in runs:
        s = read_summary(r)
        reads.append(read_run(r))
        why = reads[-1][0].incomplete()
        if why is not None:
            raise InputError(f"--baseline {r}: not a finished run ({why}); keep a run that finished")
        summaries.append(s)
    b = Baseline(p, runs, summaries, reads)
    if len(runs) > 1 and len(set(map(str, b.seeds))) < len(runs):
        raise InputError(f"--baseline {path}: its seed-N runs share a seed ({', '.join(map(str, b.seeds))}): "
                         f"a seed band needs distinct seeds")
    for r, s in zip(runs[1:], summaries[1:]):
        _check_same(summaries[0], s, f"--baseline {r}", f"{runs[0].name}")
    return b


def _check_same(base: dict, cand: dict, who: str, against: str, backends: bool = True) -> None:
    """InputError ``"<who>: not comparable: n_embd 64 vs 128"`` when a MUST_MATCH key or the corpus
    differs (the backend too unless ``backends`` is False: an upgrade across backends)."""
    ca, cb = _flat(base.get("config") or {}), _flat(cand.get("config") or {})
    diffs = [f"{k} {ca.get(k, '-')} vs {cb.get(k, '-')}" for k in MUST_MATCH
             if ca.get(k) != cb.get(k) and (backends or k != "backend")]
    sa, sb = (base.get("corpus") or {}).get("sha256"), (cand.get("corpus") or {}).get("sha256")
    if sa and sb and sa != sb:
        diffs.append(f"corpus sha256 {sa[:12]}… vs {sb[:12]}…")
    if diffs:
        raise InputError(f"{who}: not comparable with {against}: {'; '.join(diffs)} (a baseline must train the "
                         f"same model on the same corpus; keep a new baseline after such a change)")


def check_config(baseline: Baseline, config: dict, *, seeds=None, backends=(), what: str = "this soak") -> None:
    """Before a soak starts: ``config`` (a ``SoakConfig`` as a dict) trains what the baseline
    trained, and the soak is one run (not ``--seeds`` nor two backends).

    Raises:
        InputError: one line naming the difference.
    """
    if seeds is not None or len(backends) > 1:
        raise InputError("--baseline compares one run: leave out --seeds and give one --backend "
                         "(seed sets compare with `optcheck compare BASELINE_DIR CANDIDATE_DIR`)")
    _check_same(baseline.summaries[0], {"config": config}, f"--baseline {baseline.path}", what)


@dataclass
class Check:
    """One line of the comparison: ``name`` (findings, loss, ...), ``status``
    (regression, ok, differs, not compared) and what was compared."""

    name: str
    status: str
    text: str
    step: int | None = None
    brief: str = ""  # the regression in a few words, for the headline ("peak RSS 2.04x (limit 1.15x)")

    def line(self) -> str:
        at = f" step {self.step:,}" if self.step is not None else ""
        status = self.status.upper() if self.status == REGRESSION else self.status
        return f"  {status:<12} {self.name}{at}: {self.text}"


@dataclass
class BaselineResult:
    """The comparison of a run with its baseline; ``exit_code`` is 1 on a regression, else 0."""

    run: Path
    baseline: Baseline
    checks: list[Check] = field(default_factory=list)
    verdict: object = None  # optcheck.judge.verdict.Verdict, or None when not compared
    baseline_findings: list = field(default_factory=list)  # the baseline runs' finding dicts (JUnit: "in the baseline")

    @property
    def regressions(self) -> list[Check]:
        return [c for c in self.checks if c.status == REGRESSION]

    @property
    def compared(self) -> bool:
        return not any(c.status == NOT_COMPARED and c.name == "run" for c in self.checks)

    @property
    def exit_code(self) -> int:
        """1 on a regression, and for a run that did not finish (it cannot pass); else 0."""
        return exitcodes.FINDINGS if self.regressions or not self.compared else exitcodes.CLEAN

    def headline(self) -> str:
        if not self.compared:
            return "NOT COMPARED with the baseline: " + self.checks[0].text
        if self.regressions:
            return "REGRESSION against the baseline: " + self.regression_text()
        differs = [c for c in self.checks if c.status == DIFFERS]
        if differs:
            return "NO REGRESSION, trajectory differs (reported, not failed): " + differs[0].text
        return "NO REGRESSION against the baseline"

    def regression_text(self) -> str:
        """Every regression in a few words, ``; ``-separated ("findings: new OC101, OC102; peak RSS
        2.04x (limit 1.15x)"); "" without one."""
        return "; ".join(c.brief or c.name for c in self.regressions)

    def lines(self) -> list[str]:
        """The headline, the baseline, one line per check; a regression line reads
        ``REGRESSION   loss step 300: final loss ...``."""
        return [f"optcheck baseline: {self.headline()}", f"  baseline: {self.baseline.text()}",
                *(c.line() for c in self.checks)]

    def markdown(self) -> str:
        """The comparison as a Markdown section (heading, verdict, one table row per check)."""
        from optcheck.report.markdown import render_baseline

        return render_baseline(self)


def _judge_streams(run: Path, b: Baseline, tol: Tolerances, policy: str) -> BaselineResult:
    """A folded ``run`` against a folded baseline (``optcheck/judge/folded.py``): one result whose
    checks are every stream's, each text prefixed ``rank K:`` (a stream that did not finish first,
    so the headline says it). Raises InputError when their streams differ (``paired_streams``)."""
    streams = dict(b.streams)
    res = BaselineResult(run, b)
    unfinished, checks = [], []
    for k, _, d in paired_streams(b.path, run, "--baseline", "run"):
        one = compare_with_baseline(d, streams[k], tol, policy=policy)
        res.baseline_findings += one.baseline_findings
        for c in one.checks:
            (unfinished if c.name == "run" else checks).append(
                Check(c.name, c.status, f"rank {k}: {c.text}", c.step, f"rank {k} {c.brief or c.name}"))
    res.checks = unfinished + checks
    return res


def _final_mean(loss: dict[int, float], steps: list[int], window: int) -> float:
    w = min(window, len(steps))
    return float(moving_mean([loss[s] for s in steps], w)[0][-1])


def _finite(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def compare_with_baseline(run: str | os.PathLike, baseline: Baseline | str | os.PathLike,
                          tol: Tolerances | None = None, *, policy: str = "auto") -> BaselineResult:
    """Judge run directory ``run`` against ``baseline`` (see the module docstring for each check).
    The one regression policy of ``soak --baseline``, ``optcheck baseline`` and ``optcheck
    upgrade`` (which passes its baseline side's run as ``baseline``). ``policy``: the
    trajectory's (``optcheck.judge.policy.choose``: ``auto`` takes a migration when the backend or
    its native library changed; a migration may change the backend).

    Raises:
        InputError: the baseline or the run is unreadable or not comparable (trains another
            model or on another corpus), or they share no step.
    """
    tol = tol or Tolerances()
    window = tol.window or DEFAULT_WINDOW
    rtol = DEFAULT_RTOL if tol.loss_rtol is None else tol.loss_rtol
    atol = DEFAULT_ATOL if tol.loss_atol is None else tol.loss_atol
    b = baseline if isinstance(baseline, Baseline) else load_baseline(baseline)
    run = Path(run)
    if b.streams or rank_dirs(run):
        return _judge_streams(run, b, tol, policy)
    summary = read_summary(run)
    res = BaselineResult(run, b)
    info, loss, findings = read_run(run)
    why = info.incomplete()  # the one judgment of completeness (compare's and upgrade's too)
    if why is not None:
        res.checks.append(Check("run", NOT_COMPARED, f"this run did not finish ({why}): it cannot pass"))
        return res
    from optcheck.judge.policy import MIGRATION, choose

    chosen, why = choose(b.summaries[0], summary, policy)
    _check_same(b.summaries[0], summary, f"--baseline {b.path}", f"run {run}", backends=chosen != MIGRATION)
    base = b.reads or [read_run(r) for r in b.runs]
    last = info.last_step

    # findings the baseline does not have
    base_findings = res.baseline_findings = [f for _, _, fs in base for f in fs]
    floor = severity_rank(tol.fail_on)
    failing = [f for f in findings if severity_rank(f.get("severity") if f.get("severity") in SEVERITIES
                                                    else "error") >= floor]
    new, known = finding_difference(failing, base_findings), finding_difference(findings, [])
    below = [f for f in finding_difference(findings, base_findings) if f not in new]
    if new:
        first = min(new, key=lambda f: f.get("step") or 0)
        res.checks.append(Check("findings", REGRESSION, "new: " + ", ".join(
            f"{f['code']} {f['symbol']} ({', '.join(f['subjects'][:3]) or '-'})" for f in new[:6])
            + (f" and {len(new) - 6} more" if len(new) > 6 else "") + " — not in the baseline", first.get("step"),
            brief="findings: new " + ", ".join(sorted({f["code"] for f in new}))))
    else:
        text = "none" if not known else "only findings the baseline has too: " + ", ".join(
            sorted({f["code"] for f in known if f not in below}))
        if below:
            text = f"new below --fail-on {tol.fail_on} only: " + ", ".join(sorted({f["code"] for f in below}))
        res.checks.append(Check("findings", OK, text))

    # the trajectory and the final loss against the band
    losses = [lo for _, lo, _ in base]
    common = sorted(set(loss).intersection(*map(set, losses)))
    if not common:
        raise InputError(f"--baseline {b.path}: no training step in common with {run}")
    mine = _final_mean(loss, common, window)
    if len(losses) > 1:
        steps, centre, half, w = seed_band(losses, common, window=window, k=tol.k)
        top, how = float(centre[-1] + half[-1]), f"seed band {centre[-1]:.4f} ± {half[-1]:.4f} ({tol.k:g} seed sd)"
        res.verdict = judge_seed_band(losses, [loss], window=window, k=tol.k)
        band_half = float(half[-1])
    else:
        ref = _final_mean(losses[0], common, window)
        band_half = atol + rtol * abs(ref)
        top, how = ref + band_half, f"baseline {ref:.4f} + tolerance {atol:g} + {rtol:.0%}"
        smoothed = compare_losses(losses[0], loss, rtol=rtol, atol=atol, window=window)
        res.verdict = judge(losses[0], loss, same_seed=same_batches(b.summaries[0], summary),
                            snaps_a=RunReader(b.runs[0]).snapshots, snaps_b=RunReader(run).snapshots,
                            summary_a=b.summaries[0], summary_b=summary, smoothed=smoothed, policy=chosen,
                            policy_why=why, band=band_text(atol, rtol, smoothed.window))
    w = min(window, len(common))
    res.checks.append(Check("loss", REGRESSION if mine > top or not math.isfinite(mine) else OK,
                            f"final loss ({w}-step mean) {mine:.4f}, band up to {top:.4f} ({how})", common[-1],
                            brief=f"loss {mine:.4f} above its band ({top:.4f})"))

    # held-out loss
    vals = [_finite(s.get("val_loss_last")) for s in b.summaries]
    vsteps = {s.get("val_step_last") for s in b.summaries}
    v = _finite(summary.get("val_loss_last"))
    if v is None or None in vals or vsteps != {summary.get("val_step_last")}:
        res.checks.append(Check("held-out loss", NOT_COMPARED, "no held-out loss at the same step in both "
                                "(--val-every)" if v is not None or any(vals) else "neither run has one"))
    else:
        centre = float(np.mean(vals))
        if len(vals) > 1:
            half = max(tol.k * float(np.std(vals, ddof=1)) * math.sqrt(1 + 1 / len(vals)), band_half)
            how = f"seeds' mean {centre:.4f} + {half:.4f}"
        else:
            half, how = atol + rtol * abs(centre), f"baseline {centre:.4f} + tolerance {atol:g} + {rtol:.0%}"
        res.checks.append(Check("held-out loss", REGRESSION if v > centre + half else OK,
                                f"{v:.4f}, band up to {centre + half:.4f} ({how})", summary.get("val_step_last"),
                                brief=f"held-out loss {v:.4f} above its band ({centre + half:.4f})"))

    # speed: the worker's CPU time per training step (a busy neighbour does not move it)
    res.checks.append(speed_check([(i, sm) for (i, _, _), sm in zip(base, b.summaries)], (info, summary), tol.speed))

    # peak RSS
    peaks = [i.peak_rss_bytes for i, _, _ in base if i.peak_rss_bytes]
    if info.peak_rss_bytes and peaks:
        ref_m = max(peaks)
        worse = info.peak_rss_bytes > ref_m * (1 + tol.memory)
        res.checks.append(Check("peak RSS", REGRESSION if worse else OK,
                                f"{format_bytes(info.peak_rss_bytes)} vs {format_bytes(ref_m)} "
                                f"({info.peak_rss_bytes / ref_m:.2f}x; fails above {1 + tol.memory:.0%})",
                                brief=f"peak RSS {info.peak_rss_bytes / ref_m:.2f}x the baseline's "
                                      f"(limit {1 + tol.memory:.2f}x)"))
    else:
        res.checks.append(Check("peak RSS", NOT_COMPARED, "no peak RSS recorded"))

    # the trajectory: reported, never failed by itself
    vd = res.verdict
    text = vd.headline() + (f"; runs differ in: {'; '.join(vd.differences)}" if vd.differences else "")
    res.checks.append(Check("trajectory", DIFFERS if vd.diverged else OK, text, last))
    return res


def prepare(path, config_json: str, *, seeds=None, backends=(), speed="25%", memory="15%", fail_on="warning"):
    """Before ``optcheck soak --baseline`` runs: (the :class:`Baseline`, :class:`Tolerances`),
    or None without ``path``. ``config_json``: ``SoakConfig.to_json()`` of the soak.

    Raises:
        InputError: a tolerance that is not a fraction, a baseline that is missing or not
            comparable (:func:`load_baseline`, :func:`check_config`): nothing runs then.
    """
    import json

    tol = Tolerances(speed=parse_fraction(speed, "--speed-tolerance"),
                     memory=parse_fraction(memory, "--memory-tolerance"), fail_on=fail_on)
    if path is None:
        return None
    b = load_baseline(path)
    check_config(b, json.loads(config_json), seeds=seeds, backends=backends)
    return b, tol


def after_soak(run: str | os.PathLike, prepared: tuple, run_code: int, echo=print) -> tuple[BaselineResult, int]:
    """What ``optcheck soak --baseline`` does once the run is over (``prepared``: what
    :func:`prepare` returned): compare, print the lines,
    and return (result, the job's exit code). The job's exit code is the run's when it crashed,
    could not record or was interrupted (3, 4, 130), else 1 on a regression and 0 without one:
    findings the baseline has too no longer fail the job.
    """
    res = compare_with_baseline(run, *prepared)
    for line in res.lines():
        echo(line)
    if run_code not in (exitcodes.CLEAN, exitcodes.FINDINGS):
        return res, run_code
    return res, res.exit_code


def cpu_per_step(info, summary: dict) -> float | None:
    """Seconds of worker CPU time per training step (``cost.train_cpu_s`` / the steps run),
    or None when the run did not record it (a Monitor, an optcheck before it existed)."""
    cpu = _finite((summary.get("cost") or {}).get("train_cpu_s"))
    steps = summary.get("last_step") or info.last_step
    return cpu / steps if cpu and steps else None


def cpu_blocks(summary: dict) -> list[float] | None:
    """The run's CPU seconds per step, block by block (``cost.train_cpu_block_s``,
    ``optcheck.run.sequencer.CpuBlocks``), its first block (warm-up) left out; None when it
    recorded none."""
    blocks = (summary.get("cost") or {}).get("train_cpu_block_s")
    if not isinstance(blocks, list) or not all(_finite(b) is not None and b > 0 for b in blocks):
        return None
    return [float(b) for b in blocks[1:]]


def _median_se(xs: list[float]) -> tuple[float, float]:
    """The median of ``xs`` and its relative standard error (1.2533 x 1.4826 MAD / median / sqrt(n):
    the normal-noise estimate, robust to the odd block a snapshot or a neighbour slowed)."""
    med = float(np.median(xs))
    mad = float(np.median(np.abs(np.asarray(xs) - med)))
    return med, 1.2533 * 1.4826 * mad / med / math.sqrt(len(xs))


def speed_check(base: list[tuple], run: tuple, tolerance: float) -> Check:
    """The ``speed`` check of ``run`` ((RunInfo, summary)) against ``base`` (the baseline's
    (RunInfo, summary) pairs); see :data:`MIN_SPEED_BLOCKS` for when it is judged at all.

    The statistic: the median over blocks of :data:`~optcheck.run.sequencer.CPU_BLOCK_STEPS`
    steps of the worker's CPU time per step (every baseline seed's blocks pooled), the first
    block of each run left out. Slower beyond ``tolerance`` (a fraction) *and* beyond the noise
    band — :data:`K_NOISE` standard errors of the ratio, measured from the blocks' own spread —
    is a regression. Runs that recorded no blocks fall back to the whole run's CPU time per step,
    then to the median wall-clock step time (each needing :data:`MIN_SPEED_STEPS` steps), the
    basis named in the text."""
    mine_blocks, base_blocks = cpu_blocks(run[1]), [cpu_blocks(s) for _, s in base]
    limit_text = f"fails above {1 + tolerance:.2f}x the baseline's"
    if mine_blocks is not None and base_blocks and None not in base_blocks:
        pooled = [b for bs in base_blocks for b in bs]
        if min(len(mine_blocks), *(len(bs) for bs in base_blocks)) < MIN_SPEED_BLOCKS:
            return _too_few([run[1]] + [s for _, s in base])
        (mine, se_m), (ref, se_r) = _median_se(mine_blocks), _median_se(pooled)
        ratio, band = mine / ref, K_NOISE * math.hypot(se_m, se_r)
        limit = 1 + max(tolerance, band)
        why = f"fails above {limit:.2f}x the baseline's" + ("" if band <= tolerance else
                                                            f" (the noise band, wider than the {tolerance:.0%} allowed)")
        return Check("speed", REGRESSION if ratio > limit else OK,
                     f"train CPU {mine * 1e3:.2f} vs {ref * 1e3:.2f} ms/step ({ratio:.2f}x; the worker's CPU time per "
                     f"step, medians of {len(mine_blocks)} and {len(pooled)} blocks (cost.train_cpu_block_s), noise "
                     f"band ±{band:.0%}; {why})",
                     brief=f"speed: train CPU per step {ratio:.2f}x the baseline's (limit {limit:.2f}x)")
    steps = [i.last_step for i, _ in base] + [run[0].last_step]
    if min(steps) < MIN_SPEED_STEPS:
        return _too_few([s for _, s in base] + [run[1]], steps)
    cpu = [cpu_per_step(i, s) for i, s in base]
    mine = cpu_per_step(*run)
    if mine is not None and cpu and None not in cpu:
        ref = float(np.median(cpu))
        ratio = mine / ref
        return Check("speed", REGRESSION if ratio > 1 + tolerance else OK,
                     f"train CPU {mine * 1e3:.2f} vs {ref * 1e3:.2f} ms/step ({ratio:.2f}x; the worker's CPU time "
                     f"of the training loop, cost.train_cpu_s, no blocks recorded: no noise band; {limit_text})",
                     brief=f"speed: train CPU per step {ratio:.2f}x the baseline's (limit {1 + tolerance:.2f}x)")
    times = [i.step_time_s for i, _ in base if i.step_time_s]
    if run[0].step_time_s and times:
        ref_t = float(np.median(times))
        ratio = run[0].step_time_s / ref_t
        return Check("speed", REGRESSION if ratio > 1 + tolerance else OK,
                     f"wall {run[0].step_time_s * 1e3:.2f} vs {ref_t * 1e3:.2f} ms/step ({ratio:.2f}x; median "
                     f"wall-clock step time: no CPU time recorded, load on the machine moves it; {limit_text})",
                     brief=f"speed: wall-clock step time {ratio:.2f}x the baseline's (limit {1 + tolerance:.2f}x; "
                           f"no CPU time recorded)")
    return Check("speed", NOT_COMPARED, "no CPU time (cost.train_cpu_s) nor step times recorded")


def _too_few(summaries: list[dict], steps: list[int] | None = None) -> Check:
    runs = ", ".join(f"{s.get('last_step') or 0:,}" for s in summaries) if steps is None else \
        ", ".join(f"{n:,}" for n in steps)
    return Check("speed", NOT_COMPARED, f"not compared: too few steps ({runs}); a speed verdict needs "
                                        f"{MIN_SPEED_STEPS} steps a run: the medians of {MIN_SPEED_BLOCKS} blocks of "
                                        f"{CPU_BLOCK_STEPS} steps' CPU time after the first, to tell a change from noise")
