"""Cross-rank rules OC701–OC707: ranks of one ``torch.distributed`` job that no longer agree.

Under ``torchrun`` every rank runs its own ``optcheck.Monitor``; at every
``every``-th backward pass the ranks exchange one small table
(``optcheck/distributed/table.py``: per-parameter checksums, gradient counts,
optimizer-state step counts, a hash of the param groups' keys and options, buffer
checksums) and each rank puts the whole table into its snapshot as ``ranks``
(schema: ``optcheck/schemas/snapshot-1.json``). These rules read only that field
(no torch), so every rank reaches the same verdict at the same backward pass.
Rank 0 is the reference: a finding names the ranks that differ from it.

``ranks`` (one snapshot field)::

    {"world": 2, "kind": "ddp" | "fsdp" | "none", "iteration": 12,
     "params": [names], "sharded": [names of FSDP-sharded params], "buffers": [names],
     "rows": [{"rank": 0, "step": 11, "groups_keys": int, "groups_options": int,
               "checksums": [int | None], "grads": [int], "state_steps": [int | None],
               "buffers": [int | None]}, ...],
     "groups": [{"rank": 0, "groups": [{"keys": [...], "options": {...}, "members": [...]}]}] | None}

OC706 reads an event (``ddp_unused``) one rank records after a backward pass;
OC707 an event (``rank_lost``) recorded when the exchange itself fails.
Facts relied on: ``docs/distributed.md``.
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._events import events
from optcheck.rules.base import Rule, RuleContext, listing, register


def table(snap: dict) -> dict | None:
    """The snapshot's cross-rank table (a dict with ``rows``), or None."""
    t = snap.get("ranks")
    return t if isinstance(t, dict) and isinstance(t.get("rows"), list) and len(t["rows"]) > 1 else None


def differing(t: dict, field: str, skip: Iterable[str] = ()) -> dict[str, list[int]]:
    """``{param name: [ranks whose value of per-parameter ``field`` differs from rank 0's]}``."""
    names, rows, skip = t.get("params") or [], t["rows"], set(skip)
    ref = rows[0].get(field) or []
    out: dict[str, list[int]] = {}
    for row in rows[1:]:
        vals = row.get(field) or []
        for i, name in enumerate(names):
            if name in skip or i >= len(ref) or i >= len(vals):
                continue
            if vals[i] != ref[i]:
                out.setdefault(name, []).append(row["rank"])
    return out


def _ranks_of(diff: dict[str, list[int]]) -> list[int]:
    return sorted({r for rs in diff.values() for r in rs})


def _rank_words(ranks: list[int]) -> str:
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


@register
class RankParamDivergence(Rule):
    """DDP replicas hold different parameter values (a checksum per parameter differs from rank 0's).

    ``DistributedDataParallel`` broadcasts rank 0's parameters once, at
    construction, and from then on keeps the replicas equal only by averaging
    gradients: every rank must apply the same update to the same values. Any
    rank-local change breaks that for good — a parameter replaced or re-initialised
    on one rank, an ``optimizer.step()`` skipped on one rank (a local NaN check),
    accumulation under ``no_sync()`` that never leaves it (gradients are never
    averaged), a different learning rate on one rank. Compared under DDP only: under
    FSDP each rank holds a different shard by design (``docs/distributed.md``).

    What fails next: nothing raises. Each rank trains its own model; the loss
    curves drift apart, and the checkpoint rank 0 saves is not the model the other
    ranks trained. Evaluation on rank 0 hides it.

    Fix: never change parameters on one rank only (do it on all, or broadcast
    from rank 0 afterwards: ``torch.distributed.broadcast(p.data, src=0)``);
    take or skip ``optimizer.step()`` on all ranks together (all-reduce the NaN
    flag first); leave ``no_sync()`` for the last micro-batch of each accumulation.
    """

    code, symbol, severity, family = "OC701", "rank-param-divergence", "error", "crossrank"
    message = "parameters differ across DDP ranks: {params} on {ranks} differ from rank 0"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        t = table(snap)
        if t is None or t.get("kind") != "ddp":
            return []
        diff = differing(t, "checksums", t.get("sharded") or [])
        if not diff:
            return []
        ranks = _ranks_of(diff)
        steps = {row["rank"]: row.get("step") for row in t["rows"]}
        return [self.finding(
            snap, self.message.format(params=listing(diff), ranks=_rank_words(ranks))
            + f" (optimizer steps taken: {', '.join(f'rank {r}: {s}' for r, s in steps.items())}; "
            f"backward pass {t.get('iteration')})",
            subjects=sorted(diff), key="ranks=" + ",".join(map(str, ranks)),
            next_failure="each rank now trains its own model; rank 0's checkpoint is not what the others trained",
            ranks=ranks, params={n: rs for n, rs in sorted(diff.items())}, steps=steps)]


