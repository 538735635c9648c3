"""Cost of the TorchSharp probe's value pass (``ValueStats.Float32``, dotnet/Probe/ValueStats.cs:
value_norm + checksum of a tensor's host memory in one pass), against numpy doing the same two
reductions, in CPU time (``time.process_time``; wall time on a loaded machine says little).

Loads a .NET runtime (``--runtime coreclr|mono``) into this process, the stand-in assembly
(``tests/dotnet``, which compiles ``dotnet/Probe``) and calls ``ValueStats.Float32`` on a numpy
float32 array through its address; checks that both give the same checksum.
Usage: ``python benchmarks/bench_value_stats.py [--runtime coreclr] [--values 16000000] [--rounds 5]``.
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
    ap.add_argument("--values", type=int, default=16_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    from build import build_testloop

    from optcheck.torchsharp_bridge import runtime

    rt = runtime.load(args.runtime)
    runtime.load_assembly(build_testloop())
    ValueStats = runtime.loaded_internal_type("OptCheck.Probe.ValueStats")  # internal: not importable
    from System import IntPtr

    a = np.random.default_rng(0).standard_normal(args.values).astype(np.float32)
    net, ref = [], []
    for _ in range(args.rounds):
        t = time.process_time()
        norm, checksum = ValueStats.Float32(IntPtr(a.ctypes.data), a.size, 0.0, 0)  # out parameters: a tuple
        net.append(time.process_time() - t)
        t = time.process_time()
        want_norm = float(np.sqrt(np.dot(a.astype(np.float64), a.astype(np.float64))))
        want_sum = int(a.view(np.int32).sum(dtype=np.int32))
        ref.append(time.process_time() - t)
    assert int(checksum) == want_sum and abs(norm - want_norm) <= 1e-9 * want_norm, (norm, checksum)
    n, r = statistics.median(net), statistics.median(ref)
    print(f"value pass: {rt.describe()}, {args.values:,} float32 values, {args.rounds} rounds, CPU time, median")
    print(f"  ValueStats.Float32 {n * 1e3:8.1f} ms ({n * 1e9 / args.values:.2f} ns/value)   "
          f"numpy norm + checksum {r * 1e3:8.1f} ms   ratio {n / r:.2f}")


if __name__ == "__main__":
    main()
