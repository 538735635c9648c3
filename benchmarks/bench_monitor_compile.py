"""Cost of ``optcheck.Monitor`` (hazard probes on) on a ``torch.compile``d model and on
non-reentrant activation checkpointing, as ratios against the same loop without it.

Model: the default soak GPT (2 layers, 64 wide, context 64, batch 16, 1 thread), AdamW.
Variants, each with and without a Monitor (``every=100``, nothing written):
``eager``; ``compiled`` (``torch.compile(model, backend=...)``, default ``aot_eager``:
inductor needs a C++ build per graph); ``ckpt`` (every block under
``torch.utils.checkpoint(use_reentrant=False)``). Warm-up steps (compilation) are not
timed; time is CPU time (``time.process_time``), median of interleaved rounds. Also
prints the cost of one re-scan of the model's modules (run only after a sub-module
assignment) and the Dynamo graph-break and graph counters with the Monitor on.
Usage: ``python benchmarks/bench_monitor_compile.py [--steps 40] [--rounds 3] [--backend aot_eager]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.utils.checkpoint

import optcheck
from optcheck.pytorch.gpt import GPT, GPTConfig


def make(variant: str, backend: str):
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    opt = model.configure_optimizers(1e-3, 0.1, (0.9, 0.95))
    if variant == "ckpt":
        for block in model.h:
            inner = block.forward
            block.forward = lambda x, inner=inner: torch.utils.checkpoint.checkpoint(inner, x, use_reentrant=False)
    run_model = torch.compile(model, backend=backend) if variant == "compiled" else model
    x = torch.randint(0, 256, (16, 64))
    y = torch.randint(0, 256, (16, 64))
    return model, run_model, opt, x, y


def run(variant: str, monitored: bool, steps: int, backend: str, warmup: int = 3) -> float:
    """CPU seconds per step after ``warmup`` steps."""
    model, run_model, opt, x, y = make(variant, backend)
    mon = optcheck.Monitor(run_model, opt, every=100, on_finding="ignore") if monitored else None
    t0 = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.process_time()
        _, loss = run_model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dt = (time.process_time() - t0) / steps
    if mon is not None:
        mon.close()
        assert mon.findings == [], [f.message for f in mon.findings]
    return dt


def rescan_cost(repeat: int = 200) -> float:
    """Seconds for one re-scan (``named_modules`` walk, names, hooks kept) of the GPT."""
    from optcheck.pytorch.hazards import HazardProbes

    model = GPT(GPTConfig())
    probes = HazardProbes(model, torch.optim.SGD(model.parameters(), lr=0.1))
    t0 = time.perf_counter()
    for _ in range(repeat):
        probes._scan()
    dt = (time.perf_counter() - t0) / repeat
    probes.remove()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="aot_eager")
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from torch._dynamo.utils import counters

    variants = ("eager", "compiled", "ckpt")
    times: dict[tuple[str, bool], list[float]] = {(v, m): [] for v in variants for m in (False, True)}
    breaks, graphs, frames, recompiles = {}, [], {False: [], True: []}, {False: [], True: []}
    from torch._dynamo.utils import guard_failures
    for _ in range(a.rounds):
        for v in variants:
            for m in (False, True):
                counters.clear()
                guard_failures.clear()
                torch._dynamo.reset()  # each run compiles afresh: frames and recompiles per run, with and without
                times[(v, m)].append(run(v, m, a.steps, a.backend))
                if v == "compiled":
                    frames[m].append(counters["frames"]["total"])
                    recompiles[m].append(sum(len(r) for r in guard_failures.values()))
                if v == "compiled" and m:
                    breaks.update(counters["graph_break"])
                    graphs.append(counters["stats"]["unique_graphs"])
    print(f"GPT 2x64, batch 16x64, 1 thread, {a.steps} steps x {a.rounds} rounds, compile backend {a.backend}")
    for v in variants:
        plain, mon = statistics.median(times[(v, False)]), statistics.median(times[(v, True)])
        print(f"  {v:9s} plain {plain * 1e3:7.2f} ms/step   Monitor {mon * 1e3:7.2f} ms/step   {mon / plain:.2f}x")
    print(f"  compiled with Monitor: graph breaks {breaks or 0}; unique graphs per round {graphs}")
    print(f"  frames Dynamo compiled per round: plain {frames[False]}, Monitor {frames[True]}; "
          f"recompilations: plain {recompiles[False]}, Monitor {recompiles[True]}")
    print(f"  one re-scan of the modules: {rescan_cost() * 1e6:.0f} us")


if __name__ == "__main__":
    main()
