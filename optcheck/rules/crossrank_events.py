"""Cross-rank rules OC706 and OC707: what one rank records about the job as an event
(the comparison rules OC701–OC705 of the exchanged table are in ``crossrank.py``).

OC706 reads ``ddp_unused``, recorded by a rank after a backward pass in which DDP
(``find_unused_parameters=False``) got no gradient for some parameters; OC707 reads
``rank_lost``, recorded when the cross-rank exchange itself fails or times out
(``optcheck/distributed/``). Facts relied on: ``docs/distributed.md``.
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._events import events
from optcheck.rules._fixtures import Invalid, Valid, cases, clean, event, ranks, steps, with_events
from optcheck.rules.base import Rule, RuleContext, listing, register


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

    @cases
    def VALID():
        return [
            Valid(steps(ranks(clean(1)), 2, 3), "every parameter got a gradient on every rank"),
            Valid((with_events(ranks(clean(1)), event("rank_lost", 1, rank=0, iteration=1, ranks=[1], error="x")),),
                  "another event of the job"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((with_events(ranks(clean(1)), event("ddp_unused", 1, rank=1, iteration=1,
                                                        params=["extra.weight", "extra.bias"])),),
                    "rank 1's first backward pass left extra.* without a gradient", step=1, param="extra.weight"),
            Invalid((ranks(clean(1)), with_events(ranks(clean(2)), event("ddp_unused", 2, rank=0, iteration=2,
                                                                           params=["layer2.weight"]))),
                    "a data-dependent branch skipped in the second pass", step=2, param="layer2.weight"),
        ]

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

    What fails next: every other rank's next collective (DDP's all-reduce). A rank
    that died closed its connections: on gloo that collective fails at once
    ("Connection closed by peer"; measured, tests/distributed/test_next_failure_ranks.py).
    A rank that hangs, or a node gone without closing its connections, leaves it
    blocked until the process group's timeout — 10 minutes on gloo by default, 10
    minutes or more on NCCL.

    Fix: look at the lost rank's own records (``rank-K/summary.json``: its crash or
    its last step) and the launcher's log; set a shorter ``timeout`` so a lost rank
    ends the job sooner.
    """

    code, symbol, severity, family = "OC707", "rank-lost", "error", "crossrank"
    message = "rank(s) {ranks} stopped answering at backward pass {iteration}: {error}"

    @cases
    def VALID():
        return [
            Valid(steps(ranks(clean(4)), 5, 6), "every rank answers every exchange"),
            Valid((with_events(ranks(clean(4)), event("ddp_unused", 4, rank=1, iteration=4, params=["x.weight"])),),
                  "another event of the job"),
        ]

    @cases
    def INVALID():
        return [
            Invalid((ranks(clean(3)), with_events(clean(4), event(
                "rank_lost", 4, rank=0, iteration=3, ranks=[1], error="Connection closed by peer"))),
                "rank 1 killed: the exchange after step 3 fails", step=4, param="rank 1"),
            Invalid((with_events(clean(12), event("rank_lost", 12, rank=0, iteration=11, ranks=[1, 2],
                                                  error="Ranks [1, 2] failed to pass monitoredBarrier")),),
                    "two hung ranks named by monitored_barrier", step=12, param="rank 2"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        out = []
        for e in events(snap, "rank_lost"):
            d = e.get("detail") or {}
            ranks = d.get("ranks") or []
            out.append(self.finding(
                snap, self.message.format(ranks=", ".join(map(str, ranks)) or "unknown",
                                          iteration=d.get("iteration"), error=d.get("error", "")),
                subjects=[f"rank {r}" for r in ranks], key="lost",
                next_failure=("every other rank's next collective (DDP's all-reduce) fails: at once when the lost "
                              "rank died and its connections closed (gloo: \"Connection closed by peer\"), or "
                              "after the process group's timeout when it hangs or its node is gone unclosed"),
                ranks=ranks, seen_by=d.get("rank")))
        return out
