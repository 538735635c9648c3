"""The verdict on two runs that should train alike: identical, within numerical noise, within the
seed band, or diverged.

One function decides it for ``optcheck compare``, ``optcheck upgrade`` and any
later baseline check, so they can never disagree: :func:`judge`. Torch-free.

* **identical**: every common step's training loss is bit-for-bit equal, and so
  is every recorded parameter fingerprint (``value_norm`` and ``grad_norm`` of
  each parameter in each snapshot both runs took at the same step).
* **within numerical noise**: the two runs used the same seed and batches (their
  ``summary.json`` configs say so) and no step's loss differs by more than float
  rounding explains: ``|loss_A - loss_B| <= noise_tolerance(step) x max(|loss_A|, 1e-3)``.
* **within the seed band**: runs of different seeds (one run a side, against the caller's
  smoothed tolerance, or seed sets, :func:`judge_seed_band`), or a **migration**
  (``optcheck.judge.policy``: another backend or native library, where float rounding differs
  and grows chaotically): the trailing-mean losses stay within the band that seed noise
  spans. A weaker claim than numerical noise, and worded apart.
* **diverged**: a step's loss differs beyond that (the first such step and the
  size are reported), or, for runs of different seeds or a migration, beyond the seed band.

The same-seed tolerance comes from measurements on the built-in GPT (2 layers,
64 wide, AdamW, torch 2.13 CPU), recorded in ``docs/verdict.md``: ``--threads 2``
against 1 differs by at most 4.8e-7 (relative ~3e-7) over 2,000 steps, while
``--lr`` x 1.01 differs by 5.2e-6 relative at step 2, 1.4e-5 at step 3 and
1.9e-4 at step 10. The tolerance starts at 1e-5 and grows linearly (2x at
step 1,000), 30x above the measured rounding noise at every step.

Runs of different seeds cannot be judged on one pair: with several seeds per
side (``optcheck soak --seeds 1,2,3``) :func:`judge_seed_band` checks that each
candidate seed's smoothed loss stays inside the band around the baseline seeds' mean.
Over 400 lines: the verdict words and the tolerances behind each (identical, numerical noise, seed band, diverged) must agree with one another.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from optcheck.judge.policy import MIGRATION, RERUN, option_differences
from optcheck.series import moving_mean

IDENTICAL, WITHIN_NOISE, WITHIN_SEED_BAND, DIVERGED = "identical", "within-noise", "within-seed-band", "diverged"
#: Relative per-step loss tolerance of a same-seed comparison at step 0.
NOISE_RTOL = 1e-5
#: The tolerance grows by NOISE_RTOL every this many steps (rounding differences accumulate).
NOISE_GROWTH_STEPS = 1000
#: Loss magnitude below which the relative tolerance is taken of this floor (nats).
LOSS_FLOOR = 1e-3
#: Snapshot quantities are more sensitive than the loss: their tolerance is this many times the loss's.
QUANTITY_FACTOR = {"value_norm": 10.0, "grad_norm": 100.0}
#: Config keys that name a run, not its training.
_NOT_TRAINING = {"run_id", "work_dir", "step_timeout_s", "stop_on_finding"}


def noise_tolerance(step: int | np.ndarray):
    """Relative loss difference float rounding explains at ``step`` (dimensionless)."""
    return NOISE_RTOL * (1.0 + np.asarray(step, float) / NOISE_GROWTH_STEPS)


@dataclass
class Localisation:
    """Where two same-seed runs first differ in their snapshots.

    Attributes:
        step: the first snapshot step both runs took where a quantity differs beyond noise.
        param: the parameter whose quantity differs most there (relative to its tolerance), or None.
        quantity: ``value_norm`` or ``grad_norm`` (of ``param``).
        a, b: its values in run A and B.
        rel_diff: |a - b| / |a|.
        options: optimizer options that differ at that snapshot, as "lr 0.001 vs 0.00101 on group 0".
    """

    step: int
    param: str | None = None
    quantity: str | None = None
    a: float | None = None
    b: float | None = None
    rel_diff: float | None = None
    options: list[str] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)

    def text(self) -> str:
        parts = []
        if self.param is not None:
            parts.append(f"{self.param} {self.quantity} {self.a:.6g} vs {self.b:.6g} (relative {self.rel_diff:.2g})")
        parts += self.options
        if not parts:
            return f"snapshot step {self.step:,}: the options both sides have agree"
        return f"first differs at snapshot step {self.step:,}: " + "; ".join(parts)


@dataclass
class Verdict:
    """The answer for two runs; :meth:`headline` is the line printed first.

    Attributes:
        kind: ``identical``, ``within-noise``, ``within-seed-band`` or ``diverged``.
        basis: ``same-seed`` (per-step tolerance of :func:`noise_tolerance`),
            ``seed-band`` (:func:`judge_seed_band`), ``tolerance`` (a smoothed
            tolerance given by the caller, for single runs of different seeds) or
            ``migration`` (the smoothed tolerance, for another backend or native library).
        steps: common steps compared.
        max_abs_diff, max_rel_diff, max_step: the largest loss difference, relative to A's loss, and its step.
        first_step: first step beyond tolerance (diverged only); when only the parameters
            diverge, the first step whose loss differs at all (the paths split there), else the
            first snapshot step that differs.
        first_differs: first step whose losses are not bit-for-bit equal (None when none is).
        loss_a, loss_b, tolerance: the losses there and the tolerance (absolute, loss units).
        fingerprints: parameter fingerprints compared (0 when none were recorded).
        where: the first snapshot that differs (same-seed runs), or None.
        differences: what differs between the runs' configs and versions.
        policy, policy_why: ``rerun`` or ``migration`` (``optcheck.judge.policy``) and why it was chosen.
        smoothing: the trailing-mean window the sizes are of (None: per-step sizes).
        rounding_until: migration: the first step whose loss differs beyond float rounding
            (reported, not failed); None when none does.
        band: the smoothed tolerance's text ("0.03 + 5% of A's 50-step trailing mean").
    """

    kind: str
    basis: str
    steps: int
    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    max_step: int | None = None
    first_step: int | None = None
    first_differs: int | None = None
    loss_a: float | None = None
    loss_b: float | None = None
    tolerance: float | None = None
    fingerprints: int = 0
    where: Localisation | None = None
    differences: list[str] = field(default_factory=list)
    policy: str = RERUN
    policy_why: str = ""
    smoothing: int | None = None
    rounding_until: int | None = None
    band: str = ""

    @property
    def diverged(self) -> bool:
        return self.kind == DIVERGED

    def to_dict(self) -> dict:
        return asdict(self)

    def headline(self) -> str:
        """``IDENTICAL: ...``, ``WITHIN NUMERICAL NOISE (...): ...``, ``WITHIN THE SEED BAND (...): ...``
        or ``DIVERGED from step N: ...``, with the size."""
        what_diff = f"{self.smoothing}-step trailing-mean loss difference" if self.smoothing else "loss difference"
        size = (f"largest {what_diff} {self.max_abs_diff:.2g} (relative {self.max_rel_diff:.2g}) "
                f"at step {self.max_step:,}" if self.max_step is not None and math.isfinite(self.max_abs_diff)
                else "a non-finite loss in one run only")
        if self.kind == IDENTICAL:
            fp = f" and {self.fingerprints:,} parameter fingerprints" if self.fingerprints else ""
            return f"IDENTICAL: {self.steps:,} steps, bit-for-bit equal losses{fp}"
        since = f", first differing at step {self.first_differs:,}" if self.first_differs is not None else ""
        if self.kind == WITHIN_NOISE:
            return f"WITHIN NUMERICAL NOISE (same seed and batches, float-rounding size): {size}{since}"
        if self.kind == WITHIN_SEED_BAND:
            what = {"seed-band": "inside the baseline seeds' band",
                    "tolerance": f"different seeds, inside {self.band or 'the given tolerance'}",
                    "migration": f"migration, {self.policy_why}: inside {self.band or 'the seed tolerance'}"
                    }.get(self.basis, self.basis)
            if self.basis == "migration":
                since = (f"; float-rounding agreement until step {self.rounding_until:,}"
                         if self.rounding_until is not None else "; float-rounding agreement throughout")
            return f"WITHIN THE SEED BAND ({what}): {size}{since}"
        loss = f"{self.smoothing}-step trailing-mean loss" if self.smoothing else "loss"
        first = (f"{loss} {self.loss_a:.6g} (A) vs {self.loss_b:.6g} (B), beyond tolerance {self.tolerance:.2g}"
                 if self.loss_a is not None and self.loss_b is not None and self.tolerance is not None
                 else "the parameters differ beyond noise, the losses within it")
        if self.loss_a is not None and self.loss_b is not None \
                and math.isfinite(self.loss_a) != math.isfinite(self.loss_b):
            first += f" (one run's loss is not finite from step {self.first_step:,})"
        if self.basis == "migration":
            first += f" (migration, {self.policy_why}: {self.band or 'the seed tolerance'})"
        elif self.basis == "seed-band":
            first += " (outside the baseline seeds' band)"
        return f"DIVERGED from step {self.first_step:,}: {first}; {size}"

    def lines(self) -> list[str]:
        """The headline, then where it first differs and what differs between the runs."""
        out = [self.headline()]
        if self.where is not None:
            out.append("  " + self.where.text())
            if self.where.not_compared:
                out.append("  options not compared (one side only): " + ", ".join(self.where.not_compared))
        if self.differences:
            out.append("  runs differ in: " + "; ".join(self.differences))
        if self.policy == RERUN and self.policy_why:
            out.append(f"  policy: rerun ({self.policy_why}): " + ("same seed and batches, judged step by step on "
                       "float rounding" if self.basis == "same-seed" else f"different seeds, judged on "
                       f"{self.band or 'the smoothed losses'}"))
        if self.policy == MIGRATION:
            out.append(f"  policy: migration ({self.policy_why}): judged on {self.band or 'the smoothed losses'}, "
                       f"the seed band, not on float rounding; options compared where both sides have them "
                       f"(optcheck.judge.policy.OPTION_NAMES)")
        return out


# -- what differs between two runs --------------------------------------------------------

def _flat(config: dict) -> dict:
    out = {}
    for k, v in (config or {}).items():
        if k in _NOT_TRAINING:
            continue
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out


def config_differences(summary_a: dict, summary_b: dict) -> list[str]:
    """What differs between two runs' ``summary.json``: backend, config values, injected
    faults and library versions, as ``"lr 0.001 vs 0.0012"``, ``"torch 2.13.0 → 2.14.1"``."""
    out = []
    if summary_a.get("backend") != summary_b.get("backend"):
        out.append(f"backend {summary_a.get('backend')} vs {summary_b.get('backend')}")
    ca, cb = _flat(summary_a.get("config") or {}), _flat(summary_b.get("config") or {})
    for k in sorted(set(ca) | set(cb)):
        if k != "backend" and ca.get(k) != cb.get(k):
            out.append(f"{k} {ca.get(k, '-')} vs {cb.get(k, '-')}")
    if (summary_a.get("inject") or []) != (summary_b.get("inject") or []):
        out.append(f"inject {','.join(summary_a.get('inject') or []) or '-'} vs "
                   f"{','.join(summary_b.get('inject') or []) or '-'}")
    va, vb = summary_a.get("versions") or {}, summary_b.get("versions") or {}
    for k in sorted(set(va) | set(vb)) if va and vb else ():  # a run without versions (still running) says nothing
        if va.get(k) != vb.get(k):
            out.append(f"{k} {va.get(k, '-')} → {vb.get(k, '-')}")
    return out


def same_batches(summary_a: dict, summary_b: dict) -> bool:
    """True when both runs record a config with the same seed, batch shape and corpus:
    they read the same batches (``optcheck.data.BatchSchedule``), so a same-seed verdict applies."""
    ca, cb = summary_a.get("config"), summary_b.get("config")
    if not isinstance(ca, dict) or not isinstance(cb, dict):
        return False
    keys = ("seed", "batch_size", "block_size")
    corpus = lambda s: (s.get("corpus") or {}).get("sha256")  # noqa: E731
    return all(ca.get(k) == cb.get(k) for k in keys) and corpus(summary_a) == corpus(summary_b)


# -- snapshots ------------------------------------------------------------------------------

def _index(snaps: list[dict]) -> dict[tuple, dict]:
    """Snapshots by (step, phase); the last of each wins."""
    return {(s.get("step"), s.get("phase")): s for s in snaps if isinstance(s, dict)}


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _option_diffs(sa: dict, sb: dict, policy: str = RERUN) -> tuple[list[str], list[str]]:
    """(options that differ, as "lr 0.001 vs 0.002 on group 0"; options one side only has,
    not compared under the migration policy: ``optcheck.judge.policy.option_differences``)."""
    out, lone = [], []
    for ga, gb in zip(sa.get("groups") or [], sb.get("groups") or []):
        diffs, only = option_differences(ga.get("options") or {}, gb.get("options") or {}, policy)
        out += [f"{k} {x} vs {y} on group {ga.get('index', '?')}" for k, x, y in diffs]
        lone += [o for o in only if o not in lone]
    return out, lone


def fingerprints(snaps_a: list[dict], snaps_b: list[dict]) -> tuple[int, bool]:
    """(number of parameter fingerprints both runs recorded at the same snapshots, all bit-equal)."""
    ia, ib = _index(snaps_a), _index(snaps_b)
    n, equal = 0, True
    for key in sorted(set(ia) & set(ib), key=lambda k: (k[0] or 0, str(k[1]))):
        pb = {p.get("name"): p for p in ib[key].get("params") or []}
        for p in ia[key].get("params") or []:
            q = pb.get(p.get("name"))
            for qty in QUANTITY_FACTOR:
                if q is not None and qty in p and qty in q:
                    n += 1
                    equal = equal and p[qty] == q[qty]
    return n, equal


def localise(snaps_a: list[dict], snaps_b: list[dict], policy: str = RERUN) -> Localisation | None:
    """The first snapshot (by step) both runs took where an optimizer option differs or a
    parameter's ``value_norm`` / ``grad_norm`` differs by more than
    ``QUANTITY_FACTOR[q] x noise_tolerance(step)`` relative; the parameter named is the one
    whose difference is largest against its tolerance. None when nothing differs beyond noise.
    With the ``migration`` policy only options are compared (the parameters of two backends
    part by float rounding by design), under ``optcheck.judge.policy.OPTION_NAMES``, and the
    options one side only has are listed as not compared."""
    ia, ib = _index(snaps_a), _index(snaps_b)
    for key in sorted(set(ia) & set(ib), key=lambda k: (k[0] or 0, str(k[1]))):
        sa, sb = ia[key], ib[key]
        step = int(key[0] or 0)
        options, lone = _option_diffs(sa, sb, policy)
        if policy == MIGRATION:
            if options or lone:
                return Localisation(step=step, options=options, not_compared=lone)
            continue
        best, best_ratio = None, 1.0
        pb = {p.get("name"): p for p in sb.get("params") or []}
        for p in sa.get("params") or []:
            q = pb.get(p.get("name"))
            if q is None:
                continue
            for qty, factor in QUANTITY_FACTOR.items():
                x, y = _num(p.get(qty)), _num(q.get(qty))
                if x is None or y is None:
                    if (x is None) != (y is None) and qty in p and qty in q:
                        best, best_ratio = (p["name"], qty, x, y, math.inf), math.inf
                    continue
                rel = abs(x - y) / max(abs(x), LOSS_FLOOR)
                ratio = rel / (factor * float(noise_tolerance(step)))
                if ratio > best_ratio:
                    best, best_ratio = (p["name"], qty, x, y, rel), ratio
        if best is not None or options:
            loc = Localisation(step=step, options=options)
            if best is not None:
                loc.param, loc.quantity, loc.a, loc.b, loc.rel_diff = best
                loc.a = math.nan if loc.a is None else loc.a
                loc.b = math.nan if loc.b is None else loc.b
            return loc
    return None


# -- the verdict ----------------------------------------------------------------------------

def judge(loss_a: dict[int, float], loss_b: dict[int, float], *, same_seed: bool,
          snaps_a: list[dict] = (), snaps_b: list[dict] = (), summary_a: dict | None = None,
          summary_b: dict | None = None, smoothed=None, policy: str = RERUN, policy_why: str = "",
          band: str = "") -> Verdict:
    """The verdict on runs A (reference) and B, from their losses ``{step: loss}`` (common steps only).

    Args:
        same_seed: the runs read the same batches from the same initialisation
            (:func:`same_batches`); then the per-step :func:`noise_tolerance` applies.
        snaps_a, snaps_b: their snapshots (dicts), for fingerprints and :func:`localise`.
        summary_a, summary_b: their ``summary.json``, for :func:`config_differences`.
        smoothed: an ``optcheck.judge.compare.LossComparison`` of the smoothed trajectories (the
            caller's seed tolerance): the verdict of runs of different seeds and of a migration.
        policy: ``rerun``, or ``migration`` (``optcheck.judge.policy``: another backend or native
            library; judged on ``smoothed`` even with the same seed, options compared where
            both sides have them). ``policy_why`` says why it was chosen.
        band: the smoothed tolerance in words, for the headline.

    Raises:
        ValueError: the runs have no step in common, or a migration without ``smoothed``.
    """
    common = sorted(set(loss_a) & set(loss_b))
    if not common:
        raise ValueError("no common step")
    if policy == MIGRATION and smoothed is None:
        raise ValueError("a migration is judged on the smoothed losses: pass smoothed")
    steps = np.array(common)
    a = np.array([loss_a[s] for s in common], float)
    b = np.array([loss_b[s] for s in common], float)
    differences = config_differences(summary_a or {}, summary_b or {})
    n_fp, fp_equal = fingerprints(list(snaps_a), list(snaps_b))
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)  # one side non-finite
    scale = np.maximum(np.nan_to_num(np.abs(a), nan=0.0, posinf=0.0), LOSS_FLOOR)
    rel = diff / scale
    i = int(np.argmax(rel))
    differs = np.nonzero(diff > 0)[0]
    basis = MIGRATION if policy == MIGRATION else "same-seed" if same_seed else "tolerance"
    v = Verdict(kind=WITHIN_NOISE, basis=basis, steps=len(common),
                max_abs_diff=float(diff[i]), max_rel_diff=float(rel[i]), max_step=int(steps[i]),
                fingerprints=n_fp, differences=differences,
                first_differs=int(steps[differs[0]]) if len(differs) else None,
                policy=policy, policy_why=policy_why, band=band)
    if same.all() and fp_equal:
        v.kind = IDENTICAL
        return v
    if same_seed and policy != MIGRATION:
        tol = noise_tolerance(steps) * scale
        beyond = np.nonzero(diff > tol)[0]
        if len(beyond):
            j = int(beyond[0])
            v.kind, v.first_step = DIVERGED, int(steps[j])
            v.loss_a, v.loss_b, v.tolerance = float(a[j]), float(b[j]), float(tol[j])
        v.where = localise(list(snaps_a), list(snaps_b))
        if v.where is not None and not v.diverged and v.where.param is not None:  # losses agree, parameters not
            split = v.first_differs is not None and v.first_differs <= v.where.step
            v.kind, v.first_step = DIVERGED, v.first_differs if split else v.where.step
        return v
    # different seeds, or a migration: the statistical verdict on the trailing means
    v.kind = WITHIN_SEED_BAND
    if policy == MIGRATION:
        beyond = np.nonzero(diff > noise_tolerance(steps) * scale)[0]
        v.rounding_until = int(steps[beyond[0]]) if len(beyond) else None
        v.where = localise(list(snaps_a), list(snaps_b), MIGRATION)
    if smoothed is not None:
        v.smoothing = smoothed.window
        v.max_abs_diff, v.max_step = smoothed.max_abs_diff, smoothed.max_abs_step
        v.max_rel_diff = smoothed.max_rel_diff
        if smoothed.diverged:
            v.kind, v.first_step = DIVERGED, smoothed.first_beyond_step
            v.loss_a, v.loss_b, v.tolerance = smoothed.mean_a, smoothed.mean_b, smoothed.tolerance
    return v


def seed_band(baseline: list[dict[int, float]], steps: list[int], *, window: int = 50,
              k: float = 5.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The band of several baseline seeds over ``steps`` (steps every run has).

    Each seed's loss is smoothed with a trailing mean over ``w = min(window, len(steps))``
    points; the band's centre is the seeds' mean, its half-width ``k`` seed standard
    deviations: the seeds' sample deviation at a step, but at least their median deviation
    over all steps (three seeds can agree by chance at one step), widened by sqrt(1 + 1/n)
    for the uncertainty of an n-seed mean.

    Returns:
        (steps of the smoothed points, centre, half-width, w): arrays of
        ``len(steps) - w + 1`` points, losses in the runs' units (nats per token).

    Raises:
        ValueError: fewer than two baseline seeds, or no step.
    """
    if len(baseline) < 2:
        raise ValueError("a seed band needs at least two baseline seeds")
    if not steps:
        raise ValueError("no step common to every run")
    w = min(window, len(steps))
    base = np.vstack([moving_mean([r[s] for s in steps], w)[0] for r in baseline])
    centre = np.nanmean(base, axis=0)
    sd = np.nanstd(base, axis=0, ddof=1)
    sd = np.maximum(sd, np.nanmedian(sd)) * math.sqrt(1 + 1 / len(baseline))
    return np.array(steps[w - 1:]), centre, k * sd, w


def judge_seed_band(baseline: list[dict[int, float]], candidate: list[dict[int, float]], *,
                    window: int = 50, k: float = 5.0) -> Verdict:
    """Runs of several seeds per side: each candidate seed's trailing-mean loss (``window``
    common steps) must stay within the :func:`seed_band` of the baseline seeds
    (``k`` seed standard deviations around their mean).

    Raises:
        ValueError: fewer than two baseline seeds, no candidate, or no step common to all.
    """
    if len(baseline) < 2 or not candidate:
        raise ValueError("a seed band needs at least two baseline seeds and one candidate seed")
    common = sorted(set.intersection(*(set(r) for r in baseline + candidate)))
    steps, centre, half, w = seed_band(baseline, common, window=window, k=k)
    means = lambda r: moving_mean([r[s] for s in common], w)[0]  # noqa: E731
    v = Verdict(kind=WITHIN_SEED_BAND, basis="seed-band", steps=len(common), smoothing=w)
    first = None
    for r in candidate:
        m = means(r)
        dist = np.abs(m - centre)
        kk = int(np.nanargmax(dist))
        if dist[kk] > v.max_abs_diff:
            v.max_abs_diff, v.max_step = float(dist[kk]), int(steps[kk])
            v.max_rel_diff = float(dist[kk] / max(abs(centre[kk]), LOSS_FLOOR))
        idx = np.nonzero(~(dist <= half))[0]
        if len(idx) and (first is None or steps[idx[0]] < steps[first[0]]):
            first = (int(idx[0]), m)
    if first is not None:
        j, m = first
        v.kind, v.first_step = DIVERGED, int(steps[j])
        v.loss_a, v.loss_b, v.tolerance = float(centre[j]), float(m[j]), float(half[j])
    return v
