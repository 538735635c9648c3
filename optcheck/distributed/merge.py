"""The merged summary of a distributed run: ``out/summary.json`` from every
``out/rank-K/summary.json``. Torch-free (also used by ``optcheck soak --nproc``).

Merged fields: ``status`` the worst of the ranks' (crashed > stopped > findings >
clean; a rank without a summary counts as "crashed" and is listed in
``missing_ranks``), ``exit_code`` the highest, ``findings`` the count over all ranks
(cross-rank findings, which every rank records, counted once: same code, step of
rank 0 and message), ``last_step`` the lowest, ``ranks`` one entry per rank
(status, exit code, last step, findings, crash), ``first_finding`` the earliest,
``crash`` one rank's crash (with its ``rank``), preferring a rank's own exception
over the collective error or timeout it left the other ranks in.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from optcheck import exitcodes

_ORDER = ("clean", "running", "findings", "stopped", "crashed")
_KNOCK_ON = ("Timed out", "Connection closed", "Connection reset", "no summary.json")  # a peer died


def read_rank(out: Path, rank: int) -> dict | None:
    """``out/rank-K/summary.json`` as a dict, or None when missing or unreadable."""
    try:
        return json.loads((Path(out) / f"rank-{rank}" / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def all_final(out: Path, world: int) -> bool:
    """True when every rank's ``summary.json`` exists with a final status (not "running")."""
    return all((read_rank(out, r) or {}).get("status") not in (None, "running") for r in range(world))


def read_findings(out: Path, rank: int) -> list[dict]:
    """Every readable line of ``out/rank-K/findings.jsonl`` (a torn last line is skipped)."""
    found = []
    try:
        lines = (Path(out) / f"rank-{rank}" / "findings.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def merged(out: Path, world: int) -> dict:
    """The merged summary of ranks 0..world-1 under ``out`` (see the module docstring)."""
    per, missing, findings = [], [], []
    seen: set[tuple] = set()
    for r in range(world):
        s = read_rank(out, r)
        if s is None:
            missing.append(r)
            per.append({"rank": r, "status": "crashed", "exit_code": exitcodes.CRASHED, "last_step": None,
                        "findings": None, "crash": {"message": "no summary.json from this rank"}})
        else:
            per.append({"rank": r, "status": s.get("status"), "exit_code": s.get("exit_code"),
                        "last_step": s.get("last_step"), "findings": s.get("findings"), "crash": s.get("crash"),
                        "stopped": s.get("stopped"), "findings_by_code": s.get("findings_by_code")})
        for f in read_findings(out, r):
            key = (f.get("code"), f.get("message")) if str(f.get("code", "")).startswith("OC70") else (r, len(findings))
            if key in seen:
                continue
            seen.add(key)
            findings.append({**f, "rank": r})
    status = max((p["status"] if p["status"] in _ORDER else "crashed" for p in per), key=_ORDER.index)
    by_code: dict[str, int] = {}
    for f in findings:
        by_code[f["code"]] = by_code.get(f["code"], 0) + 1
    steps = [p["last_step"] for p in per if isinstance(p["last_step"], int)]
    codes = [p["exit_code"] for p in per if isinstance(p["exit_code"], int)]
    first = min(findings, key=lambda f: (f.get("step", 0), f.get("rank", 0))) if findings else None
    crashes = [dict(p["crash"], rank=p["rank"]) for p in per if p.get("crash")]
    # the root cause first: a rank's own exception, not the collective timeout it left the others in
    crashes.sort(key=lambda c: any(w in str(c.get("message", "")) for w in _KNOCK_ON))
    crash = crashes[0] if crashes else None
    return {"run": Path(out).name, "backend": "pytorch", "source": "distributed", "world": world,
            "status": status, "exit_code": exitcodes.worst(codes + ([exitcodes.CRASHED] if missing else [])),
            "last_step": min(steps) if steps else 0, "findings": len(findings), "findings_by_code": by_code,
            "first_finding": first, "crash": crash, "missing_ranks": missing, "ranks": per, "out": str(out)}


def write_merged(out: Path, world: int) -> dict:
    """Write :func:`merged` to ``out/summary.json`` atomically (temp file + rename); return it."""
    s = merged(out, world)
    path = Path(out) / "summary.json"
    tmp = path.with_suffix(f".json.{os.getpid()}.tmp")  # ranks may merge at the same time
    tmp.write_text(json.dumps(s, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return s


def ranks_in(message: str, me: int, world: int) -> list[int]:
    """Rank numbers a gloo ``monitored_barrier`` error names ("Rank 1 failed to pass
    monitoredBarrier"), without ``me``; every other rank when it names none."""
    named = re.search(r"Ranks? \[?([\d,\s]+?)\]? failed to pass", message)  # ProcessGroupGloo.cpp's wording
    found = sorted({int(m) for m in re.findall(r"\d+", named.group(1))} - {me}) if named else []
    found = [r for r in found if r < world]
    return found or [r for r in range(world) if r != me]
