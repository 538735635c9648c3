"""optcheck under ``torch.distributed``: ``optcheck.Monitor`` on every rank of a
``torchrun`` job, and the cross-rank check.

In a script started with ``torchrun --nproc-per-node N train.py``, after
``torch.distributed.init_process_group(...)``::

    model = DistributedDataParallel(net)            # or fully_shard(net) (FSDP2)
    mon = optcheck.Monitor(model, optimizer, out="runs/ddp")

gives each rank its stream in ``runs/ddp/rank-K/`` and, at close, rank 0 the
merged ``runs/ddp/summary.json`` (``optcheck/distributed/merge.py``). The Monitor
asks :func:`attach` for a :class:`~optcheck.distributed.watch.RankWatch`; outside
an initialised process group of more than one rank it gets a :class:`NoRankWatch`,
whose every hook does nothing. What is compared across ranks, and what is not under FSDP:
``docs/distributed.md``; the rules: ``optcheck/rules/crossrank.py`` (OC701–OC705) and
``crossrank_events.py`` (OC706, OC707).
"""

from __future__ import annotations


class NoRankWatch:
    """The rank watch of a one-process run: the interface of
    :class:`~optcheck.distributed.watch.RankWatch`, every hook a no-op (the run
    directory is ``out`` itself, no exchange, no merged summary)."""

    def locate(self, out: str | None, run_id: str | None) -> tuple[str | None, str | None]:
        return out, run_id

    def before_backward(self, step: int) -> bool:
        return False

    def after_backward(self, step: int) -> list[dict] | None:
        return None

    def annotate(self, snap: dict) -> None:
        pass

    def close(self, summary: dict) -> None:
        pass

    def remove(self) -> None:
        pass


def attach(model, optimizer, every: int):
    """A :class:`~optcheck.distributed.watch.RankWatch` for this rank, or a
    :class:`NoRankWatch` when ``torch.distributed`` is not initialised or the job has one rank.

    Collective: every rank must call it (the Monitor does, in its constructor) —
    it creates the exchange's own gloo process group (``dist.new_group``) and
    compares the ranks' parameter names once. A job that watches some ranks only
    sets ``OPTCHECK_DISTRIBUTED=0`` (then each Monitor is a one-process one: give
    each rank its own ``out``)."""
    import os

    import torch.distributed as dist

    if os.environ.get("OPTCHECK_DISTRIBUTED", "1") == "0":
        return NoRankWatch()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return NoRankWatch()
    from optcheck.distributed.watch import RankWatch
    from optcheck.pytorch.unwrap import unwrap_model, unwrap_optimizer

    return RankWatch(model, unwrap_model(model), unwrap_optimizer(optimizer), every)


__all__ = ["attach", "NoRankWatch"]
