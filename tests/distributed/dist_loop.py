"""A tiny DDP or FSDP2 training loop under ``optcheck.Monitor``, started by the tests
with ``python -m torch.distributed.run --nproc-per-node 2`` (gloo, CPU, 1 thread).

    dist_loop.py OUT --kind ddp|fsdp|fsdp1-orig|fsdp1-flat[-grad-op]|zero1|zero2|zero3|accel-zero2 [--scenario NAME --at STEP] [--steps N] [--every N]

Scenarios (rank 1 is the odd one out; each happens in iteration ``--at``):
replace (rank 1 replaces fc2.weight after backward, before the step), lr (rank 1's
learning rate x10), nosync (every iteration under ``no_sync()`` from then on),
skipstep (rank 1 skips ``optimizer.step()``), unused (a layer no forward uses,
DDP without ``find_unused_parameters``), unused-rank1 (rank 1 stops using a layer;
``find_unused_parameters=True``), buffers (BatchNorm, ``broadcast_buffers=False``),
replace-layer (every rank assigns a new fc2 before the forward), dtype (every rank casts fc2 to
float64 before the forward), unfreeze (extra frozen when the optimizer is built over the trainable
parameters; every rank unfreezes it before the forward), kill (rank 1 SIGKILLs itself), hang (rank 1 sleeps for good), plain-mismatch (no
DDP/FSDP and rank 1's model has a layer more: the exchange must switch itself off).
Each rank exits with its Monitor's exit code. ``--plain``: the same loops without optcheck, let
run on; each rank writes what happened to ``OUT/plain-rank-K.json`` (the exception and when,
each parameter's and buffer's values, the optimizer's step counts) and exits 1 on an exception.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import optcheck


ACCELERATOR: list = []  # accelerate's Accelerator of --kind accel-zero2, made once


class Net(nn.Module):
    def __init__(self, bn: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16) if bn else nn.Identity()
        self.fc2 = nn.Linear(16, 4)
        self.extra = nn.Linear(4, 4)
        self.use_extra = True

    def forward(self, x):
        y = self.fc2(torch.relu(self.bn(self.fc1(x))).to(self.fc2.weight.dtype))  # (a no-op unless "dtype")
        return self.extra(y.to(self.extra.weight.dtype)) if self.use_extra else y


def trainable(m: nn.Module) -> list:
    return [p for p in m.parameters() if p.requires_grad]


def run(scenario: str, kind: str, at: int, steps: int, every: int, out: str, plain: bool = False) -> int:
    """One training loop of ``scenario`` under a Monitor writing to ``out`` (``plain``: without
    optcheck, what happened written to ``out/plain-rank-K.json``); its exit code."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = Net(bn=scenario == "buffers")
    if scenario == "unused":
        net.use_extra = False
    if scenario == "unfreeze":  # a layer frozen when the optimizer is built (over the trainable parameters)
        net.extra.requires_grad_(False)
    if scenario == "plain-mismatch":  # not data parallel: rank 1's model has one layer more, no wrapper
        if rank == 1:
            net.fc3 = nn.Linear(4, 4)
        model = net
    elif kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        model = fully_shard(net)
    elif kind.startswith("fsdp1"):  # fsdp1-orig|flat[-grad-op]: FSDP1, use_orig_params True|False, FULL_SHARD|SHARD_GRAD_OP
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

        nested = {}
        if kind.endswith("-nested"):  # the LLM fine-tune way: a unit per layer, each layer under activation
            # checkpointing (torch's checkpoint_wrapper, non-reentrant), FSDP1 around it
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl,
                                                                                     apply_activation_checkpointing,
                                                                                     checkpoint_wrapper)
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            apply_activation_checkpointing(
                net, checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
                check_fn=lambda m: isinstance(m, nn.Linear))
            nested = {"auto_wrap_policy": ModuleWrapPolicy({nn.Linear})}
        model = FullyShardedDataParallel(
            net, use_orig_params="-orig" in kind, device_id=torch.device("cpu"), **nested,
            sharding_strategy=ShardingStrategy.SHARD_GRAD_OP if kind.endswith("-grad-op") else ShardingStrategy.FULL_SHARD)
    elif kind.startswith("zero"):  # DeepSpeed ZeRO stage 1 or 2 on the CPU (the process group is torchrun's)
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        cfg = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": int(kind[4:])},
               "zero_allow_untested_optimizer": True}
        model, opt, _, _ = deepspeed.initialize(model=net, optimizer=torch.optim.AdamW(trainable(net), lr=1e-2),
                                                config=cfg, dist_init_required=False)
    elif kind == "accel-zero2":  # the same through accelerate's DeepSpeed plugin (prepare, accelerator.backward)
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from accelerate import Accelerator, DeepSpeedPlugin

        if not ACCELERATOR:  # one Accelerator per process (a second one may not take a plugin)
            ACCELERATOR.append(Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={
                "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
                "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True})))
        acc = ACCELERATOR[0]
        model, opt = acc.prepare(net, torch.optim.AdamW(trainable(net), lr=1e-2))
    else:
        model = nn.parallel.DistributedDataParallel(
            net, find_unused_parameters=scenario == "unused-rank1",
            **({"broadcast_buffers": False} if scenario == "buffers" else {}))
    if not kind.startswith(("zero", "accel")):
        opt = torch.optim.AdamW(trainable(model), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batches, as a DistributedSampler
    if plain:
        return run_plain(scenario, model, net, opt, gen, at, steps, out)
    mon = optcheck.Monitor(model, opt, every=every, out=out, on_finding="log")
    for it in range(1, steps + 1):
        odd = rank == 1 and it == at
        if odd and scenario == "lr":
            opt.param_groups[0]["lr"] *= 10
        if odd and scenario == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if odd and scenario == "hang":
            time.sleep(3600)
        if rank == 1 and it >= at and scenario == "unused-rank1":
            net.use_extra = False
        x = torch.randn(8, 8, generator=gen)
        if it == at and scenario == "replace-layer":  # every rank, inside the step: a new head, the optimizer
            net.fc2 = nn.Linear(16, 4)                  # still holds the old one
        if it == at and scenario == "unfreeze":  # every rank: the frozen layer unfrozen, the optimizer not told
            net.extra.requires_grad_(True)
        if it == at and scenario == "dtype":  # every rank: the head cast after the optimizer exists
            net.fc2.to(torch.float64)
        sync = scenario == "nosync" and it >= at
        if kind.startswith("zero"):  # DeepSpeed's own step: engine.backward, engine.step (which zeroes the grads)
            model.backward(model(x).pow(2).mean())
            model.step()
            continue
        with model.no_sync() if sync and hasattr(model, "no_sync") else contextlib.nullcontext():
            loss = model(x).pow(2).mean()
            acc.backward(loss) if kind.startswith("accel") else loss.backward()
        if odd and scenario == "replace":
            net.fc2.weight = nn.Parameter(net.fc2.weight.detach().clone())
        if not (odd and scenario == "skipstep"):
            opt.step()
        opt.zero_grad()
    return mon.close()["exit_code"]


def run_plain(scenario, model, net, opt, gen, at, steps, out) -> int:
    rank, seen = dist.get_rank(), {"exc": None}
    t0 = time.monotonic()
    try:
        for it in range(1, steps + 1):
            seen["iteration"] = it
            odd = rank == 1 and it == at
            if odd and scenario == "lr":
                opt.param_groups[0]["lr"] *= 10
            if odd and scenario == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == 1 and it >= at and scenario == "unused-rank1":
                net.use_extra = False
            if it == at:
                t0 = time.monotonic()
            x = torch.randn(8, 8, generator=gen)
            sync = scenario == "nosync" and it >= at
            with model.no_sync() if sync and hasattr(model, "no_sync") else contextlib.nullcontext():
                model(x).pow(2).mean().backward()
            if not (odd and scenario == "skipstep"):
                opt.step()
            opt.zero_grad()
    except Exception as e:  # noqa: BLE001 - what the loop died of is the observation
        seen["exc"] = {"type": type(e).__name__, "message": str(e)[:500], "after_s": time.monotonic() - t0}
    seen["params"] = {n: p.detach().flatten().tolist() for n, p in net.named_parameters()}
    seen["buffers"] = {n: b.detach().flatten().tolist() for n, b in net.named_buffers() if b.is_floating_point()}
    seen["steps"] = sorted({float(s["step"]) for s in opt.state.values() if "step" in s})
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"plain-rank-{rank}.json"), "w") as fh:
        json.dump(seen, fh)
    return 1 if seen["exc"] else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--kind", default="ddp", choices=["ddp", "fsdp", "fsdp1-orig", "fsdp1-flat", "fsdp1-orig-grad-op", "fsdp1-flat-grad-op",
                                                      "zero1", "zero2", "zero3", "accel-zero2",
                                                      "fsdp1-orig-nested"])
    ap.add_argument("--scenario", default="clean", help="one, or several comma-separated: each into OUT/<name>")
    ap.add_argument("--at", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--every", type=int, default=1)
    # the process group's timeout: how long a live rank waits for a slow peer (imports and the Monitor take
    # seconds a rank on a loaded machine); a dead peer is seen at once (its sockets close), not after this
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--plain", action="store_true", help="without optcheck (see the module docstring)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    names = a.scenario.split(",")
    codes = [run(n, a.kind, a.at, a.steps, a.every, os.path.join(a.out, n) if len(names) > 1 else a.out, a.plain)
             for n in names]
    dist.destroy_process_group()
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
