"""Run by tests/torchsharp_real/test_real_snapshot.py in its own process (the built-in GPT on real TorchSharp,
pythonnet in this process): steps and snapshots, and for each snapshot whether it ran a full .NET collection
(``GC.CollectionCount(2)`` moved) and its CPU milliseconds. Prints one JSON object.

    python gc_probe.py WORKER_DLL FAULT   (FAULT: none | state-leak | no-dispose-scope)
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from optcheck.config import DataConfig, ModelConfig, RunConfig, SoakConfig, TorchSharpConfig
from optcheck.data import BatchSchedule, load_corpus
from optcheck.torchsharp_bridge import runtime
from optcheck.torchsharp_bridge.worker import TorchSharpBackend

dll, fault = sys.argv[1], sys.argv[2]
cfg = SoakConfig(model=ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=32),
                 run=RunConfig(backend="torchsharp", steps=1000, every=20, threads=1),
                 data=DataConfig(batch_size=8, val_every=0),
                 torchsharp=TorchSharpConfig(assembly=dll, trainer="OptCheck.Worker.GptTrainer"))
corpus = load_corpus(None, None)
xs = np.empty((20, 8, 32), dtype=np.int64)
ys = np.empty_like(xs)
BatchSchedule(corpus.train.size, 32, 8, 1337).fill(corpus.train, 1, xs, ys)
be = TorchSharpBackend()
be.setup(cfg, corpus)
Bench = runtime.loaded_internal_type("OptCheck.Probe.Bench")
from System import GC, IntPtr  # noqa: E402

out = {"collected": [], "cpu_ms": [], "live": []}
for i in range(12):
    if i == 1 and fault != "none":
        be.inject(fault, 20)
    Bench.TimeSteps(be.driver, 1, IntPtr(xs.ctypes.data), IntPtr(ys.ctypes.data), 8, 32, 20)
    before, t0 = GC.CollectionCount(2), time.process_time()
    body = be.snapshot_body()
    out["cpu_ms"].append(1e3 * (time.process_time() - t0))
    out["collected"].append(GC.CollectionCount(2) > before)
    out["live"].append(body["memory"]["live_tensors"])
print(json.dumps(out))
