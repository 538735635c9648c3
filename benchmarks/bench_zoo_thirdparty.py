"""Cost of ``optcheck.Monitor`` on third-party optimizers, against the same loop
without it, in one run (issue 25).

Three optimizers of the zoo (``tests/integration/thirdparty_zoo.py``: the tiny MLP and
the loop its README prescribes) by default: pytorch-optimizer's ``ADOPT``,
heavyball's ``AdamW`` (eager, ``compile_mode=None``: nested state
``state[p] = {0: {...}}``) and torchao's ``AdamW8bit`` (quantized-state subclasses
read through ``dequantize()``). Each configuration runs in a fresh process with 1
intra-op thread, plain and under ``Monitor(every=...)`` interleaved in rounds (so
load from other processes hits both alike); a process first runs the loop a few
steps to warm up, then times ``--steps`` steps with ``time.process_time()`` (CPU
seconds: less disturbed by other processes than wall time) and
``time.perf_counter()`` from the end of ``Monitor()`` (its construction, the first
snapshot and the process-wide tensor census included, is printed apart), and the
close (the final snapshot) included. Printed per optimizer: median µs per step of each and the
median and range over rounds of the ratio Monitor/plain. Usage::

    python benchmarks/bench_zoo_thirdparty.py --steps 300 --every 10 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["pytorch_optimizer.adopt", "heavyball.AdamW", "torchao.AdamW8bit"]


def one(name: str, monitor: bool, steps: int, every: int) -> dict:
    """Run one configuration in this process; returns its timings."""
    warnings.simplefilter("ignore")
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    sys.path.insert(0, str(ROOT / "tests"))
    import torch

    torch.set_num_threads(1)
    import thirdparty_zoo as zoo

    import optcheck

    class Timed(optcheck.Monitor):
        """Marks the end of its construction: the steps are timed from there."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            marks["built"] = (time.perf_counter(), time.process_time())

    entry = {e.id: e for e in zoo.entries()}[name]
    zoo.run(entry, 5, every, monitor=False)  # warm-up: imports, first-step code paths
    marks = {"built": (time.perf_counter(), time.process_time())}
    t0 = time.perf_counter()
    _, mon, _ = zoo.run(entry, steps, every, monitor=monitor, monitor_cls=Timed)
    t, c = marks["built"]
    out = {"wall_us": 1e6 * (time.perf_counter() - t) / steps, "cpu_us": 1e6 * (time.process_time() - c) / steps,
           "construct_s": t - t0}
    if mon is not None:
        s = mon.summary()
        out["own_us"] = s["cost"]["steps"]["mean_us"]
        out["findings"] = len(mon.findings)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizers", nargs="*", default=DEFAULT)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--monitor", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.monitor, a.steps, a.every)))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"optcheck {ROOT} @ {commit}; steps {a.steps}, every {a.every}, {a.repeat} rounds; "
          f"load {os.getloadavg()[0]:.1f}")
    results: dict = {}
    for r in range(a.repeat):
        for name in a.optimizers:
            for mon in (False, True):
                cmd = [sys.executable, __file__, "--one", name, "--steps", str(a.steps), "--every", str(a.every)]
                p = subprocess.run(cmd + (["--monitor"] if mon else []), capture_output=True, text=True, env=env,
                                   start_new_session=True)
                lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
                if p.returncode or not lines:
                    print(f"{name} monitor={mon}: failed: {p.stderr.strip().splitlines()[-1:]}")
                    continue
                results.setdefault(name, {}).setdefault(mon, []).append(json.loads(lines[-1]))
    print(f"{'optimizer':28} {'plain cpu µs/step':>18} {'monitor cpu µs/step':>20} {'ratio cpu':>16} "
          f"{'ratio wall':>16} {'own µs':>7} {'Monitor() s':>11}")
    for name, by in results.items():
        if len(by.get(False, [])) != len(by.get(True, [])) or not by.get(True):
            continue
        plain, mon = by[False], by[True]
        cpu = [m["cpu_us"] / p["cpu_us"] for p, m in zip(plain, mon)]
        wall = [m["wall_us"] / p["wall_us"] for p, m in zip(plain, mon)]
        print(f"{name:28} {statistics.median(p['cpu_us'] for p in plain):18.0f} "
              f"{statistics.median(m['cpu_us'] for m in mon):20.0f} "
              f"{statistics.median(cpu):6.2f}x ({min(cpu):.2f}-{max(cpu):.2f}) "
              f"{statistics.median(wall):6.2f}x ({min(wall):.2f}-{max(wall):.2f}) "
              f"{statistics.median(m['own_us'] or 0 for m in mon):7.0f} "
              f"{statistics.median(m['construct_s'] for m in mon):11.2f}")
    print(f"load after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
