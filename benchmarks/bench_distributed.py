"""Cost of optcheck's cross-rank check on a 2-rank DDP soak of the built-in GPT.

    python3 benchmarks/bench_distributed.py [--steps 600] [--every 100] [--nproc 2]

Starts itself under ``python -m torch.distributed.run`` (gloo, CPU, 1 thread per
rank) and trains the default soak GPT (2 layers, 64 wide, batch 16 x 64) under
``DistributedDataParallel`` with an ``optcheck.Monitor`` (``every`` as given). It
times the cross-rank check directly, because end-to-end noise on a shared 2-core
machine is larger than the 2 % goal:

- the exchange: building this rank's row (a checksum per parameter and buffer,
  the param groups' hashes), the ``all_gather``, decoding and the comparison
  (``RankWatch.cost_s``, per exchange), against the training time of the
  ``every`` steps it covers;
- the per-step part: one post-accumulate-grad hook call per parameter per
  backward (timed by calling the hook itself 100,000 times) and the DDP
  unused-parameter check after each backward.

Prints both as a share of training time (rank 0's view; ranks are in lockstep).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch(argv: list[str], nproc: int) -> int:
    sys.path.insert(0, str(ROOT))
    from optcheck.distributed.soak import free_port

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), __file__, *argv]
    return subprocess.call(cmd, env=env)


def rank_main(a) -> int:
    import tempfile

    import torch
    import torch.distributed as dist

    import optcheck
    from optcheck.config import RunConfig, SoakConfig
    from optcheck.data import BatchSchedule, load_corpus
    from optcheck.pytorch.gpt import GPT, GPTConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = SoakConfig(run=RunConfig(steps=a.steps, every=a.every))
    corpus = load_corpus(None)
    torch.manual_seed(cfg.run.seed)
    gpt = GPT(GPTConfig(block_size=cfg.model.block_size, vocab_size=corpus.vocab_size, n_layer=cfg.model.n_layer,
                        n_head=cfg.model.n_head, n_embd=cfg.model.n_embd))
    model = torch.nn.parallel.DistributedDataParallel(gpt)
    opt = gpt.configure_optimizers(cfg.optimizer.lr, cfg.optimizer.weight_decay,
                                   (cfg.optimizer.beta1, cfg.optimizer.beta2), cfg.optimizer.eps)
    batches = BatchSchedule(len(corpus.train), cfg.model.block_size, cfg.data.batch_size, cfg.run.seed + 7919 * rank)
    with tempfile.TemporaryDirectory() as tmp:
        mon = optcheck.Monitor(model, opt, every=a.every, out=tmp, on_finding="log")
        watch = mon.rank_watch
        t0 = time.perf_counter()
        for step in range(1, a.steps + 1):
            x, y = (torch.from_numpy(v) for v in batches.batch(corpus.train, step))
            opt.zero_grad(set_to_none=True)
            _, loss = model(x, y)
            loss.backward()
            opt.step()
        train_s = time.perf_counter() - t0
        # the per-step part, timed on its own: the gradient hook (per parameter per backward) and the
        # unused-parameter check after each backward
        hook = watch._hook("bench.param")
        n = 100_000
        t = time.perf_counter()
        for _ in range(n):
            watch._this_backward = set()
            hook(None)
        hook_s = (time.perf_counter() - t) / n
        t = time.perf_counter()
        for _ in range(n // 10):
            watch._this_backward = set(watch.params)
            watch.after_backward(step)
        after_s = (time.perf_counter() - t) / (n // 10)
        exchanges, cost_s = watch.exchanges, watch.cost_s
        mon.close()
    if rank == 0:
        step_s = train_s / a.steps
        per_step = hook_s * len(watch.params) + after_s
        print(f"bench_distributed: {dist.get_world_size()} ranks, DDP, default GPT ({len(watch.params)} parameters), "
              f"{a.steps} steps, every {a.every}; torch {torch.__version__}, 1 thread per rank")
        print(f"  training          {train_s:.2f} s   ({step_s * 1e3:.2f} ms/step, Monitor included)")
        print(f"  exchange          {exchanges} x {cost_s / max(1, exchanges) * 1e3:.2f} ms "
              f"(row + all_gather + compare) = {cost_s / train_s * 100:.2f} % of training time; "
              f"per snapshot {cost_s / max(1, exchanges) / (step_s * a.every) * 100:.2f} % of the {a.every} steps it covers")
        print(f"  per-step hooks    {per_step * 1e6:.1f} us/step ({hook_s * 1e6:.2f} us x {len(watch.params)} params + "
              f"{after_s * 1e6:.1f} us check) = {per_step / step_s * 100:.2f} % of a step")
        print(f"  cross-rank total  {(cost_s + per_step * a.steps) / train_s * 100:.2f} % of training time (goal <= 2 %)")
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--nproc", type=int, default=2)
    a = ap.parse_args()
    if "RANK" not in os.environ:
        return launch(sys.argv[1:], a.nproc)
    return rank_main(a)


if __name__ == "__main__":
    sys.exit(main())
