"""Cost of the autograd hazard probes, as ratios against a plain loop in the same run.

Runs the default soak GPT (2 layers, 64 wide, context 64, batch 16, 1 thread) with
AdamW five ways, interleaved in rounds so load from other processes hits all of them
alike: a plain loop, the loop with :class:`optcheck.pytorch.hazards.HazardProbes`
on every step (``mode="always"``: every probe, the write log's mode included), the
probes at ``mode="auto"`` with a drain every 100 steps (as a snapshot does: one armed
step per 100), and the loop under ``torch.autograd.detect_anomaly``
with ``check_nan=False`` and ``True``. ``--kinds`` picks some of them (plain always
runs). To compare two versions, run this file twice with ``PYTHONPATH`` set to each
checkout (``git archive <commit> | tar -x -C DIR``), alternating. Prints ms/step (median of rounds) and the
ratios. Time is the process's CPU time (``time.process_time``): on a shared
machine it is far less disturbed by other processes than wall time. Usage: ``python benchmarks/bench_hazards.py [--steps 100] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import warnings

import torch

import optcheck
from optcheck.pytorch.gpt import GPT, GPTConfig
from optcheck.pytorch.hazards import HazardProbes


def make():
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    opt = model.configure_optimizers(1e-3, 0.1, (0.9, 0.95))
    x = torch.randint(0, 256, (16, 64))
    y = torch.randint(0, 256, (16, 64))
    return model, opt, x, y


def run(kind: str, steps: int) -> float:
    model, opt, x, y = make()
    probes = (HazardProbes(model, opt, mode="always") if kind == "probes" else  # every step armed, as detect_anomaly
              HazardProbes(model, opt, mode="auto") if kind == "probes-auto" else None)
    if kind.startswith("anomaly"):
        ctx = lambda s: torch.autograd.detect_anomaly(check_nan=kind.endswith("nan"))  # noqa: E731
    elif probes is not None:
        ctx = probes.step_context
    else:
        ctx = lambda s: contextlib.nullcontext()  # noqa: E731

    def step(s):
        opt.zero_grad(set_to_none=True)
        with ctx(s):
            _, loss = model(x, y)
            if probes is not None:
                probes.check_loss(loss, s)
            loss.backward()
        if probes is not None:
            probes.after_backward(s)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if probes is not None and kind == "probes-auto" and s % 100 == 0:
            assert not probes.drain()  # a snapshot: the next step is armed

    for s in range(1, 6):
        step(s)
    t0 = time.process_time()
    for s in range(6, 6 + steps):
        step(s)
    dt = (time.process_time() - t0) / steps
    if probes is not None:
        assert not probes.drain(), "a clean loop must record no hazard events"
        probes.remove()
    return dt * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kinds", default="probes,probes-auto,anomaly,anomaly+nan",
                    help="comma-separated, of probes, probes-auto, anomaly, anomaly+nan (plain always runs)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # detect_anomaly warns that it is on
    kinds = ["plain", *a.kinds.split(",")]
    times = {k: [] for k in kinds}
    for _ in range(a.rounds):
        for k in kinds:
            times[k].append(run(k, a.steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"torch {torch.__version__}, 1 thread, {a.rounds} rounds x {a.steps} steps (median CPU ms/step)")
    for k in kinds:
        print(f"  {k:<12} {med[k]:8.3f} ms/step   {med[k] / med['plain']:.3f}x plain")
    print(f"optcheck {optcheck.__file__}; load average {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