def _group_diff(t: dict) -> list[str]:
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


@register
class RankGroupMismatch(Rule):
    """The optimizer's param groups differ across ranks: other keys, other members or other options (lr, weight_decay...).

    Every rank builds its own optimizer; nothing in ``torch.distributed`` checks
    that they agree. A learning-rate schedule stepped on one rank only, an option
    set from a rank-dependent value, a param group added on rank 0 after
    construction: the ranks then apply different updates to the same averaged
    gradient, and (under DDP) the replicas drift apart from that step on (OC701
    follows).

    What fails next: silent divergence of the replicas; under FSDP each shard is
    updated with another rule, which no later check can see.

    Fix: build the optimizer and the scheduler identically on every rank and step
    the scheduler on every rank; derive options from values all ranks share
    (broadcast them from rank 0).
    """

    code, symbol, severity, family = "OC702", "rank-group-mismatch", "error", "crossrank"
    message = "param groups differ across ranks: {what}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        t = table(snap)
        if t is None:
            return []
        ref = t["rows"][0]
        ranks = [row["rank"] for row in t["rows"][1:]
                 if row.get("groups_keys") != ref.get("groups_keys")
                 or row.get("groups_options") != ref.get("groups_options")]
        if not ranks:
            return []
        what = _group_diff(t) or [f"param-group keys or options on {_rank_words(ranks)} differ from rank 0's"]
        return [self.finding(snap, self.message.format(what="; ".join(what)), subjects=[f"rank {r}" for r in ranks],
                             key="ranks=" + ",".join(map(str, ranks)),
                             next_failure="the ranks apply different updates; DDP replicas drift apart (OC701)",
                             ranks=ranks, differences=what)]


@register
class RankStepMismatch(Rule):
    """Ranks have taken a different number of optimizer steps (the optimizer-state step counts differ).

    Each rank's Monitor counts ``optimizer.step()`` calls and the table carries
    every parameter's optimizer-state ``step``. They differ when one rank skipped
    a step (a local NaN/inf check, a ``GradScaler`` that found an inf on that rank
    only: its ``found_inf`` is not all-reduced unless the scaler is sharded-aware),
    or stepped twice, or lost its optimizer state (a rank-local reload).

    What fails next: Adam's bias correction and any step-based schedule now differ
    per rank; under DDP the replicas diverge (OC701).

    Fix: decide to skip a step collectively (all-reduce the flag, then every rank
    skips); restore optimizer state on every rank from the same checkpoint.
    """

    code, symbol, severity, family = "OC703", "rank-step-mismatch", "error", "crossrank"
    message = "optimizer step counts differ across ranks: {what}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        t = table(snap)
        if t is None:
            return []
        ref = t["rows"][0]
        what, ranks = [], set()
        for row in t["rows"][1:]:
            if row.get("step") != ref.get("step"):
                what.append(f"rank {row['rank']} has taken {row.get('step')} optimizer step(s), rank 0 {ref.get('step')}")
                ranks.add(row["rank"])
        diff = differing(t, "state_steps")
        if diff:
            ranks |= set(_ranks_of(diff))
            what.append(f"optimizer-state step of {listing(diff)} differs on {_rank_words(_ranks_of(diff))}")
        if not what:
            return []
        ranks_l = sorted(ranks)
        return [self.finding(snap, self.message.format(what="; ".join(what)), subjects=sorted(diff) or
                             [f"rank {r}" for r in ranks_l], key="ranks=" + ",".join(map(str, ranks_l)),
                             next_failure="bias correction and step-based schedules differ per rank; replicas diverge",
                             ranks=ranks_l, steps={row["rank"]: row.get("step") for row in t["rows"]})]


