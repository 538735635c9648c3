"""optcheck's own per-step work with the hazard probes off, item by item.

Times each piece of what ``optcheck.Monitor(hazards=False)`` (and the soak worker,
which shares the gradient probe and the pre-step check) does per optimizer step and
per ``backward()``, in isolation: CPU time per call (``time.thread_time``), the
minimum over 7 repeats, 1 thread. The zoo's GPT-ish model (``MiniGPT`` of
``tests/integration/monitor_zoo.py``, 28 parameter tensors) is the model; the
per-step column multiplies by the calls of one step of the zoo's loop (4
``backward()`` per step) and of the soak (1). The gradient hooks are timed as the
difference of ``backward()`` over 200 small leaves with and without
:class:`optcheck.pytorch.grad_clear.GradClearProbe` (they run inside autograd, so
they cannot be timed from Python one by one).

Run it against another checkout to compare (``PYTHONPATH`` decides which optcheck
is imported; the header names it)::

    python benchmarks/bench_step_cost.py
    PYTHONPATH=/path/to/other/checkout python benchmarks/bench_step_cost.py
"""

from __future__ import annotations

import sys
import time
import timeit
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))

from monitor_zoo import MiniGPT  # noqa: E402

import optcheck  # noqa: E402
from optcheck.pytorch import monitor_hooks, probe  # noqa: E402
from optcheck.pytorch.grad_clear import GradClearProbe  # noqa: E402

LEAVES = 200


def per_call(f, n: int = 5000) -> float:
    """CPU µs per call of ``f``: minimum over 7 repeats of ``n`` calls."""
    f()
    return min(timeit.repeat(f, number=n, repeat=7, timer=time.thread_time)) / n * 1e6


def hook_cost() -> float:
    """CPU µs the gradient probe's hooks add per parameter per ``backward()``."""
    best = {}
    for mode in ("none", "probe") * 3:
        ps = [torch.zeros(4, requires_grad=True) for _ in range(LEAVES)]
        opt = torch.optim.SGD(ps, lr=0.0)
        gp = GradClearProbe(opt) if mode == "probe" else None
        ts = []
        for _ in range(200):
            loss = torch.stack([p.sum() for p in ps]).sum()
            t = time.thread_time_ns()
            loss.backward()
            ts.append(time.thread_time_ns() - t)
            for p in ps:
                p.grad = None
            if gp is not None:
                gp._after_step(opt, (), {})  # what step() does: a new step's record
        if gp is not None:
            gp.remove()
        ts.sort()
        best[mode] = min(best.get(mode, float("inf")), ts[len(ts) // 4] / 1e3 / LEAVES)
    return best["probe"] - best["none"]


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MiniGPT()
    opt = torch.optim.AdamW(model.parameters())
    n_params = len(list(model.parameters()))
    x = torch.randint(0, 256, (4, 32))
    mon = optcheck.Monitor(model, opt, every=10**9, hazards=False, on_finding="ignore", ignore_config=False)
    for _ in range(2):  # gradients and optimizer state in place, as in a running loop
        _, loss = model(x, x)
        loss.backward()
        opt.step()
    _, loss = model(x, x)
    loss.backward()
    rows = []  # (item, µs per call, calls per zoo step, calls per soak step)
    rows.append(("gradient hooks (grad_clear), per parameter per backward()", hook_cost(), 4 * n_params, n_params))
    rows.append(("pre-step check: probe.fingerprint", per_call(lambda: probe.fingerprint(model, opt)), 0, 1))
    rows.append(("Monitor._pre_step (the pre-step check)", per_call(lambda: mon._pre_step(opt, (), {})), 1, 0))
    rows.append(("GradClearProbe._before_step", per_call(lambda: mon.grad_clear._before_step(opt, (), {})), 1, 1))
    rows.append(("Monitor._post_step (no snapshot due)", per_call(lambda: mon._post_step(opt, (), {})), 1, 0))
    rows.append(("GradClearProbe._after_step", per_call(lambda: mon.grad_clear._after_step(opt, (), {})), 1, 1))
    real = dict(monitor_hooks._ORIG)
    try:  # the wrappers alone: the original backward replaced by a no-op
        monitor_hooks._ORIG["autograd"] = lambda *a, **k: None
        monitor_hooks._ORIG["tensor"] = lambda *a, **k: torch.autograd.backward(*a, **k)  # as Tensor.backward
        root = loss.detach().requires_grad_() * 1
        rows.append(("backward wrappers (Tensor.backward + autograd.backward)",
                     per_call(lambda: torch.Tensor.backward(root)), 4, 0))
        rows.append(("  of which Monitor.before_backward", per_call(lambda: mon.before_backward([root], None)), 0, 0))
        rows.append(("  of which Monitor.after_backward", per_call(mon.after_backward), 0, 0))
    finally:
        monitor_hooks._ORIG.update(real)
        mon._backwards = 0
    mon.close()
    print(f"optcheck from {Path(optcheck.__file__).parent.parent}; torch {torch.__version__}; 1 thread; "
          f"MiniGPT ({n_params} parameter tensors); CPU time, min of 7 repeats")
    print(f"{'item':62} {'us/call':>8} {'zoo us/step':>12} {'soak us/step':>13}")
    zoo = soak = 0.0
    for item, us, nz, ns in rows:
        zoo, soak = zoo + us * nz, soak + us * ns
        print(f"{item:62} {us:8.2f} {us * nz:12.1f} {us * ns:13.1f}")
    print(f"{'total':62} {'':8} {zoo:12.1f} {soak:13.1f}")


if __name__ == "__main__":
    main()
