"""The ranks' records of a distributed run, read back for the merged ``out/summary.json``.
Torch-free (also used by ``optcheck soak --nproc``).

Every rank file is read by the one record reader
(:class:`optcheck.report.reader.RunReader`) with its policy: a line that is not
JSON (a rank killed mid-write) is skipped and named in the merged summary's
``notes``; a file of the wrong shape is not guessed at: it is named in ``notes``
and its records are left out (the merge runs inside the user's job at close, so it
reports, never raises).

What the merged summary counts, and who writes it, is the recorder's
(``optcheck/run/rank_fold.py``, :class:`optcheck.run.recorder.RankRecorder`): this
module reads the ranks' files (:func:`read_ranks`), folds their findings (a
cross-rank finding once: :func:`fold`) and says which crash is a knock-on of a
peer's end (:func:`knock_on`).
"""

from __future__ import annotations

import re
from pathlib import Path

from optcheck.errors import InputError
from optcheck.report.reader import RunReader
from optcheck.run.recorder import RankRecorder

#: Words of a crash a peer's end caused: a collective that timed out or lost its connection, a
#: rank with no summary, the launcher stopping this rank because another failed.
KNOCK_ON = ("Timed out", "Connection closed", "Connection reset", "no summary.json", "LauncherStopped",
            "SIGTERM from the launcher")


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


def knock_on(crash: dict) -> bool:
    """Whether a rank's ``crash`` is the knock-on of a peer's end (:data:`KNOCK_ON`), not its own fault."""
    return any(w in str(crash.get("message", "")) + str(crash.get("exc_type", "")) for w in KNOCK_ON)


def read_ranks(out: Path, world: int) -> tuple[list[dict | None], list[dict], list[str]]:
    """Every rank's checked ``summary.json`` (None when missing or unreadable), their findings
    folded (:func:`fold`, each with its ``rank``) and the notes of what could not be read."""
    notes: list[str] = []
    ranks, findings, seen = [], [], set()
    for r in range(world):
        ranks.append(read_rank(out, r, notes))
        fold(r, read_findings(out, r, notes), seen, findings)
    return ranks, findings, notes


def merged(out: Path, world: int, source: str = "monitor") -> dict:
    """The merged summary of ranks 0..world-1 under ``out``, counted (not written)."""
    from optcheck.run.rank_fold import fold_ranks

    return fold_ranks(*read_ranks(out, world), out=out, source=source, knock_on=knock_on)


def write_merged(out: Path, world: int) -> dict:
    """Fold the ranks' summaries into ``out/summary.json`` (:class:`optcheck.run.recorder.RankRecorder`,
    tried three times: rank 0 and a late rank may fold at once); return it."""
    return RankRecorder(out, source="monitor", knock_on=knock_on).fold(*read_ranks(out, world), attempts=3)


def ranks_in(message: str, me: int, world: int) -> list[int]:
    """Rank numbers a gloo ``monitored_barrier`` error names ("Rank 1 failed to pass
    monitoredBarrier"), without ``me``; every other rank when it names none."""
    named = re.search(r"Ranks? \[?([\d,\s]+?)\]? failed to pass", message)  # ProcessGroupGloo.cpp's wording
    found = sorted({int(m) for m in re.findall(r"\d+", named.group(1))} - {me}) if named else []
    found = [r for r in found if r < world]
    return found or [r for r in range(world) if r != me]
