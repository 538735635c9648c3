"""What ``optcheck run``'s start-up hook costs a process (issue 47: ``python -c pass`` under the hook
at most 5 ms more than without).

Each round starts the same command twice, once plainly and once as ``optcheck run`` starts it
(``optcheck/autowatch/boot`` first on ``PYTHONPATH``, ``OPTCHECK_RUN`` set: the boot
``sitecustomize`` runs, chains to any other, and puts its torch finder on ``sys.meta_path``),
in alternating order, each timed by wall clock from ``fork`` to exit. The pairs' differences
give the added time with its 95 % interval (Student's t, normal approximation), and the
medians of both sides their ratio.

- ``pass``: ``python -c pass``, a process that never imports torch (a shell's helper, a tokenizer
  pool): what every process of the command pays;
- ``torch`` (``--torch``): ``python -c "import torch"``: a process that imports torch and never
  steps an optimizer (a DataLoader worker under spawn, the torchrun launcher): the hook plus the
  watch's install (``optcheck.autowatch.attach`` imported, three global hooks registered).

    python benchmarks/bench_run_startup.py                 # 40 pairs of python -c pass
    python benchmarks/bench_run_startup.py --pairs 10 --torch
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOT = ROOT / "optcheck" / "autowatch" / "boot"


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def measure(code: str, pairs: int, out: str) -> dict:
    """``pairs`` alternating pairs of ``python -c code`` without / with the hook; seconds."""
    plain = {k: v for k, v in os.environ.items() if k not in ("OPTCHECK_RUN",)}
    plain["PYTHONPATH"] = str(ROOT)
    hooked = dict(plain, PYTHONPATH=f"{BOOT}{os.pathsep}{ROOT}",
                  OPTCHECK_RUN=json.dumps({"out": out, "every": 100, "root": str(ROOT)}))
    cmd = [sys.executable, "-c", code]
    for _ in range(3):  # warm the page cache for both
        timed(cmd, plain)
        timed(cmd, hooked)
    a, b = [], []
    for i in range(pairs):
        if i % 2:
            b.append(timed(cmd, hooked))
            a.append(timed(cmd, plain))
        else:
            a.append(timed(cmd, plain))
            b.append(timed(cmd, hooked))
    diffs = [y - x for x, y in zip(a, b)]
    mean = statistics.fmean(diffs)
    half = 1.96 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return {"code": code, "pairs": pairs, "plain_median_ms": 1e3 * statistics.median(a),
            "hooked_median_ms": 1e3 * statistics.median(b), "added_ms": 1e3 * mean, "added_ci95_ms": 1e3 * half,
            "added_median_ms": 1e3 * statistics.median(diffs),
            "ratio": statistics.median(b) / statistics.median(a)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--torch", action="store_true", help="also python -c 'import torch'")
    args = ap.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        rows = [measure("pass", args.pairs, out)]
        if args.torch:
            rows.append(measure("import torch", max(4, args.pairs // 4), out))
    for r in rows:
        print(f"python -c {r['code']!r:16} plain {r['plain_median_ms']:7.1f} ms  hooked {r['hooked_median_ms']:7.1f} ms"
              f"  added {r['added_ms']:+6.2f} ± {r['added_ci95_ms']:.2f} ms (median {r['added_median_ms']:+.2f})"
              f"  ratio {r['ratio']:.3f}x  ({r['pairs']} pairs)")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
