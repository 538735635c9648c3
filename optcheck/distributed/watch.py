"""``RankWatch``: what an ``optcheck.Monitor`` does differently on one rank of a
``torch.distributed`` job.

- its run directory is ``out/rank-K/`` (:meth:`RankWatch.locate`); at close, rank 0
  folds every rank's summary into ``out/summary.json`` (``optcheck/distributed/merge.py``,
  the run's ``RankRecorder``);
- before every ``every``-th backward pass (:meth:`before_backward`) the ranks
  exchange one fixed-size int64 row each (``optcheck/distributed/table.py``) with one
  ``all_gather`` on a process group of its own (gloo), so the exchange never
  interleaves with DDP's or FSDP's collectives on the default group. Backward
  passes, not optimizer steps, set the cadence: every rank runs the same number
  of them (DDP and FSDP need it), while a rank that skips ``optimizer.step()`` takes
  fewer steps — the exchange must not wait for a step that never comes. When the
  table shows a difference not seen before, the Monitor snapshots at once (so the
  finding is written even if the next collective then hangs); otherwise the table
  rides on the next snapshots (each carries the latest table);
- after each backward pass (:meth:`after_backward`): under DDP without
  ``find_unused_parameters``, the parameters no gradient reached (OC706).

The comparison itself is in the rules (``optcheck/rules/crossrank.py``, ``_crossrank_table.py``), on the
snapshot's ``ranks`` field; every rank runs it on the same table.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from optcheck.distributed import merge, table
from optcheck.distributed.limits import env_timeout_s
from optcheck.errors import InputError
from optcheck.pytorch.names import model_name, under_fsdp1
from optcheck.run import rundir as rd
from optcheck.rules.crossrank import disagreements


MERGE_WAIT_S = 15.0  # rank 0 waits this long at close for the other ranks' final summaries


class RankWatch:
    """One rank's side of the cross-rank check (built by :func:`optcheck.distributed.attach`).

    Args:
        wrapper: the model as the user passed it (a ``DistributedDataParallel``, an
            FSDP2 ``fully_shard``-ed module, or a plain module).
        module: the user's module (``wrapper.module`` under DDP).
        optimizer: the ``torch.optim.Optimizer``.
        every: exchange before every ``every``-th backward pass (the Monitor's
            snapshot cadence, in backward passes).
        timeout_s: how long the exchange waits for the other ranks (default: the
            default process group's timeout, ``init_process_group(timeout=...)``).
    """

    def __init__(self, wrapper: torch.nn.Module, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 every: int, timeout_s: float | None = None):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.module, self.optimizer, self.every = module, optimizer, max(1, every)
        self.ddp = wrapper if isinstance(wrapper, torch.nn.parallel.DistributedDataParallel) else None
        raw = list(module.named_parameters())
        named = [(model_name(n), p) for n, p in raw]  # the model's own names (FSDP1's levels dropped)
        # FSDP2: DTensor parameters; FSDP1: the parameters below a FullyShardedDataParallel unit
        self.sharded = [model_name(n) for n, p in raw if hasattr(p, "to_local") or under_fsdp1(n)]
        self.kind = "ddp" if self.ddp is not None else "fsdp" if self.sharded else "none"
        self.params = [n for n, _ in named]
        self.buffers = [model_name(n) for n, _ in module.named_buffers()]
        if timeout_s is None:
            timeout_s = _default_timeout_s()
        self.timeout_s = timeout_s
        # a gloo group of our own: never interleaved with DDP's/FSDP's collectives on the default group
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        self.grads: dict[str, int] = {}
        self._this_backward: set[str] = set()
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook(n)) for n, p in named if p.requires_grad]
        self._expected = {n for n, p in named if p.requires_grad}
        self.iteration = 0  # backward passes begun so far
        self.pending: dict | None = None  # the latest table exchanged
        self.seen: set[str] = set()
        self.lost: dict | None = None
        self.out: Path | None = None
        self.cost_s = 0.0  # time spent in the exchange and its comparison (benchmarks/bench_distributed.py)
        self.exchanges = 0
        self.disabled = self._check_layout()  # None, or why the ranks' tables cannot be compared
        self._sigterm = _catch_launcher_sigterm()

    def _check_layout(self) -> str | None:
        """One ``all_gather`` at attach: every rank's parameter and buffer names (a CRC-32 and
        counts). Different layouts (pipeline stages, tensor parallelism) have rows of other
        lengths, which one ``all_gather`` cannot exchange: the exchange is then off."""
        mine = torch.tensor([len(self.params), len(self.buffers), table.crc([self.params, self.buffers])],
                            dtype=torch.int64)
        rows = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(rows, mine, group=self.group)
        if all(bool((r == rows[0]).all()) for r in rows):
            return None
        return "the ranks hold different parameter or buffer names (not data parallel): no cross-rank exchange"

    def _hook(self, name: str):
        def hook(_param) -> None:
            if name not in self._this_backward:
                self._this_backward.add(name)
                self.grads[name] = self.grads.get(name, 0) + 1
        return hook

    # -- the Monitor's hook points -----------------------------------------------
    def locate(self, out: str | None, run_id: str | None) -> tuple[str | None, str | None]:
        """``out/rank-K`` and run id ``<out name>/rank-K`` for this rank's stream."""
        if out is None:
            return None, run_id or f"rank-{self.rank}"
        self.out = Path(out)
        holder = rd.held_by_other(self.out) if self.out.is_dir() else None
        if holder is not None:  # a one-process soak or Monitor writes OUT itself: never mix the two runs
            self.remove()
            raise InputError(f"out={out}: the run directory is in use by PID {holder} (another optcheck writes "
                             f"there); wait for it to finish or choose another out")
        return str(self.out / f"rank-{self.rank}"), run_id or f"{self.out.name}/rank-{self.rank}"

    def before_backward(self, step: int) -> bool:
        """Called before each backward pass with the optimizer steps taken so far;
        under DDP exchanges the table every ``every`` passes. True when the table shows
        a cross-rank difference not seen before (or the exchange failed): snapshot now."""
        self._this_backward = set()
        self.iteration += 1
        return self.kind != "fsdp" and self._due() and self._exchange_now(step)

    def _due(self) -> bool:
        return (self.iteration - 1) % self.every == 0 and self.lost is None and self.disabled is None

    def _exchange_now(self, step: int) -> bool:
        it = self.iteration  # 1-based number of the backward pass about to run (DDP) or just run (FSDP)
        t0 = time.perf_counter()
        try:
            self.pending = self.exchange(step, it)
        except RuntimeError as e:  # a rank died or hangs: the collective failed or timed out
            self.lost = {"rank": self.rank, "iteration": it, "ranks": self._missing(), "error": str(e).splitlines()[0][:300]}
            return True
        keys = disagreements(self.pending)
        new = keys - self.seen
        self.seen = keys
        self.cost_s += time.perf_counter() - t0
        self.exchanges += 1
        return bool(new)

    def after_backward(self, step: int) -> list[dict] | None:
        """Called after each backward pass (``step``: the step it belongs to). Under FSDP2
        exchanges the table here (every ``every`` passes: parameters are sharded again
        only once backward has ended). Returns None when there is nothing to record, else
        the events to snapshot at once (possibly none, for a new cross-rank
        difference): ``ddp_unused`` when DDP will not finish its reduction
        (``find_unused_parameters=False``)."""
        if self.kind == "fsdp":
            return [] if self._due() and self._exchange_now(step - 1) else None
        ddp = self.ddp
        if ddp is None or ddp.find_unused_parameters or not ddp.require_backward_grad_sync:
            return None
        missing = [n for n in self.params if n not in self._this_backward and n in self._expected]
        if not missing:
            return None
        return [{"kind": "ddp_unused", "step": step, "where": None, "count": len(missing),
                 "detail": {"rank": self.rank, "iteration": self.iteration, "params": missing}}]

    def annotate(self, snap: dict) -> None:
        """Put the latest exchanged table into ``snap`` (every snapshot carries it until
        the next exchange, so a persisting difference stays one finding), and the
        lost-rank event once."""
        if self.pending is not None:
            snap["ranks"] = self.pending
        if self.disabled and snap.get("trigger") == "start":
            snap.setdefault("notes", []).append(f"optcheck.distributed: {self.disabled}")
        if self.lost is not None and not self.lost.get("reported"):
            self.lost["reported"] = True
            detail = {k: v for k, v in self.lost.items() if k != "reported"}
            snap["events"].append({"kind": "rank_lost", "step": snap["step"], "where": None, "count": 1,
                                   "detail": detail})

    def close(self, summary: dict) -> None:
        """After this rank's ``summary.json``: rank 0 folds every ``rank-K/summary.json`` into
        ``out/summary.json`` (through the run's ``RankRecorder``) at once, and again when the others have
        finished theirs (waiting up to :data:`MERGE_WAIT_S`, not after a lost rank nor when
        the launcher stopped this rank); a
        rank that finishes after rank 0 rewrites it.
        No collective here: a rank that stops early (an exception, ``on_finding="raise"``)
        must not keep the others waiting, nor be kept."""
        self.remove()
        if self.out is None:
            return
        if self.rank == 0:
            merge.write_merged(self.out, self.world)  # at once: the launcher may stop this rank any moment now
            # stopped by the launcher's SIGTERM (recorded as an interruption by the Monitor's signal
            # handler, or as a crash where no handler ran): every rank is being stopped
            stopped = (_stopping or bool(summary.get("interrupted_by"))
                       or (summary.get("crash") or {}).get("exc_type") == LauncherStopped.__name__)
            # no wait after a lost rank, nor when the launcher stops every rank: a peer blocked in a
            # collective with this rank writes its summary only once this one has gone
            deadline = time.monotonic() + (0 if self.lost or stopped else MERGE_WAIT_S)
            while time.monotonic() < deadline:
                if merge.all_final(self.out, self.world):
                    merge.write_merged(self.out, self.world)
                    break
                time.sleep(0.1)
        elif (merge.read_rank(self.out, 0) or {}).get("status") not in (None, "running"):
            merge.write_merged(self.out, self.world)

    # -- internals ---------------------------------------------------------------
    def exchange(self, step: int, iteration: int) -> dict:
        """One ``all_gather`` of every rank's row (and, only when the param-group hashes
        differ, one ``all_gather_object`` of the groups themselves, so the finding can
        say which option differs). Returns the snapshot's ``ranks`` field."""
        mine, groups = table.row(rank=self.rank, step=step, iteration=iteration, model=self.module,
                                 optimizer=self.optimizer, params=self.params, buffers=self.buffers,
                                 grad_counts=self.grads)
        self.grads = {}
        rows = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(rows, mine, group=self.group)
        decoded = table.decode(rows, self.params, self.buffers)
        detail = None
        if any((r["groups_keys"], r["groups_options"]) != (decoded[0]["groups_keys"], decoded[0]["groups_options"])
               for r in decoded):  # every rank sees the same rows, so every rank makes this call
            detail = [None] * self.world
            dist.all_gather_object(detail, {"rank": self.rank, "groups": groups}, group=self.group)
        return {"world": self.world, "kind": self.kind, "iteration": iteration, "params": self.params,
                "sharded": self.sharded, "buffers": self.buffers, "rows": decoded, "groups": detail}

    def _missing(self) -> list[int]:
        """Ranks that do not reach a ``monitored_barrier`` within a few seconds (gloo
        names them in its error); [] when it cannot tell."""
        try:
            dist.monitored_barrier(group=self.group, timeout=datetime.timedelta(seconds=min(2, self.timeout_s)),
                                   wait_all_ranks=True)
        except RuntimeError as e:
            return merge.ranks_in(str(e), self.rank, self.world)
        return []

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._sigterm is not None and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, self._sigterm)
        self._sigterm = None


