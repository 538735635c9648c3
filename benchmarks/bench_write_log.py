"""Cost of what issue 33 added to the hazard probes, measured apart, in one process, CPU time,
1 thread, interleaved rounds (docs/hazards.md, "How the writer is found"):

- an armed step of the default soak GPT (2 layers, 64 wide, context 64, batch 16, AdamW) with
  every probe (``HazardProbes(mode="always")``), with the write log's ``__torch_function__``
  mode on, against the same armed step with the mode's push made a no-op (everything else as
  is), and against the plain loop;
- an unarmed step's only addition, the pass log (one forward pre-hook with kwargs on the
  watched model, ``optcheck/pytorch/hazards/replay.py``): microseconds per call of a one-layer
  model with and without it.

Usage: ``python benchmarks/bench_write_log.py [--rounds 12] [--steps 10]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

from optcheck.pytorch.gpt import GPT, GPTConfig
from optcheck.pytorch.hazards import HazardProbes, writes


def armed_step(rounds: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    opt = model.configure_optimizers(1e-3, 0.1, (0.9, 0.95))
    x, y = torch.randint(0, 256, (16, 64)), torch.randint(0, 256, (16, 64))
    probes = HazardProbes(model, opt, mode="always")
    push = writes.ModeSlot.push

    def step(s, watched):
        opt.zero_grad(set_to_none=True)
        if watched:
            with probes.step_context(s):
                _, loss = model(x, y)
                probes.check_loss(loss, s)
                loss.backward()
            probes.after_backward(s)
        else:
            _, loss = model(x, y)
            loss.backward()
        opt.step()

    for s in range(1, 6):
        step(s, True)
    times: dict[str, list] = {"plain": [], "armed, no mode": [], "armed": []}
    try:
        for _ in range(rounds):
            for kind in times:
                writes.ModeSlot.push = push if kind == "armed" else (lambda self: None)
                t = time.process_time()
                for s in range(steps):
                    step(100 + s, kind != "plain")
                times[kind].append((time.process_time() - t) / steps * 1e3)
    finally:
        writes.ModeSlot.push = push
        probes.remove()
    return {k: statistics.median(v) for k, v in times.items()}


def pass_log(rounds: int, calls: int = 20000) -> dict:
    model, x = nn.Sequential(nn.Linear(8, 8)), torch.randn(2, 8)
    log: list = []

    def hook(module, args, kwargs):  # what replay.py's _log_pass does
        if torch.compiler.is_compiling():
            return None
        if len(log) >= 4:
            del log[0]
        log.append((args, kwargs, torch.is_grad_enabled()))
        return None

    def per_call():
        t = time.process_time()
        for _ in range(calls):
            model(x)
        return (time.process_time() - t) / calls * 1e6

    times: dict[str, list] = {"no hook": [], "pass log": []}
    for _ in range(rounds):
        times["no hook"].append(per_call())
        handle = model.register_forward_pre_hook(hook, with_kwargs=True)
        times["pass log"].append(per_call())
        handle.remove()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(1)
    load = open("/proc/loadavg").read().split()[:3]
    med = armed_step(a.rounds, a.steps)
    print(f"torch {torch.__version__}, 1 thread, {a.rounds} interleaved rounds x {a.steps} steps (median CPU ms/step)")
    for k, v in med.items():
        print(f"  {k:<16} {v:8.3f} ms/step   {v / med['plain']:.3f}x plain")
    print(f"the write log's mode on an armed step: {med['armed'] / med['armed, no mode']:.3f}x the armed step without it")
    pl = pass_log(a.rounds // 2 or 1)
    print(f"pass log on an unarmed step: {pl['pass log'] - pl['no hook']:.2f} us per call of the watched model "
          f"({pl['no hook']:.2f} -> {pl['pass log']:.2f} us, a one-layer model)")
    print(f"load average before {load}, after {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
