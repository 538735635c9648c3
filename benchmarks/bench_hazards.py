"""Cost of the autograd hazard probes, as ratios against a plain loop in the same run.

Runs the default soak GPT (2 layers, 64 wide, context 64, batch 16, 1 thread) with
AdamW four ways, interleaved in rounds so load from other processes hits all of them
alike: a plain loop, the loop with :class:`optcheck.pytorch.hazards.HazardProbes`
on (every probe, every step), and the loop under ``torch.autograd.detect_anomaly``
with ``check_nan=False`` and ``True``. Prints ms/step (median of rounds) and the
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
    probes = HazardProbes(model, opt, mode="always") if kind == "probes" else None  # every step armed, as detect_anomaly
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
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # detect_anomaly warns that it is on
    kinds = ["plain", "probes", "anomaly", "anomaly+nan"]
    times = {k: [] for k in kinds}
    for _ in range(a.rounds):
        for k in kinds:
            times[k].append(run(k, a.steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"torch {torch.__version__}, 1 thread, {a.rounds} rounds x {a.steps} steps (median CPU ms/step)")
    for k in kinds:
        print(f"  {k:<12} {med[k]:8.3f} ms/step   {med[k] / med['plain']:.3f}x plain")
    print(f"hazard probes: {med['probes'] / med['plain']:.3f}x; detect_anomaly: "
          f"{med['anomaly'] / med['plain']:.3f}x (check_nan=False), {med['anomaly+nan'] / med['plain']:.3f}x (check_nan=True)")


if __name__ == "__main__":
    main()
