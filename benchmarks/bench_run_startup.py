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
  watch's install (``optcheck.autowatch.attach`` imported, three global hooks registered);
- ``--forward``: in this process, what the watch's global forward pre-hook adds to each module
  call (a 64-layer ``Sequential`` of tiny ``Linear`` layers, CPU time, alternating rounds with
  and without the hooks): the price per module call of a watched program, Monitor aside.

    python benchmarks/bench_run_startup.py                 # 40 pairs of python -c pass
    python benchmarks/bench_run_startup.py --pairs 10 --torch --forward
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


def forward_hook_cost(modules: int = 64, calls: int = 300, rounds: int = 20) -> dict:
    """What the watch's global forward pre-hook adds per module call: a ``Sequential`` of
    ``modules`` tiny ``Linear`` layers called ``calls`` times, with the hooks installed and
    without, in alternating rounds (CPU time, ``time.process_time_ns``); ns per module call."""
    import torch

    from optcheck.autowatch.attach import AutoWatch

    torch.set_num_threads(1)
    net = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(modules)])
    x = torch.randn(1, 4)

    def block() -> float:
        t0 = time.process_time_ns()
        with torch.no_grad():
            for _ in range(calls):
                net(x)
        return (time.process_time_ns() - t0) / (calls * (modules + 1))

    block()
    plain, hooked = [], []
    for i in range(rounds):
        for side in ((plain, hooked) if i % 2 else (hooked, plain)):
            w = AutoWatch(None).install() if side is hooked else None
            side.append(block())
            if w is not None:
                w.uninstall()
    diffs = [h - p for p, h in zip(plain, hooked)]
    return {"plain_ns_per_call": statistics.median(plain), "hooked_ns_per_call": statistics.median(hooked),
            "added_ns_per_call": statistics.fmean(diffs),
            "added_ci95_ns": 1.96 * statistics.stdev(diffs) / math.sqrt(len(diffs))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--torch", action="store_true", help="also python -c 'import torch'")
    ap.add_argument("--forward", action="store_true", help="also the forward hook's cost per module call")
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
    if args.forward:
        f = forward_hook_cost()
        print(f"forward pre-hook: {f['plain_ns_per_call']:.0f} ns per module call plain, "
              f"{f['hooked_ns_per_call']:.0f} hooked: +{f['added_ns_per_call']:.0f} ± {f['added_ci95_ns']:.0f} ns")
        rows.append(f)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
