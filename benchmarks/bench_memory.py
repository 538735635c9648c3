"""Memory probes' cost as ratios against a training step, and the memory rules' false
alarms on synthetic clean noise.

1. Cost: the default soak GPT (2 layers, 64 wide, context 64, batch 16, 1 thread), AdamW;
   the median step, the tensor census (``optcheck.pytorch.probe.tensor_census``: a
   ``gc.collect()`` and a walk of the objects made since its first run) and one ``optcheck.heap.in_use_bytes()``
   read, in process CPU time; printed as ms and as the share of training time a census at
   every snapshot would take at ``every`` = 10, 50, 100.
2. False alarms: ``--streams`` synthetic clean streams per kind, run through OC401 and
   OC402 (the memory family): RSS with Gaussian and AR(1) wander, a live-tensor count
   with GC debt (0..k extra tensors at random), a heap-in-use reading with a few KiB of
   jitter, TorchSharp peak/live/scope counts of a scoped step. Prints findings per
   stream kind (every one is a false alarm).

Usage: ``python benchmarks/bench_memory.py [--steps 100] [--streams 200]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from optcheck import heap
from optcheck.engine import RuleEngine
from optcheck.rules import RuleConfig, catalogue
from optcheck.record.snapshot import SCHEMA

MiB = 2**20


def cost(steps: int) -> None:
    import torch

    from optcheck.pytorch import probe
    from optcheck.pytorch.gpt import GPT, GPTConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    opt = model.configure_optimizers(1e-3, 0.1, (0.9, 0.95))
    x = torch.randint(0, 256, (16, 64))

    def step():
        _, loss = model(x, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    times = []
    for _ in range(steps):
        t = time.process_time()
        step()
        times.append(time.process_time() - t)
    census, reads = [], []
    for _ in range(9):
        t = time.process_time()
        probe.tensor_census()
        census.append(time.process_time() - t)
        t = time.perf_counter()
        for _ in range(1000):
            heap.in_use_bytes()
        reads.append((time.perf_counter() - t) / 1000)
    s, c, h = statistics.median(times), statistics.median(census), statistics.median(reads)
    print(f"step {s * 1e3:.1f} ms; census {c * 1e3:.1f} ms ({c / s:.1f} steps); heap read {h * 1e6:.2f} us")
    for every in (10, 50, 100):
        print(f"  census at every snapshot, every={every}: {c / (every * s) * 100:.1f} % of training time; "
              f"heap read: {h / (every * s) * 100:.5f} %")


def snap(step: int, backend: str, mem: dict, final: bool) -> dict:
    return {"schema": SCHEMA, "backend": backend, "run": "noise", "step": step, "phase": "post-step",
            "trigger": "final" if final else "cadence", "params": [], "groups": [], "memory": mem}


def streams(kind: str, rng: np.random.Generator):
    every = int(rng.choice([1, 10, 50, 100]))
    n = int(rng.integers(20, 300))
    x = np.arange(1, n + 1) * every
    if kind == "rss-gauss":
        return "pytorch", x, {"rss_bytes": 400 * MiB + rng.normal(0, rng.uniform(0.5, 60) * MiB, n)}
    if kind == "rss-ar1":
        e, v = np.zeros(n), rng.uniform(1, 40) * MiB
        for i in range(1, n):
            e[i] = 0.9 * e[i - 1] + rng.normal(0, v)
        return "pytorch", x, {"rss_bytes": 400 * MiB + e}
    if kind == "live-gc-debt":
        k = int(rng.integers(1, 300))
        return "pytorch", x, {"live_tensors": 110 + rng.integers(0, k + 1, n) * (rng.random(n) < 0.5)}
    if kind == "heap-jitter":
        return "pytorch", x, {"heap_in_use_bytes": 140 * MiB + rng.integers(0, 256 * 1024, n)}
    # a scoped TorchSharp step: peak 2-3x live, the probe's own wrappers created and disposed outside
    probe_wrappers = np.cumsum(np.full(n, 26))
    return "torchsharp", x, {"live_tensors": np.full(n, 110), "peak_tensors": 293 + rng.integers(0, 60, n),
                             "tensors_created_outside_scope": probe_wrappers,
                             "tensors_disposed_outside_scope": probe_wrappers,
                             "rss_bytes": 310 * MiB + rng.normal(0, 4 * MiB, n)}


def false_alarms(count: int) -> None:
    rules = [r for r in catalogue() if r.family == "memory"]
    rng = np.random.default_rng(0)
    for kind in ("rss-gauss", "rss-ar1", "live-gc-debt", "heap-jitter", "torchsharp-scoped"):
        fired = 0
        for _ in range(count):
            backend, x, series = streams(kind, rng)
            engine = RuleEngine(RuleConfig(), rules=rules)
            for i, s in enumerate(x):
                engine.feed(snap(int(s), backend, {k: float(v[i]) for k, v in series.items()}, i == len(x) - 1))
            fired += bool(engine.findings)
        print(f"{kind:18s} {fired}/{count} streams with a finding")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--skip-cost", action="store_true")
    a = ap.parse_args()
    if not a.skip_cost:
        cost(a.steps)
    false_alarms(a.streams)


if __name__ == "__main__":
    main()
