"""Cost of the parameter pass of a PyTorch snapshot (``optcheck.pytorch.probe.params``).

Times, per snapshot, on the default soak GPT (2 layers, 64 wide) and on a
GPT-2-small-sized one (12 layers, 768 wide, 12 heads, vocab 50304, context 1024,
built from a ``GPTConfig``; 124 M parameters) with every parameter holding a
gradient, 1 thread:

- ``checksum``: the value checksum alone (``probe._checksum`` of every distinct
  parameter, one stack and one ``tolist``) — what OC205 reads to tell whether a
  parameter moved;
- ``grad norms``: the gradient norms alone (``probe._norms``);
- ``params()``: the whole parameter pass (both, plus the metadata);
- ``old grad norms``: the per-parameter ``float(grad.float().norm())`` loop the
  probe used before (for comparison).

Prints the median ms over ``--repeat`` runs and the checksum's share of one
training step of the default GPT (batch 16, AdamW) as a ratio. Times are the
process's CPU time (``time.process_time``, one thread): on a shared machine far
less disturbed by other processes than wall time, still noisy. Usage: ``python benchmarks/bench_probe.py [--repeat 5] [--small-only]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from optcheck.pytorch import probe
from optcheck.pytorch.gpt import GPT, GPTConfig


def median_ms(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e3


def measure(label: str, cfg: GPTConfig, repeat: int) -> dict:
    torch.manual_seed(0)
    model = GPT(cfg)
    tensors = list({id(p): p for p in model.parameters()}.values())
    for p in tensors:
        p.grad = torch.randn_like(p)
    out = {
        "checksum": median_ms(lambda: torch.stack([probe._checksum(p).long() for p in tensors]).tolist(), repeat),
        "grad norms": median_ms(lambda: probe._norms([p.grad for p in tensors]), repeat),
        "params()": median_ms(lambda: probe.params(model), repeat),
        "old grad norms": median_ms(lambda: [float(p.grad.float().norm()) for p in tensors], repeat),
    }
    n = sum(p.numel() for p in tensors)
    print(f"{label}: {n / 1e6:.2f} M parameters in {len(tensors)} tensors")
    for k, v in out.items():
        print(f"  {k:15s} {v:9.2f} ms/snapshot")
    return out


def step_ms(repeat: int) -> float:
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    opt = model.configure_optimizers(1e-3, 0.1, (0.9, 0.95))
    x = torch.randint(0, 256, (16, 64))

    def step():
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, x)
        loss.backward()
        opt.step()

    return median_ms(step, max(repeat, 20))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--small-only", action="store_true", help="skip the GPT-2-small-sized model")
    args = ap.parse_args()
    torch.set_num_threads(1)
    small = measure("default GPT", GPTConfig(), args.repeat)
    step = step_ms(args.repeat)
    print(f"  one training step of it: {step:.2f} ms; checksum per snapshot = {small['checksum'] / step:.3f} steps")
    if not args.small_only:
        measure("GPT-2-small-sized GPT", GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50304,
                                                   block_size=1024), args.repeat)


if __name__ == "__main__":
    main()