class LauncherStopped(BaseException):
    """``torch.distributed.run`` sent SIGTERM (another rank failed, or optcheck was
    stopped): raised in the main thread so the rank's loop ends and its Monitor writes
    its summary (``interrupted``). A ``BaseException``, as ``KeyboardInterrupt`` is: it
    may land in any line of the loop or of optcheck's hooks, and no ``except Exception``
    on the way may swallow it (a swallowed one left the rank training into a collective
    its peer had left, killed 30 s later with its summary ``running``)."""


_stopping = False  # a LauncherStopped was raised: later SIGTERMs must not break the Monitor's closing writes


def _on_sigterm(signum, frame) -> None:
    global _stopping
    if _stopping:  # the launcher, or optcheck soak --nproc, repeating itself: the summary is being written
        return
    _stopping = True
    raise LauncherStopped("SIGTERM from the launcher (torch.distributed.run stops every rank when one fails)")


def _catch_launcher_sigterm():
    """Under ``torch.distributed.run`` (``TORCHELASTIC_RUN_ID`` set), with SIGTERM at its
    default and in the main thread: turn SIGTERM into :class:`LauncherStopped`. Returns
    the previous handler to restore, or None when nothing was installed."""
    import threading

    if ("TORCHELASTIC_RUN_ID" not in os.environ or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        return None
    global _stopping
    _stopping = False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return signal.SIG_DFL


def _default_timeout_s() -> float:
    """``OPTCHECK_DIST_TIMEOUT`` when set, else the default process group's timeout in seconds
    (``init_process_group(timeout=...)``); gloo's default is 30 minutes (``torch/distributed/constants.py``)."""
    env = env_timeout_s()  # InputError (one line) for a value that is not a positive number of seconds
    if env is not None:
        return env
    try:
        opts = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options
        return opts._timeout.total_seconds()
    except Exception:
        return 1800.0
