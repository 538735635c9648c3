"""The merged summary of a distributed run: ``out/summary.json`` from every
``out/rank-K/summary.json``. Torch-free (also used by ``optcheck soak --nproc``).

Every rank file is read by the one record reader
(:class:`optcheck.report.reader.RunReader`) with its policy: a line that is not
JSON (a rank killed mid-write) is skipped and named in the merged summary's
``notes``; a file of the wrong shape is not guessed at: it is named in ``notes``
and its records are left out (the merge runs inside the user's job at close, so it
reports, never raises).

The merged summary is a ``summary_version`` 2 summary
(``optcheck/schemas/summary-1.json``, :class:`optcheck.run.summary.Summary`):
rank 0's, with these fields merged over the ranks:

- ``status`` the worst of the ranks' (clean < running < findings < stopped <
  crashed < record-failed < interrupted; a rank without a summary counts as
  "crashed" and is listed in ``missing_ranks``), ``exit_code`` the highest (the
  codes of ``optcheck.run.exitcodes`` grow with precedence: 130 > 4 > 3 > 1 > 0);
- ``findings``/``findings_by_code``/``first_finding`` over every rank (cross-rank
  findings, which every rank computes from the same table, counted once: same code
  and message; see :func:`fold`), ``lead_time`` from them to ``crash``;
- ``last_step`` the lowest, ``peak_rss_bytes`` the highest;
- ``crash`` one rank's crash (with its ``rank``), preferring a rank's own exception
  over the collective error or timeout it left the other ranks in;
- added: ``world``, ``ranks`` (status, exit code, last step, findings, crash per
  rank), ``missing_ranks``, ``notes``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from optcheck.run import exitcodes
from optcheck.errors import InputError, RecordError
from optcheck.findings import lead_time
from optcheck.report.reader import RunReader
from optcheck.run.rundir import write_summary
from optcheck.run.summary import Summary

_ORDER = ("clean", "running", "findings", "stopped", "crashed", "record-failed", "interrupted")
_KNOCK_ON = ("Timed out", "Connection closed", "Connection reset", "no summary.json", "LauncherStopped",
             "SIGTERM from the launcher")  # a peer died, or the launcher stopped this rank because one did


def rank_dir(out: Path, rank: int) -> Path:
    return Path(out) / f"rank-{rank}"


def read_rank(out: Path, rank: int, notes: list[str] | None = None) -> dict | None:
    """``out/rank-K/summary.json`` checked by the record reader, or None when missing or
    unreadable (then why, appended to ``notes``)."""
    d = rank_dir(out, rank)
    if not (d / "summary.json").is_file():
        return None
    try:
        return RunReader(d).summary
    except InputError as e:
        if notes is not None:
            notes.append(f"rank {rank}: {e}")
        return None


def all_final(out: Path, world: int) -> bool:
    """True when every rank's ``summary.json`` exists with a final status (not "running")."""
    return all((read_rank(out, r) or {}).get("status") not in (None, "running") for r in range(world))


def read_findings(out: Path, rank: int, notes: list[str] | None = None) -> list[dict]:
    """``out/rank-K/findings.jsonl`` through the record reader: lines that are not JSON
    are skipped and named in ``notes`` (the reader's ``note:`` lines); a file of the wrong
    shape gives [] and its error in ``notes``."""
    d = rank_dir(out, rank)
    if not (d / "findings.jsonl").is_file():
        return []
    try:
        reader = RunReader(d)
        found = reader.findings
    except InputError as e:
        if notes is not None:
            notes.append(f"rank {rank}: {e}; its findings are left out")
        return []
    if notes is not None:
        notes += reader.notes()
    return found


def fold(rank: int, found: list[dict], seen: set, into: list[dict]) -> list[dict]:
    """Append ``rank``'s findings to ``into`` (each with its ``rank``), a cross-rank one
    (OC70x: the same code and message on every rank that reads the same table) once;
    return those appended. ``seen`` carries the keys between calls (a run folded
    incrementally, as ``optcheck soak --nproc`` prints findings live)."""
    added = []
    for f in found:
        if str(f.get("code", "")).startswith("OC70"):
            key = (f.get("code"), f.get("message"))
            if key in seen:
                continue
            seen.add(key)
        added.append({**f, "rank": rank})
    into += added
    return added