@register
class RankGradMissing(Rule):
    """A parameter got a gradient on some ranks and not on others (counted locally, before any all-reduce).

    The table counts, per parameter and rank, the backward passes in which autograd
    accumulated a gradient into it on that rank (a post-accumulate-grad hook,
    i.e. before DDP averages anything). Under ``DistributedDataParallel(...,
    find_unused_parameters=True)`` a parameter unused on one rank still ends with a
    ``.grad`` (the average of the others' gradients and that rank's zeros), so
    ``.grad`` alone cannot show it. Data-dependent branches (mixture-of-experts
    routing, a modality missing from one rank's batch) cause it; so does a
    parameter replaced on one rank (the hook is on the one the optimizer holds).

    What fails next: that parameter's effective learning rate is scaled by the
    fraction of ranks that used it; without ``find_unused_parameters`` DDP raises
    at the next forward (OC706).

    Fix: make every rank use every parameter (a zero-weighted term), or accept it
    knowingly (``--ignore OC704:<name>``).
    """

    code, symbol, severity, family = "OC704", "rank-grad-missing", "warning", "crossrank"
    message = "{params} got a gradient on some ranks only: none or fewer on {ranks}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        t = table(snap)
        if t is None:
            return []
        names, rows = t.get("params") or [], t["rows"]
        counts = {n: [(row["rank"], (row.get("grads") or [0] * len(names))[i]) for row in rows]
                  for i, n in enumerate(names)}
        diff = {}
        for n, per in counts.items():
            top = max(c for _, c in per)
            low = [r for r, c in per if c < top]
            if low:
                diff[n] = low
        if not diff:
            return []
        ranks = _ranks_of(diff)
        return [self.finding(snap, self.message.format(params=listing(diff), ranks=_rank_words(ranks)),
                             subjects=sorted(diff), key="ranks=" + ",".join(map(str, ranks)),
                             next_failure="DDP averages in zeros for it (find_unused_parameters) or raises (OC706)",
                             ranks=ranks, params={n: rs for n, rs in sorted(diff.items())},
                             counts={n: dict(map(lambda rc: (str(rc[0]), rc[1]), counts[n])) for n in diff})]


@register
class RankBufferDivergence(Rule):
    """Buffers (BatchNorm running statistics...) differ across ranks — information.

    DDP broadcasts rank 0's buffers before each forward only with
    ``broadcast_buffers=True`` (its default); with it off, or under FSDP, or when
    one rank's eval pass updates them, each rank keeps its own running statistics.
    That is often intended (SyncBatchNorm is the alternative), hence info only.

    What fails next: evaluation differs per rank; the checkpoint holds rank 0's
    statistics only.

    Fix: ``torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)``, or keep
    ``broadcast_buffers=True``, or accept it (``--ignore OC705``).
    """

    code, symbol, severity, family = "OC705", "rank-buffer-divergence", "info", "crossrank"
    message = "buffers differ across ranks: {buffers} on {ranks} differ from rank 0"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        t = table(snap)
        if t is None:
            return []
        names, rows = t.get("buffers") or [], t["rows"]
        ref = rows[0].get("buffers") or []
        diff: dict[str, list[int]] = {}
        for row in rows[1:]:
            for i, (a, b) in enumerate(zip(ref, row.get("buffers") or [])):
                if a != b and i < len(names):
                    diff.setdefault(names[i], []).append(row["rank"])
        if not diff:
            return []
        ranks = _ranks_of(diff)
        return [self.finding(snap, self.message.format(buffers=listing(diff), ranks=_rank_words(ranks)),
                             subjects=sorted(diff), key="ranks=" + ",".join(map(str, ranks)),
                             ranks=ranks, buffers={n: rs for n, rs in sorted(diff.items())})]


