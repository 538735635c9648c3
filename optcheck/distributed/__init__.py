"""optcheck under ``torch.distributed``: ``optcheck.Monitor`` on every rank of a
``torchrun`` job, and the cross-rank check.

In a script started with ``torchrun --nproc-per-node N train.py``, after
``torch.distributed.init_process_group(...)``::

    model = DistributedDataParallel(net)            # or fully_shard(net) (FSDP2)
    mon = optcheck.Monitor(model, optimizer, out="runs/ddp")

gives each rank its stream in ``runs/ddp/rank-K/`` and, at close, rank 0 the
merged ``runs/ddp/summary.json`` (``optcheck/distributed/merge.py``). The Monitor
asks :func:`attach` for a :class:`~optcheck.distributed.watch.RankWatch`; outside
an initialised process group of more than one rank it gets None and nothing
changes. What is compared across ranks, and what is not under FSDP:
``docs/distributed.md``; the rules: ``optcheck/rules/crossrank.py`` (OC701–OC705) and
``crossrank_events.py`` (OC706, OC707).
"""

from __future__ import annotations


def attach(model, optimizer, every: int):
    """A :class:`~optcheck.distributed.watch.RankWatch` for this rank, or None when
    ``torch.distributed`` is not initialised or the job has one rank.

    Collective: every rank must call it (the Monitor does, in its constructor) —
    it creates the exchange's own gloo process group (``dist.new_group``) and
    compares the ranks' parameter names once. A job that watches some ranks only
    sets ``OPTCHECK_DISTRIBUTED=0`` (then each Monitor is a one-process one: give
    each rank its own ``out``)."""
    import os

    import torch.distributed as dist

    if os.environ.get("OPTCHECK_DISTRIBUTED", "1") == "0":
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    from optcheck.distributed.watch import RankWatch
    from optcheck.pytorch.unwrap import unwrap_model, unwrap_optimizer

    return RankWatch(model, unwrap_model(model), unwrap_optimizer(optimizer), every)


__all__ = ["attach"]
