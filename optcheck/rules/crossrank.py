"""Cross-rank rules OC701–OC705: ranks of one ``torch.distributed`` job that no longer agree.

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

OC706 and OC707 read events one rank records (``ddp_unused`` after a backward
pass, ``rank_lost`` when the exchange itself fails): ``crossrank_events.py``.
What differs from rank 0 in the table, and on which ranks: ``_crossrank_table.py``.
Facts relied on: ``docs/distributed.md``.
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._crossrank_table import differing, disagreements, group_diff, rank_words, ranks_of, table  # noqa: F401 - disagreements: public here (optcheck.distributed.watch)
from optcheck.rules._fixtures import Invalid, Valid, at, cases, clean, rank_groups, ranks, steps
from optcheck.rules.base import Rule, RuleContext, listing, register


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

    @cases
    def VALID():
        return [
            Valid(steps(ranks(clean()), 200, 300), "DDP replicas that agree"),
            Valid((ranks(clean(), kind="fsdp", sharded=[f"layer{i}.weight" for i in range(3)],
                         rows={1: {"checksums": [1, 2, 3]}}),), "FSDP2: each rank holds another shard"),
            Valid((ranks(clean(), kind="none", rows={1: {"checksums": [1, 2, 3]}}),),
                  "no DDP, no replica contract"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((ranks(clean(), rows={1: {"checksums": [7_000, 1, 7_002]}}),),
                    "layer1.weight replaced on rank 1", step=100, param="layer1.weight"),
            Invalid((ranks(clean()), ranks(at(clean(), 200), 3, rows={2: {"checksums": [5, 7_001, 7_002]}})),
                    "no_sync() never left on rank 2: replicas part after step 100", step=200, param="layer0.weight"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        t = table(snap)
        if t is None or t.get("kind") != "ddp":
            return []
        diff = differing(t, "checksums", t.get("sharded") or [])
        if not diff:
            return []
        ranks = ranks_of(diff)
        steps = {row["rank"]: row.get("step") for row in t["rows"]}
        return [self.finding(
            snap, self.message.format(params=listing(diff), ranks=rank_words(ranks))
            + f" (optimizer steps taken: {', '.join(f'rank {r}: {s}' for r, s in steps.items())}; "
            f"backward pass {t.get('iteration')})",
            subjects=sorted(diff), key="ranks=" + ",".join(map(str, ranks)),
            next_failure="each rank now trains its own model; rank 0's checkpoint is not what the others trained",
            ranks=ranks, params={n: rs for n, rs in sorted(diff.items())}, steps=steps)]


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

    @cases
    def VALID():
        return [
            Valid(steps(ranks(clean(), groups=rank_groups(1e-3, 1e-3)), 200), "the same param groups on every rank"),
            Valid((ranks(clean(), kind="fsdp", sharded=[f"layer{i}.weight" for i in range(3)],
                         rows={1: {"checksums": [1, 2, 3]}}),), "FSDP2 shards differ, the groups agree"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((ranks(clean()), ranks(at(clean(), 200), rows={1: {"groups_options": 99}},
                                           groups=rank_groups(1e-3, 0.1))),
                    "a scheduler stepped on rank 1 only", step=200, param="rank 1"),
            Invalid((ranks(clean(), kind="fsdp", rows={1: {"groups_keys": 98}}),),
                    "a group key added on rank 1, no detail gathered", step=100, param="rank 1"),
        ]

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
        what = group_diff(t) or [f"param-group keys or options on {rank_words(ranks)} differ from rank 0's"]
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

    @cases
    def VALID():
        return [
            Valid(steps(ranks(clean()), 200, 300), "every rank took every step"),
            Valid((ranks(clean(), rows={1: {"grads": [99, 99, 99]}}),), "other gradient counts, the same steps"),
            Valid((ranks(clean(), kind="fsdp", rows={0: {"state_steps": [100, None, None],
                                                          "empty": ["layer1.weight", "layer2.weight"]}}),),
                  "FSDP1 (use_orig_params): rank 0's shard holds none of two parameters, no state there"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((ranks(clean()), ranks(at(clean(), 200), rows={1: {"step": 199, "state_steps": [199] * 3}})),
                    "rank 1 skipped a step (a local NaN check)", step=200, param="layer0.weight"),
            Invalid((ranks(clean(), kind="fsdp", rows={1: {"step": 101}}),),
                    "FSDP2: rank 1 stepped twice", step=100, param="rank 1"),
            Invalid((ranks(clean(), rows={1: {"state_steps": [100, 0, 100]}}),),
                    "rank 1 lost layer1.weight's state", step=100, param="layer1.weight"),
            Invalid((ranks(clean(), kind="fsdp", rows={0: {"state_steps": [100, None, None], "empty": ["layer2.weight"]}}),),
                    "FSDP1: a state lost where rank 0's shard is not empty", step=100, param="layer1.weight"),
        ]

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
            ranks |= set(ranks_of(diff))
            what.append(f"optimizer-state step of {listing(diff)} differs on {rank_words(ranks_of(diff))}")
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

    @cases
    def VALID():
        return [
            Valid(steps(ranks(clean()), 200), "every parameter used on every rank"),
            Valid((ranks(clean(), world=3, rows={r: {"grads": [100, 0, 100]} for r in range(3)}),),
                  "a parameter unused on every rank alike (OC202's, not cross-rank)"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((ranks(clean(), rows={1: {"grads": [100, 100, 60]}}),),
                    "layer2.weight routed around on rank 1 in 40 passes", step=100, param="layer2.weight"),
            Invalid((ranks(clean()), ranks(at(clean(), 200), rows={0: {"grads": [200, 199, 200]}})),
                    "rank 0 missed one gradient of layer1.weight", step=200, param="layer1.weight"),
        ]

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
        ranks = ranks_of(diff)
        return [self.finding(snap, self.message.format(params=listing(diff), ranks=rank_words(ranks)),
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

    @cases
    def VALID():
        return [
            Valid(steps(ranks(clean()), 200), "buffers broadcast from rank 0"),
            Valid((ranks(clean(), rows={1: {"checksums": [7_000, 7_001, 1]}}),), "parameters differ, buffers do not"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((ranks(clean(), rows={1: {"buffers": [123]}}),),
                    "broadcast_buffers=False: rank 1's BatchNorm statistics", step=100, param="bn.running_mean"),
        ]

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
        ranks = ranks_of(diff)
        return [self.finding(snap, self.message.format(buffers=listing(diff), ranks=rank_words(ranks)),
                             subjects=sorted(diff), key="ranks=" + ",".join(map(str, ranks)),
                             next_failure="nothing raises and the trained weights stay alike; evaluation differs "
                                          "per rank, and the checkpoint rank 0 saves holds its statistics only",
                             ranks=ranks, buffers={n: rs for n, rs in sorted(diff.items())})]
