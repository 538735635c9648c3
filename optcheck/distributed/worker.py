"""One rank of ``optcheck soak --nproc N``: the built-in GPT under
``DistributedDataParallel`` (gloo, CPU) with an ``optcheck.Monitor``.

Started by ``torch.distributed.run`` (``optcheck/distributed/soak.py``)::

    python -m torch.distributed.run --nproc-per-node N -m optcheck.distributed.worker --config F --out DIR

Every rank builds the same GPT from the same seed (DDP broadcasts rank 0's
parameters anyway), draws its own batches (seed + rank, as a ``DistributedSampler``
would split the data), and writes ``DIR/rank-K/`` through its Monitor. After each
step it writes ``DIR/rank-K/heartbeat`` (``step stage pid``: stage 2 while it
starts (imports, the Monitor), 1 while in forward/backward, 0 once the step is done) so the supervisor can tell a hung
rank (stage 0, behind) from the ranks blocked waiting for it (stage 1), and find
the rank's process (to stop it, or see it stopped). A rank dies with its launcher
(``optcheck/distributed/lifetime.py``).
The distributed ``--inject`` scenarios are in :data:`SCENARIOS`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from optcheck.config import SoakConfig
from optcheck.distributed.cli import DIST_SCENARIOS as SCENARIOS
from optcheck.distributed.lifetime import die_with_parent


STARTING = 2  # heartbeat stage before the first step (the supervisor's --step-timeout clock has not started)


class _Heartbeat:
    """``DIR/rank-K/heartbeat``: "STEP STAGE PID", rewritten in place (one fixed-width
    pwrite, no fsync)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.pid = os.getpid()

    def beat(self, step: int, stage: int) -> None:
        os.pwrite(self.fd, f"{step:>12} {stage} {self.pid:>10}\n".encode(), 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m optcheck.distributed.worker")
    ap.add_argument("--config", required=True, help="SoakConfig as a JSON file")
    ap.add_argument("--out", required=True, help="run directory (each rank writes OUT/rank-K)")
    ap.add_argument("--fail-on", default="warning")
    ap.add_argument("--timeout", type=float, default=60.0, help="collective timeout, seconds")
    ap.add_argument("--no-monitor", action="store_true",
                    help="train without optcheck (to measure what a scenario does without it): each rank writes "
                         "OUT/rank-K/outcome.json (steps done, last loss, whether the replicas are still equal)")
    a = ap.parse_args(argv)
    die_with_parent()  # torch.distributed.run starts ranks in sessions of their own: nothing else reaches them
    cfg = SoakConfig.from_json(Path(a.config).read_text())
    import torch
    import torch.distributed as dist

    torch.set_num_threads(cfg.run.threads)
    try:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
        code = _train(cfg, Path(a.out), a.fail_on, torch, dist, monitor=not a.no_monitor)
        # every rank done (and every file written) before any leaves: a rank that tears the gloo
        # group down while another is still in its last collective makes that one abort
        dist.barrier()
    except BaseException as e:  # the Monitor has written this rank's crash; tearing the group down with a
        traceback.print_exc()  # peer gone or stuck in a collective can block: leave as a finished rank does
        _record_for_the_launcher(e)
        _leave(1)
    _leave(code)


def _record_for_the_launcher(e: BaseException) -> None:
    """Write this rank's exception to ``torch.distributed.run``'s error file (``TORCHELASTIC_ERROR_FILE``,
    through torch's public ``ErrorHandler``, as its ``@record`` does): the launcher's report then
    gives the rank's error ("RuntimeError: ... Connection reset by peer") instead of "To enable
    traceback see ...". A rank that fails before its Monitor writes anything (a peer killed at
    start-up, the Monitor's first collective broken) is judged by that text alone: a knock-on or
    its own fault (``optcheck.distributed.launcher_report.knocked_on_judge``). Never raises."""
    try:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(e)
    except Exception:  # noqa: BLE001 - the report is a courtesy; the rank's exit code says it failed
        pass


def _leave(code: int) -> None:
    """End a rank whose work is done and written, without tearing the gloo group down:
    flush Python's streams and logging, then ``os._exit``. The teardown (``destroy_process_group``,
    then the interpreter's finalisation of the process group, DDP's reducer and gloo's pairs)
    aborted a finished rank with SIGABRT in about one test run in three under load (2 ranks, gloo,
    torch 2.13, CPU), which made ``torch.distributed.run`` report the whole job failed; gloo's
    transport throws from its own threads when a peer goes away mid-operation (pytorch/gloo
    issue 514, pytorch/pytorch issue 50701). A peer that simply exits while the group is idle is
    harmless (checked: the other rank carries on and exits 0)."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _train(cfg: SoakConfig, out: Path, fail_on: str, torch, dist, monitor: bool = True) -> int:
    from optcheck.data import BatchSchedule, load_corpus
    from optcheck.drivers.monitor import Monitor
    from optcheck.pytorch.gpt import GPT, GPTConfig
    from optcheck.pytorch.train import lr_at

    rank = dist.get_rank()
    corpus = load_corpus(cfg.data.path, cfg.model.vocab_size)
    torch.manual_seed(cfg.run.seed)
    gpt = GPT(GPTConfig(block_size=cfg.model.block_size, vocab_size=corpus.vocab_size, n_layer=cfg.model.n_layer,
                        n_head=cfg.model.n_head, n_embd=cfg.model.n_embd, dropout=cfg.model.dropout))
    model = torch.nn.parallel.DistributedDataParallel(gpt)
    o = cfg.optimizer
    opt = gpt.configure_optimizers(o.lr, o.weight_decay, (o.beta1, o.beta2), o.eps)
    batches = BatchSchedule(len(corpus.train), cfg.model.block_size, cfg.data.batch_size, cfg.run.seed + 7919 * rank)
    inject = {i.name: i.step for i in cfg.checks.inject}
    beat = _Heartbeat(out / f"rank-{rank}" / "heartbeat")
    beat.beat(0, STARTING)  # this rank's PID for the supervisor, before the Monitor (collective) is built
    lr_factor = 1.0
    with (Monitor(model, opt, every=cfg.run.every, out=str(out), on_finding="log", fail_on=fail_on,
                           hazards=False if cfg.checks.hazards == "off" else cfg.checks.hazards,
                           allow_inplace=cfg.checks.allow_inplace) if monitor else contextlib.nullcontext()):
        for step in range(1, cfg.run.steps + 1):
            beat.beat(step - 1, 1)
            at = {name for name, s in inject.items() if s == step}
            if rank == 1 and "rank1-kill" in at:
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == 1 and "rank1-hang" in at:
                beat.beat(step - 1, 0)
                time.sleep(10**6)
            if rank == 1 and "rank1-lr" in at:
                lr_factor = 10.0
            if "ddp-unused-param" in at:  # block 0's MLP switched off on every rank: its parameters get no gradient
                gpt.h[0].mlp.register_forward_hook(lambda m, i, o: torch.zeros_like(o).detach())
            for g in opt.param_groups:
                g["lr"] = lr_at(cfg, step) * lr_factor
            x, y = (torch.from_numpy(v) for v in batches.batch(corpus.train, step))
            opt.zero_grad(set_to_none=True)
            no_sync = "no-sync-forever" in inject and step >= inject["no-sync-forever"]
            with model.no_sync() if no_sync else contextlib.nullcontext():
                _, loss = model(x, y)
                loss.backward()
            if rank == 1 and "rank1-param-replaced" in at:
                w = gpt.h[0].mlp.c_fc.weight
                gpt.h[0].mlp.c_fc.weight = torch.nn.Parameter(w.detach().clone())
            if cfg.optimizer.grad_clip:
                torch.nn.utils.clip_grad_norm_(gpt.parameters(), cfg.optimizer.grad_clip)
            if not (rank == 1 and "rank1-skip-step" in at):
                opt.step()
            beat.beat(step, 0)
    if not monitor:
        _outcome(out / f"rank-{rank}" / "outcome.json", gpt, step, float(loss), torch, dist)
    return 0  # findings are in rank-K/summary.json; a non-zero exit would make torch.distributed.run stop the job


def _outcome(path: Path, gpt, step: int, loss: float, torch, dist) -> None:
    """What the run did without optcheck: steps done, last loss, and whether every rank
    still holds rank 0's parameters (one all_gather of a checksum per parameter)."""
    import json

    from optcheck.pytorch.probe import checksum

    mine = torch.stack([checksum(p).long() for p in gpt.parameters()])
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    path.write_text(json.dumps({"steps": step, "loss_last": loss,
                                "replicas_equal": all(bool((r == rows[0]).all()) for r in rows)}))


if __name__ == "__main__":
    sys.exit(main())
