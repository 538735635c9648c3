"""Several seeds per side: the ``seed-N`` runs ``optcheck soak --seeds`` writes, found
(:func:`seed_runs`) and judged as a set (:func:`compare_seed_sets`). Torch-free; used by
``optcheck compare`` and the baseline (``optcheck.judge.baseline``: a seed-set baseline)."""

from __future__ import annotations

import os
from pathlib import Path

from optcheck.errors import InputError
from optcheck.judge.compare import check_same_schedule, read_run
from optcheck.judge.verdict import judge_seed_band
from optcheck.report.reader import read_summary
from optcheck.run.exitcodes import CLEAN, FINDINGS


def seed_runs(path: str | os.PathLike) -> list[Path]:
    """The ``seed-N`` run directories of ``optcheck soak --seeds`` under ``path``, by N."""
    p = Path(path)
    found = [d for d in p.glob("seed-*") if d.is_dir() and d.name[5:].isdecimal()] if p.is_dir() else []
    return sorted(found, key=lambda d: int(d.name[5:]))


def compare_seed_sets(dir_a: str | os.PathLike, dir_b: str | os.PathLike, *,
                      window: int = 50) -> tuple:
    """Baseline seeds (``dir_a/seed-N``) against candidate seeds (``dir_b/seed-N``):
    ``optcheck.judge.verdict.judge_seed_band``. Returns (verdict, exit code, text).

    Raises:
        InputError: fewer than two baseline seeds or no candidate seed, a run unreadable,
            or no step common to all.
    """
    runs_a, runs_b = seed_runs(dir_a), seed_runs(dir_b)
    if len(runs_a) < 2 or not runs_b:
        raise InputError(f"{dir_a} / {dir_b}: a seed band needs at least two seed-N runs in the first and one in "
                         f"the second (optcheck soak --seeds 1,2,3 --out DIR), found {len(runs_a)} and {len(runs_b)}")
    first = read_summary(runs_a[0])
    for d in runs_a[1:] + runs_b:
        check_same_schedule(first, read_summary(d), f"{runs_a[0]} / {d}")
    infos, losses = [], []
    for d in runs_a + runs_b:
        info, loss, _ = read_run(d, d.parent.name + "/" + d.name)
        infos.append(info)
        losses.append(loss)
    try:
        v = judge_seed_band(losses[:len(runs_a)], losses[len(runs_a):], window=window)
    except ValueError as e:
        raise InputError(f"{dir_a} / {dir_b}: {e}") from None
    incomplete = [f"{i.label}: {i.incomplete()}" for i in infos if i.incomplete()]
    lines = v.lines() + [f"  baseline seeds: {', '.join(d.name[5:] for d in runs_a)} ({dir_a}); "
                         f"candidate seeds: {', '.join(d.name[5:] for d in runs_b)} ({dir_b}); "
                         f"{window}-step trailing mean, band: 5 seed standard deviations"]
    code = FINDINGS if v.diverged or incomplete else CLEAN
    if incomplete:
        lines.append(f"FAIL (exit {code}): cannot pass an incomplete run: {'; '.join(incomplete)}")
    elif v.diverged:
        lines.append(f"FAIL (exit {code}): OC601 run-divergence: the candidate's loss leaves the baseline seeds' band")
    else:
        lines.append(f"PASS (exit {code})")
    return v, code, "\n".join(lines)