@register
class DdpUnusedParam(Rule):
    """Under DDP without ``find_unused_parameters``, a backward pass left parameters without a gradient.

    ``DistributedDataParallel`` waits, in each synchronising backward pass, for a
    gradient of every parameter it holds; a parameter the forward did not use never
    reports ready, so the reduction never finishes. This rank's Monitor sees it at
    the end of the backward pass (no post-accumulate-grad hook ran for the
    parameter) — one forward before PyTorch raises "Expected to have finished
    reduction in the prior iteration before starting a new one", which names
    parameter indices, or before a rank blocks in the all-reduce.

    What fails next: the next forward raises ``RuntimeError`` (or, if only some
    ranks skipped it, the other ranks hang in the all-reduce until the collective
    timeout).

    Fix: use the parameter in every forward, remove it from the model, or construct
    ``DistributedDataParallel(model, find_unused_parameters=True)`` (costs an
    extra pass over the graph each step).
    """

    code, symbol, severity, family = "OC706", "ddp-unused-param", "error", "crossrank"
    message = "DDP (find_unused_parameters=False) got no gradient for {params} on rank {rank}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        out = []
        for e in events(snap, "ddp_unused"):
            d = e.get("detail") or {}
            names = d.get("params") or []
            out.append(self.finding(
                snap, self.message.format(params=listing(names), rank=d.get("rank"))
                + f" in backward pass {d.get('iteration')}: the next forward will raise "
                "'Expected to have finished reduction in the prior iteration'",
                subjects=names, key=f"rank={d.get('rank')}:" + ",".join(names),
                next_failure="RuntimeError at the next forward (or the other ranks block in the all-reduce)",
                predicted_exception="RuntimeError", predicted_key="Expected to have finished reduction",
                rank=d.get("rank"), params=names))
        return out


@register
class RankLost(Rule):
    """A rank stopped answering: the cross-rank exchange failed or timed out.

    Every ``every`` backward passes the ranks exchange their table; when one rank
    has died (SIGKILL, out-of-memory killer, a crash) or hangs, the exchange fails
    with the peer's connection closed or times out after the process group's
    ``timeout`` (``init_process_group(timeout=...)``). The rank that sees it records
    which ranks did not answer (``monitored_barrier`` on gloo names them) and its
    step, then stops instead of blocking in the next collective.

    What fails next: every other collective of the job (DDP's all-reduce) blocks
    until its own timeout — 10 minutes on gloo by default, 10 minutes or more on NCCL.

    Fix: look at the lost rank's own records (``rank-K/summary.json``: its crash or
    its last step) and the launcher's log; set a shorter ``timeout`` so a lost rank
    ends the job sooner.
    """

    code, symbol, severity, family = "OC707", "rank-lost", "error", "crossrank"
    message = "rank(s) {ranks} stopped answering at backward pass {iteration}: {error}"

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        out = []
        for e in events(snap, "rank_lost"):
            d = e.get("detail") or {}
            ranks = d.get("ranks") or []
            out.append(self.finding(
                snap, self.message.format(ranks=", ".join(map(str, ranks)) or "unknown",
                                          iteration=d.get("iteration"), error=d.get("error", "")),
                subjects=[f"rank {r}" for r in ranks], key="lost",
                next_failure="every other collective blocks until its timeout",
                ranks=ranks, seen_by=d.get("rank")))
        return out
