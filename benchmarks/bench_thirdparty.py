"""The Monitor's cost with third-party optimizers (issue 25: "the Monitor's cost on
three of them"): ``bench_soak.py``'s small-GPT loop (tied embeddings, clipping, a
cosine schedule, 1 thread) with its AdamW replaced by pytorch-optimizer's Lion,
heavyball's MuonAdamW and schedule-free's AdamWScheduleFree, each run without
optcheck and under ``optcheck.Monitor(every=100)`` with every probe, in separate
processes, interleaved round by round. Reported: CPU time of the loop with the
Monitor over CPU time without it (``time.process_time``), median (min-max) of the
rounds, and optcheck's own µs a step from the summary's ``cost.steps``. Needs the
``zoo`` extra (``pip install -e '.[zoo]' torch==2.13.0``).

    python benchmarks/bench_thirdparty.py --steps 300 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_soak import SMALL_GPT, _env, load  # noqa: E402

ADAMW = """opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.95))"""
#: name -> the line that builds the optimizer (over the same two param groups) and what the loop needs
OPTIMIZERS = {
    "pytorch_optimizer.Lion": ("import pytorch_optimizer\n"
                               "opt = pytorch_optimizer.Lion([{'params': decay, 'weight_decay': 0.1}, "
                               "{'params': no_decay, 'weight_decay': 0.0}], lr=1e-4)"),
    "heavyball.MuonAdamW": ("import heavyball\n"
                              "opt = heavyball.MuonAdamW([{'params': decay}, {'params': no_decay}], lr=1e-3)"),
    "schedulefree.AdamWScheduleFree": ("import schedulefree\n"
                                       "opt = schedulefree.AdamWScheduleFree([{'params': decay, 'weight_decay': 0.1}, "
                                       "{'params': no_decay, 'weight_decay': 0.0}], lr=1e-3, warmup_steps=10)\n"
                                       "opt.train()"),
}


def code_for(name: str) -> str:
    """The small-GPT loop's code with its optimizer built by ``OPTIMIZERS[name]``."""
    assert ADAMW in SMALL_GPT, "bench_soak.py's small-GPT loop changed: update ADAMW here"
    return SMALL_GPT.replace(ADAMW, OPTIMIZERS[name])


def run(name: str, steps: int, every: int, mode: str) -> tuple[float, float | None]:
    """(CPU seconds of the loop, optcheck's own µs a step or None) of one run in its own process."""
    out = subprocess.run([sys.executable, "-c", code_for(name), str(steps), "1", str(every), mode],
                         capture_output=True, text=True, env={**_env(None), "OMP_NUM_THREADS": "1"},
                         cwd=tempfile.gettempdir(), start_new_session=True)
    if out.returncode != 0:
        raise SystemExit(f"{name} ({mode}) failed: {out.stderr.strip().splitlines()[-1:]}")
    _, _, cpu, own, _ = out.stdout.split()[-5:]
    return float(cpu), None if own == "None" else float(own)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=list(OPTIMIZERS), action="append")
    a = ap.parse_args()
    names = a.only or list(OPTIMIZERS)
    ratios: dict[str, list[float]] = {n: [] for n in names}
    own: dict[str, list[float]] = {n: [] for n in names}
    plain_ms: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(a.rounds):
        for n in names:
            base, _unused = run(n, a.steps, a.every, "none")
            mon, us = run(n, a.steps, a.every, "all")
            ratios[n].append(mon / base)
            plain_ms[n].append(1e3 * base / a.steps)
            if us is not None:
                own[n].append(us)
    print(f"small-GPT loop, {a.steps} steps, Monitor(every={a.every}) with every probe, 1 thread, "
          f"{a.rounds} interleaved rounds; load {load()}; python {sys.version.split()[0]}, pid {os.getpid()}")
    print(f"{'optimizer':34} {'plain ms/step':>14} {'CPU ratio median (min-max)':>28} {'own us/step':>12}")
    for n in names:
        r = ratios[n]
        print(f"{n:34} {statistics.median(plain_ms[n]):14.2f} "
              f"{statistics.median(r):>12.3f}x ({min(r):.3f}-{max(r):.3f}) "
              f"{statistics.median(own[n]) if own[n] else float('nan'):12.0f}")


if __name__ == "__main__":
    main()