def merged(out: Path, world: int, source: str = "monitor") -> dict:
    """The merged summary of ranks 0..world-1 under ``out`` (see the module docstring)."""
    return collect(out, world, source)[0]


def collect(out: Path, world: int, source: str = "monitor") -> tuple[dict, list[dict]]:
    """:func:`merged` and the folded findings it counted (each with its ``rank``)."""
    notes: list[str] = []
    per, missing, findings, summaries = [], [], [], []
    seen: set = set()
    for r in range(world):
        s = read_rank(out, r, notes)
        summaries.append(s)
        if s is None:
            missing.append(r)
            per.append({"rank": r, "status": "crashed", "exit_code": exitcodes.CRASHED, "last_step": None,
                        "findings": None, "crash": {"message": "no summary.json from this rank"}})
        else:
            per.append({"rank": r, "status": s.get("status"), "exit_code": s.get("exit_code"),
                        "last_step": s.get("last_step"), "findings": s.get("findings"), "crash": s.get("crash"),
                        "stopped": s.get("stopped"), "findings_by_code": s.get("findings_by_code")})
        fold(r, read_findings(out, r, notes), seen, findings)
    base = summaries[0] if summaries[0] and summaries[0].get("summary_version") == Summary.summary_version \
        else Summary(run=Path(out).name, backend="pytorch", source=source).to_dict()
    s = dict(base)
    s.update(run=Path(out).name, source=source, out=str(out))
    refresh(s, per, findings, missing, notes)
    peaks = [x.get("peak_rss_bytes") for x in summaries if x and isinstance(x.get("peak_rss_bytes"), int)]
    s["peak_rss_bytes"] = max(peaks, default=s.get("peak_rss_bytes") or 0)
    return s, findings


def refresh(s: dict, per: list[dict], findings: list[dict], missing: list[int], notes: list[str]) -> dict:
    """Fill the merged fields of ``s`` from the per-rank entries ``per`` (as in
    ``s["ranks"]``, possibly amended by the caller) and the folded ``findings``."""
    status = max((p["status"] if p["status"] in _ORDER else "crashed" for p in per), key=_ORDER.index)
    by_code: dict[str, int] = {}
    for f in findings:
        by_code[f["code"]] = by_code.get(f["code"], 0) + 1
    steps = [p["last_step"] for p in per if isinstance(p["last_step"], int)]
    codes = [p["exit_code"] for p in per if isinstance(p["exit_code"], int)]
    first = min(findings, key=lambda f: (f.get("step", 0), f.get("rank", 0))) if findings else None
    crashes = [dict(p["crash"], rank=p["rank"]) for p in per if p.get("crash")]
    # the root cause first: a rank's own exception, not the collective timeout it left the others in
    crashes.sort(key=lambda c: any(w in str(c.get("message", "")) + str(c.get("exc_type", "")) for w in _KNOCK_ON))
    crash = crashes[0] if crashes else None
    ordered = sorted(findings, key=lambda f: (f.get("step", 0), f.get("rank", 0)))
    s.update(world=len(per), status=status, exit_code=exitcodes.worst(codes + ([exitcodes.CRASHED] if missing else [])),
             last_step=min(steps) if steps else 0, findings=len(findings), findings_by_code=by_code,
             first_finding=first, crash=crash, lead_time=lead_time(ordered, crash), missing_ranks=missing,
             ranks=per, notes=notes)
    return s


def write_merged(out: Path, world: int) -> dict:
    """Write :func:`merged` to ``out/summary.json`` atomically (``optcheck.run.rundir.write_summary``);
    return it. Two ranks merging at once (rank 0 and a late rank) may collide on the temporary
    file: tried three times, then left (the other one's is as good)."""
    s = merged(out, world)
    for attempt in range(3):
        try:
            write_summary(out, s)
            break
        except RecordError:
            time.sleep(0.05 * (attempt + 1))
    return s


def ranks_in(message: str, me: int, world: int) -> list[int]:
    """Rank numbers a gloo ``monitored_barrier`` error names ("Rank 1 failed to pass
    monitoredBarrier"), without ``me``; every other rank when it names none."""
    named = re.search(r"Ranks? \[?([\d,\s]+?)\]? failed to pass", message)  # ProcessGroupGloo.cpp's wording
    found = sorted({int(m) for m in re.findall(r"\d+", named.group(1))} - {me}) if named else []
    found = [r for r in found if r < world]
    return found or [r for r in range(world) if r != me]
