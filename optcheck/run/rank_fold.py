"""The fold of a run of several ranks: ``OUT/summary.json`` counted from every
``OUT/rank-K/summary.json`` (``optcheck soak --nproc``, ``optcheck.Monitor`` under
``torchrun``). Torch-free. :class:`optcheck.run.recorder.RankRecorder` writes what
:func:`fold_ranks` counts; ``optcheck/distributed/merge.py`` only reads the ranks' files.

The merged summary is a ``summary_version`` 2 summary (:class:`optcheck.record.summary.Summary`):
rank 0's, with these fields counted over the ranks:

- ``status`` the worst of the ranks' and ``exit_code`` the worst of theirs, by the one
  order of ``optcheck.run.exitcodes`` (:data:`~optcheck.run.exitcodes.STATUS_ORDER`,
  :func:`~optcheck.run.exitcodes.worst`); a rank without a summary counts as crashed and is
  listed in ``missing_ranks``;
- ``findings``/``findings_by_code``/``first_finding`` over every rank's findings as given
  (cross-rank ones already counted once by the caller), ``lead_time`` from them to ``crash``;
- ``last_step`` the lowest, ``peak_rss_bytes`` the highest; ``steps_per_s`` from them and
  ``elapsed_s``;
- ``crash`` one rank's, with its ``rank``: a rank's own exception before a knock-on (the
  collective error or timeout a peer's end left the others in, as the caller's ``knock_on``
  tells);
- ``interrupted_by``: the signal optcheck itself got, else the one ranks got: sent to some
  ranks only (a SIGTERM to rank 1, not to optcheck), ``crash`` names the first of them and
  the signal, the others' knock-on errors go no further than the ``ranks`` table; a rank's
  own exception, though, is the crash (status crashed, exit 3), the interruptions of the
  others by the launcher its knock-on;
- added: ``world``, ``ranks`` (status, exit code, last step, findings, crash, interrupted_by
  per rank), ``missing_ranks``, ``notes``.

A supervisor that watched the job from outside (``optcheck soak --nproc``) adds what
only it knows: ``heartbeats`` (a rank still ``running`` was stopped: its last step),
``interrupted_by`` (optcheck was signalled: interrupted, 130), ``fault`` (a rank it saw
killed or hung: crashed, 3, naming it; the others' interruptions by the launcher are its
knock-on) and ``launcher_exit`` (the launcher failed and no rank says why: crashed, 3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from optcheck.findings import lead_time
from optcheck.run import exitcodes
from optcheck.record.summary import Summary


def _entry(rank: int, s: dict | None) -> dict:
    if s is None:
        return {"rank": rank, "status": "crashed", "exit_code": exitcodes.CRASHED, "last_step": None,
                "findings": None, "crash": {"message": "no summary.json from this rank"}}
    return {"rank": rank, "status": s.get("status"), "exit_code": s.get("exit_code"), "last_step": s.get("last_step"),
            "findings": s.get("findings"), "crash": s.get("crash"), "stopped": s.get("stopped"),
            "findings_by_code": s.get("findings_by_code"), "interrupted_by": s.get("interrupted_by")}


def _signalled(rank: int, sig: str, last_step: int | None) -> dict:
    """The ``crash`` of a run whose rank ``rank`` got signal ``sig`` (not from optcheck) after step
    ``last_step`` (None or 0 with no step recorded: at start-up, before its first step)."""
    step = (last_step or 0) + 1
    when = f"in step {step}" if last_step else "at start-up, before its first step"
    return {"rank": rank, "step": step, "exc_type": sig, "signal": sig,
            "message": f"rank {rank} got {sig} (not from optcheck) {when}; the other ranks were stopped"}


def fold_ranks(ranks: list[dict | None], findings: list[dict], notes: list[str], *, out: str | Path,
               source: str = "monitor", knock_on: Callable[[dict], bool] | None = None,
               heartbeats: dict[int, int] | None = None, interrupted_by: str | None = None,
               fault: dict | None = None, launcher_exit: int | None = None, launcher_log: str | None = None,
               elapsed_s: float | None = None, rank_signal: dict | None = None, **fields) -> dict:
    """The merged summary of ``ranks`` (each rank's checked ``summary.json``, None when it
    has none) and their ``findings`` (each with its ``rank``), as the module docstring says.
    ``fields`` are set last (the supervisor's config, steps asked for, times...).

    ``rank_signal``: ``{"rank", "signal"}``, the rank that ended first, by a signal that was not
    optcheck's nor a kill (a SIGTERM to rank 1), as the launcher's "Root Cause" report names it
    (``optcheck.distributed.launcher_report.root_cause``). That rank and signal are the run's story
    (interrupted, 130, ``crash`` naming them), whatever the ranks recorded: the rank may have
    ended before its Monitor ran (no summary), and the others record the launcher's SIGTERM
    that followed as an interruption of their own.

    Raises:
        AttributeError: a field in ``fields`` that no summary has.
    """
    knock_on = knock_on or (lambda crash: False)
    per = [_entry(r, s) for r, s in enumerate(ranks)]
    missing = [r for r, s in enumerate(ranks) if s is None]
    for e in per:  # a rank stopped from outside never wrote its final summary: its heartbeat says how far
        if e["status"] == "running" and heartbeats and e["rank"] in heartbeats:
            e.update(status="stopped", last_step=heartbeats[e["rank"]])
    base = ranks[0] if ranks and ranks[0] and ranks[0].get("summary_version") == Summary.summary_version \
        else Summary(run=Path(out).name, backend="pytorch", source=source).to_dict()
    s = dict(base)
    s.update(run=Path(out).name, source=source, out=str(out))

    status = exitcodes.worst_status(e["status"] for e in per)
    code = exitcodes.worst([e["exit_code"] for e in per if isinstance(e["exit_code"], int)]
                           + ([exitcodes.CRASHED] if missing else []))
    crashes = [dict(e["crash"], rank=e["rank"]) for e in per if e.get("crash")]
    crashes.sort(key=knock_on)  # the root cause first: a rank's own exception, not what it left the others in
    own = [c for c in crashes if not knock_on(c)]
    crash = crashes[0] if crashes else None
    signalled = [e for e in per if e["status"] == "interrupted" and e.get("interrupted_by")]
    if interrupted_by is not None:  # optcheck itself was signalled: every rank is being stopped
        status, code = "interrupted", exitcodes.INTERRUPTED
    elif fault is not None:  # a rank killed or hung, seen from outside: the others' ends are its knock-on
        status, code, crash = "crashed", exitcodes.CRASHED, fault
    elif rank_signal is not None:  # the launcher's root cause: one rank signalled first, the rest its knock-on
        r, interrupted_by = rank_signal["rank"], rank_signal["signal"]
        status, code = "interrupted", exitcodes.INTERRUPTED
        entry = per[r] if 0 <= r < len(per) else {"last_step": None}
        last = entry["last_step"] if isinstance(entry["last_step"], int) else (heartbeats or {}).get(r)
        crash = _signalled(r, interrupted_by, last)
        if r in missing:  # it ended before its Monitor wrote anything
            entry["interrupted_by"] = interrupted_by
    elif own and signalled:  # a rank's own exception; the launcher then stopped the others (SIGTERM)
        rest = [e for e in per if e not in signalled]
        status = exitcodes.worst_status([*(e["status"] for e in rest), "crashed"])
        code = exitcodes.worst([*(e["exit_code"] for e in rest if isinstance(e["exit_code"], int)), exitcodes.CRASHED])
    elif signalled and len(signalled) < len(per):  # a signal to some ranks, not to optcheck: name them
        first = signalled[0]
        interrupted_by = first["interrupted_by"]
        crash = _signalled(first["rank"], interrupted_by, first["last_step"] or 0)
    elif signalled:  # every rank got it (a Ctrl-C to the whole job): the job was interrupted
        interrupted_by = signalled[0]["interrupted_by"]
    elif launcher_exit not in (0, None) and exitcodes.worst([code, exitcodes.CRASHED]) == exitcodes.CRASHED:
        status, code = "crashed", exitcodes.CRASHED
        crash = crash or {"message": f"torch.distributed.run exited {launcher_exit}; see {launcher_log}"}

    by_code: dict[str, int] = {}
    for f in findings:
        by_code[f["code"]] = by_code.get(f["code"], 0) + 1
    ordered = sorted(findings, key=lambda f: (f.get("step", 0), f.get("rank", 0)))
    steps = [e["last_step"] for e in per if isinstance(e["last_step"], int)]
    peaks = [x.get("peak_rss_bytes") for x in ranks if x and isinstance(x.get("peak_rss_bytes"), int)]
    s.update(world=len(per), status=status, exit_code=code, last_step=min(steps) if steps else 0,
             findings=len(findings), findings_by_code=by_code, first_finding=ordered[0] if ordered else None,
             crash=crash, lead_time=lead_time(ordered, crash), missing_ranks=missing, ranks=per, notes=notes,
             peak_rss_bytes=max(peaks, default=s.get("peak_rss_bytes") or 0), interrupted_by=interrupted_by
             if interrupted_by is not None else s.get("interrupted_by"))
    failed = [(r, x["record_error"]) for r, x in enumerate(ranks) if x and x.get("record_error")]
    if failed:  # the first rank whose records stopped, and where (optcheck.run.recorder: "nothing recorded after")
        s["record_error"] = f"rank {failed[0][0]}: {failed[0][1]}"
    if elapsed_s is not None:
        s.update(elapsed_s=round(elapsed_s, 3), steps_per_s=round(s["last_step"] / elapsed_s, 2) if elapsed_s else None)
    for k, v in fields.items():
        if k not in s and k not in ("nproc",):
            raise AttributeError(f"summary.json has no field {k!r} (optcheck.record.summary.Summary)")
        s[k] = v
    return s
