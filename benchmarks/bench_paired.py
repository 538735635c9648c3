"""The Monitor's cost on the small, fast loop, measured in one process: paired blocks (issue 34).

``bench_small_loop.py`` runs each configuration in a process of its own. Two processes that run
the very same plain loop side by side (its ``--lockstep`` mode) still differ: the second plain
process measured 1.018x and 1.019x the first (medians of 5 and 8 rounds, single rounds
0.97-1.09x, this project's 2-core machine), a bias of the method as large as half the 1.03x
target. Here every block runs in the same process, on the same model, optimizer and heap:

- a pair is a plain block of ``--block`` steps and a watched block of as many, in turn (the
  order alternates from pair to pair, so a drift of the machine falls on both alike);
- a watched block builds its ``Monitor(every=...)`` before its first step and closes it after
  its last, neither timed (``Monitor()`` takes the start snapshot outside the loop); with
  ``--block`` equal to ``--every`` (the default, 100) each watched block holds what every 100
  steps of a long run hold: a cadence snapshot, the armed step after the start (and any other
  the probes arm), the quiet steps between;
- ``plain`` pairs two plain blocks: the floor of the method, reported beside the others;
- the ratio of a pair is the watched block's CPU time (``time.process_time``) over the plain
  block's; the table gives the median over pairs and the quartiles.

A watched block's Monitor puts its wrappers of ``Tensor.backward`` and ``clip_grad_norm_`` in
and ``close()`` takes them out again: the plain blocks run without them.

    python benchmarks/bench_paired.py                       # plain (the floor), off, auto; 30 pairs each
    python benchmarks/bench_paired.py --configs auto --pairs 60 --block 100
    python benchmarks/bench_paired.py --device cuda         # the loop on a card: wall time, synchronised
    PYTHONPATH=/other/checkout python benchmarks/bench_paired.py   # another optcheck
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_small_loop import CONFIGS, build_loop  # noqa: E402  (the loop, written for issue 34)


def timed(step, n: int, device: str = "cpu") -> float:
    """CPU seconds (the process's) of ``n`` steps; on a CUDA device wall seconds, the device
    synchronised before and after (the host's and the card's time: a small loop there waits on
    the host, and the Monitor's host work is what it adds)."""
    if device == "cpu":
        c0 = time.process_time()
        for _ in range(n):
            step()
        return time.process_time() - c0
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def monitor(config: str, model, opt, every: int, out: str):
    """A watched block's watcher: ``optcheck.Monitor`` with ``CONFIGS[config]``, or None (plain)."""
    import optcheck

    if CONFIGS[config] is None:
        return None
    return optcheck.Monitor(model, opt, every=every, out=out, on_finding="ignore", ignore_config=False,
                            **CONFIGS[config])


def pairs(configs: list[str], n_pairs: int, block: int, every: int, out: str,
          device: str = "cpu", watch=monitor) -> dict[str, list[float]]:
    """``{config: [ratio per pair]}``, the configurations' pairs interleaved (see the module docstring).
    ``watch(config, model, opt, every, out)``: what watches a watched block (its ``close()`` ends it;
    None: nothing, the floor)."""
    model, opt, step = build_loop(n_pairs * len(configs) * 2 * block + 40, device)
    for _ in range(20):
        step()
    ratios: dict[str, list[float]] = {c: [] for c in configs}
    for i in range(n_pairs):
        for c in configs:
            times = {}
            for which in (("plain", "watched") if i % 2 == 0 else ("watched", "plain")):
                mon = watch(c, model, opt, every, os.path.join(out, f"{c}-{i}")) if which == "watched" else None
                times[which] = timed(step, block, device)
                if mon is not None:
                    mon.close()
            ratios[c].append(times["watched"] / times["plain"])
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="plain,off,auto", help="comma-separated: plain (the floor), off, auto")
    ap.add_argument("--pairs", type=int, default=30, help="pairs per configuration")
    ap.add_argument("--block", type=int, default=100, help="steps per block")
    ap.add_argument("--every", type=int, default=100, help="the watched blocks' Monitor(every=...)")
    ap.add_argument("--device", default="cpu", help="cpu (CPU time), or cuda (wall time, synchronised per block)")
    a = ap.parse_args()
    configs = a.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"bench_paired: unknown configuration(s) {unknown}; known: {sorted(CONFIGS)}")
    import optcheck

    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        ratios = pairs(configs, a.pairs, a.block, a.every, tmp, a.device)
    print(f"optcheck from {Path(optcheck.__file__).parent.parent}; {a.pairs} pairs of {a.block}-step blocks per "
          f"configuration, every={a.every}, {a.device}, 1 thread; load {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    print_ratios(ratios, "CPU" if a.device == "cpu" else "wall",
                 lambda c: f"{c}{' (the floor: plain against plain)' if CONFIGS[c] is None else ''}")


def print_ratios(ratios: dict[str, list[float]], clock: str = "CPU", label=str) -> None:
    """The table of :func:`pairs`' ratios: per configuration (``label(config)``), the median,
    quartiles and range over its pairs."""
    print(f"| configuration | {clock} ratio to the plain block of its pair, median | quartiles | min-max |")
    print("|---|---:|---:|---:|")
    for c, r in ratios.items():
        r = sorted(r)
        q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0], r[0], r[0]]
        print(f"| {label(c)} | {statistics.median(r):.3f}x | {q[0]:.3f}-{q[2]:.3f} | {r[0]:.3f}-{r[-1]:.3f} |")


if __name__ == "__main__":
    main()
