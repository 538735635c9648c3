"""Who pays for the gradients' Python objects? (issue 34, docs/guide/cost.md "part 7")

With ``zero_grad(set_to_none=True)`` every backward pass makes new gradient tensors, and the
first Python read of each ``.grad`` builds its Python object; later reads return that object.
Without optcheck the user's ``clip_grad_norm_`` (or ``optimizer.step()``) reads first and pays.
Under ``optcheck.Monitor`` the gradient-flow probe reads them right after backward, so the
Monitor's own timer (``summary.json`` ``cost.steps``) carries this share, and the user's clip
gets cheaper by about as much. It is moved, not added.

On the small loop of ``bench_small_loop.py``, each step alternately (interleaved):

- ``clip alone``: backward, then the user's ``clip_grad_norm_`` timed;
- ``read, then clip``: backward, one ``list(map(attrgetter("grad"), params))`` timed (what a
  watcher does first), a second such read timed, then the clip timed.

Medians in µs over ``--steps`` steps of each kind, 1 thread, wall time (``perf_counter_ns``)::

    python benchmarks/bench_grad_objects.py --steps 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from operator import attrgetter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_small_loop import BATCH, SEQ, build_loop  # noqa: E402

_GRAD = attrgetter("grad")


def measure(steps: int) -> dict[str, float]:
    """Median µs of each timed piece (see the module docstring) over ``steps`` steps of each kind."""
    import torch
    import torch.nn.functional as F

    model, opt, step = build_loop(2 * steps + 10)
    for _ in range(3):
        step()
    params = list(model.parameters())
    g = torch.Generator().manual_seed(1)
    times: dict[str, list[int]] = {"clip alone": [], "first read": [], "second read": [], "clip after a read": []}
    for i in range(2 * steps):
        x = torch.randint(0, 256, (BATCH, SEQ), generator=g)
        y = torch.randint(0, 256, (BATCH, SEQ), generator=g)
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if i % 2:
            t0 = time.perf_counter_ns()
            first = list(map(_GRAD, params))
            t1 = time.perf_counter_ns()
            second = list(map(_GRAD, params))
            t2 = time.perf_counter_ns()
            del first, second
            times["first read"].append(t1 - t0)
            times["second read"].append(t2 - t1)
        t3 = time.perf_counter_ns()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        times["clip after a read" if i % 2 else "clip alone"].append(time.perf_counter_ns() - t3)
        opt.step()
    out = {k: statistics.median(v) / 1e3 for k, v in times.items()}
    out["tensors"] = len(params)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="steps of each kind (interleaved)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    got = measure(args.steps)
    print(f"{args.steps} steps of each kind, {got['tensors']} gradient tensors, 1 thread, medians")
    print("| piece | µs |")
    print("|---|---:|")
    for k in ("first read", "second read", "clip alone", "clip after a read"):
        print(f"| {k} | {got[k]:.1f} |")
    print(f"| first read less second, per tensor | {(got['first read'] - got['second read']) / got['tensors']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
