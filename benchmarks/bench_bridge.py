"""Cost of the pythonnet bridge, as ratios against the same .NET loop timed inside .NET, in one run.

Loads a .NET runtime (``--runtime coreclr|mono``) into this process, builds the
.NET stand-in training loop (``tests/dotnet/TestLoop.cs`` with ``dotnet/Probe``,
compiled with ``mcs``) and drives it through the TorchSharp worker's own backend
(:class:`optcheck.torchsharp_bridge.worker.TorchSharpBackend`), interleaved in
rounds so that load from other processes hits every variant alike:

- step: ``N`` steps run by a loop inside .NET (``Bench.TimeSteps``, dotnet/Probe/Bench.cs) against ``N``
  steps driven from Python as the worker does (``train_step`` + ``fingerprint``,
  the per-step pre-step check), same batch;
- pre-step check: ``Bench.TimeFingerprints`` against ``fingerprint()`` from Python;
- snapshot: ``Bench.TimeProbes`` (the probe alone, inside .NET: the body written as JSON,
  pre-step check and value statistics included) against ``snapshot_body()`` (the same
  probe + the JSON string across pythonnet + ``json.loads`` + member naming).

- decode: ``Driver.Probe()`` alone (the JSON string across pythonnet) against ``snapshot_body()``
  (+ ``json.loads`` + member naming), the probe's ``GC.Collect`` switched off so that it does
  not drown the difference; before the JSON boundary this difference (copying ProbeArrays' 34
  arrays, converting them, a second call for the pre-step check) was ~0.5 ms (docs/dotnet.md).

Time is CPU time of this process (``time.process_time``; less disturbed by other
processes on a shared machine than wall time), median over rounds. The stand-in
steps in ~2 ms, far less than a TorchSharp GPT step (~19 ms on 0.107.0, docs/torchsharp.md): the
absolute µs of overhead are the figure to carry over, the step ratio is an upper
bound. Usage: ``python benchmarks/bench_bridge.py [--runtime coreclr] [--steps 300] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "dotnet"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runtime", choices=["coreclr", "mono"], default="coreclr")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--snapshots", type=int, default=200)
    ap.add_argument("--n-embd", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()

    from build import build_testloop

    from optcheck.config import DataConfig, ModelConfig, OptimizerConfig, RunConfig, SoakConfig, TorchSharpConfig
    from optcheck.data import BatchSchedule, load_corpus
    from optcheck.torchsharp_bridge import runtime
    from optcheck.torchsharp_bridge.worker import TorchSharpBackend

    dll = build_testloop()
    cfg = SoakConfig(model=ModelConfig(n_embd=args.n_embd, n_head=2, block_size=args.block_size),
                     optimizer=OptimizerConfig(lr=1e-2), data=DataConfig(batch_size=args.batch_size),
                     run=RunConfig(backend="torchsharp"),
                     torchsharp=TorchSharpConfig(runtime=args.runtime, assembly=str(dll),
                                                 trainer="OptCheckTest.LazyTrainer"))
    corpus = load_corpus(None)
    be = TorchSharpBackend()
    be.setup(cfg, corpus)
    x, y = BatchSchedule(corpus.train.size, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed).batch(corpus.train, 1)
    xc, yc = np.ascontiguousarray(x), np.ascontiguousarray(y)
    Bench = runtime.loaded_internal_type("OptCheck.Probe.Bench")  # internal: not importable
    from System import IntPtr

    d, n, k = be.driver, args.steps, args.snapshots
    step = 1
    res: dict[str, list[float]] = {key: [] for key in ("net_step", "py_step", "net_fp", "py_fp", "net_snap", "py_snap")}
    for _ in range(args.rounds):
        t = time.process_time()
        Bench.TimeSteps(d, step, IntPtr(xc.ctypes.data), IntPtr(yc.ctypes.data), xc.shape[0], xc.shape[1], n)
        res["net_step"].append((time.process_time() - t) / n)
        step += n
        t = time.process_time()
        for i in range(n):
            be.fingerprint()
            be.train_step(step + i, x, y)
        res["py_step"].append((time.process_time() - t) / n)
        step += n
        t = time.process_time()
        Bench.TimeFingerprints(d, n)
        res["net_fp"].append((time.process_time() - t) / n)
        t = time.process_time()
        for _ in range(n):
            be.fingerprint()
        res["py_fp"].append((time.process_time() - t) / n)
        t = time.process_time()
        Bench.TimeProbes(d, k)
        res["net_snap"].append((time.process_time() - t) / k)
        t = time.process_time()
        for _ in range(k):
            be.snapshot_body()
        res["py_snap"].append((time.process_time() - t) / k)
    from System.Reflection import BindingFlags

    core = d.GetType().GetProperty("Core", BindingFlags.NonPublic | BindingFlags.Instance).GetValue(d)
    core.CollectBeforeMemory = False
    res["raw_probe"], res["py_probe"] = [], []
    for _ in range(args.rounds):
        t = time.process_time()
        for _ in range(k):
            d.Probe()
        res["raw_probe"].append((time.process_time() - t) / k)
        t = time.process_time()
        for _ in range(k):
            be.snapshot_body()
        res["py_probe"].append((time.process_time() - t) / k)
    core.CollectBeforeMemory = True
    med = {key: statistics.median(v) * 1e6 for key, v in res.items()}
    print(f"bridge benchmark: {be.versions()['dotnet']} ({args.runtime}), pythonnet {be.versions()['pythonnet']}, "
          f"{len(be.snapshot_body()['params'])} parameters, {args.rounds} rounds, CPU time, median")
    print(f"  step     inside .NET {med['net_step']:9.1f} us   from Python (step + pre-step check) "
          f"{med['py_step']:9.1f} us   ratio {med['py_step'] / med['net_step']:.3f}   "
          f"overhead {med['py_step'] - med['net_step']:.1f} us/step")
    print(f"  check    inside .NET {med['net_fp']:9.1f} us   from Python {med['py_fp']:9.1f} us   "
          f"ratio {med['py_fp'] / med['net_fp']:.2f}")
    print(f"  snapshot inside .NET {med['net_snap']:9.1f} us   from Python (probe + json.loads) "
          f"{med['py_snap']:9.1f} us   ratio {med['py_snap'] / med['net_snap']:.2f}")
    print(f"  decode   Driver.Probe() {med['raw_probe']:9.1f} us   snapshot_body() {med['py_probe']:9.1f} us   "
          f"JSON decode + naming {med['py_probe'] - med['raw_probe']:.1f} us (GC.Collect off)")


if __name__ == "__main__":
    main()
