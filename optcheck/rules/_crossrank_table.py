"""Reading the table the ranks of a ``torch.distributed`` job exchange (``ranks`` of a
snapshot; its layout: ``crossrank.py``): which parameters, buffers, step counts and
param groups differ from rank 0's, and on which ranks. Torch-free, no rule here: the
rules OC701–OC705 (``crossrank.py``) build their findings on it, and the exchange
(``optcheck/distributed/watch.py``) uses :func:`disagreements` to decide whether to
snapshot at once.
"""

from __future__ import annotations

from typing import Iterable


def table(snap: dict) -> dict | None:
    """The snapshot's cross-rank table (a dict with ``rows``), or None."""
    t = snap.get("ranks")
    return t if isinstance(t, dict) and isinstance(t.get("rows"), list) and len(t["rows"]) > 1 else None


def differing(t: dict, field: str, skip: Iterable[str] = ()) -> dict[str, list[int]]:
    """``{param name: [ranks whose value of per-parameter ``field`` differs from rank 0's]}``; a
    parameter in either row's ``empty`` list (that rank's shard holds none of it) is not compared."""
    names, rows, skip = t.get("params") or [], t["rows"], set(skip)
    ref = rows[0].get(field) or []
    ref_empty = set(rows[0].get("empty") or ())
    out: dict[str, list[int]] = {}
    for row in rows[1:]:
        vals = row.get(field) or []
        empty = ref_empty | set(row.get("empty") or ())  # FSDP1: a rank holding none of it has nothing to compare
        for i, name in enumerate(names):
            if name in skip or name in empty or i >= len(ref) or i >= len(vals):
                continue
            if vals[i] != ref[i]:
                out.setdefault(name, []).append(row["rank"])
    return out


def ranks_of(diff: dict[str, list[int]]) -> list[int]:
    return sorted({r for rs in diff.values() for r in rs})


def rank_words(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def disagreements(t: dict) -> set[str]:
    """Keys of every cross-rank difference in table ``t`` (OC701–OC705): what the
    exchange uses to decide whether to snapshot at once (a new key) or wait for the
    next snapshot."""
    keys: set[str] = set()
    sharded = t.get("sharded") or []
    if t.get("kind") == "ddp":
        keys |= {f"param:{n}" for n in differing(t, "checksums", sharded)}
    keys |= {f"grad:{n}" for n in differing(t, "grads")}
    keys |= {f"state:{n}" for n in differing(t, "state_steps")}
    ref = t["rows"][0]
    for row in t["rows"][1:]:
        for k in ("groups_keys", "groups_options", "step"):
            if row.get(k) != ref.get(k):
                keys.add(f"{k}:{row['rank']}")
    return keys


def group_diff(t: dict) -> list[str]:
    """What differs in the param groups, from the ``groups`` detail (when gathered)."""
    detail = t.get("groups")
    if not detail:
        return []
    ref = detail[0].get("groups") or []
    out = []
    for entry in detail[1:]:
        mine, r = entry.get("groups") or [], entry.get("rank")
        if len(mine) != len(ref):
            out.append(f"rank {r} has {len(mine)} param group(s), rank 0 {len(ref)}")
            continue
        for i, (a, b) in enumerate(zip(ref, mine)):
            if a.get("keys") != b.get("keys"):
                extra = sorted(set(b.get("keys") or []) ^ set(a.get("keys") or []))
                out.append(f"group {i} keys differ on rank {r} ({', '.join(extra)})")
            if a.get("members") != b.get("members"):
                out.append(f"group {i} members differ on rank {r}")
            oa, ob = a.get("options") or {}, b.get("options") or {}
            for k in sorted(set(oa) & set(ob)):
                if oa[k] != ob[k]:
                    out.append(f"group {i} {k}={ob[k]!r} on rank {r}, {oa[k]!r} on rank 0")
    return out
