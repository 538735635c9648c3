"""What one PyTorch snapshot costs, against the floor of one read of the gradients.

Builds, from a config (nothing downloaded), the default soak GPT (2 layers, 64 wide)
and the GPT-2-small shape (12 layers, 768 wide, 12 heads, vocab 50304, context
1024, ``wte`` tied to ``lm_head``: 124.5 M parameters in 148 tensors), runs one real
training step of each (AdamW, so the optimizer state exists and every parameter has
a gradient), then times with one torch thread, ``--repeat`` times, interleaved:

- ``pre-step check``: ``probe.fingerprint`` (what the worker and ``optcheck.Monitor``
  compare before every ``optimizer.step()``), mean of 200 calls;
- ``snapshot body``: ``probe.snapshot_body(census=False)`` after the parameters were
  written in place (what a for-loop or foreach optimizer leaves: version counters
  moved; a fused one moves the step counts instead, same cost), and ``body,
  checksum read too`` (the same call again: no signal moved, so the values'
  checksum is read as well, as for a fused SGD or ``p.data`` writes);
- ``floor``: the fastest of the honest one-pass reads of every unique gradient's
  memory (one ``torch._foreach_norm`` over them; an int32 sum over each one's
  flat view), and ``floor, values + grads`` (one ``torch._foreach_norm`` over both:
  one read of all the memory the body's fields depend on);
- ``census``: ``probe.tensor_census()``, after the first census of the process
  (timed once, on its own row) and with ``--junk`` unrelated Python objects alive
  (dicts, as an imported library leaves behind);
- ``JSON line``: the bytes of one ``snapshots.jsonl`` line (``optcheck.snapshot.dumps``).

Prints one table: median and [min–max] ms over the repeats; the ratios the goals
are stated in (body / floor) are computed per repeat, then summarised the same way.
CPU time of the process (``time.process_time``; with one torch thread it is the
wall time of an idle machine, and far less disturbed by other processes on a shared
one); still noisy there: read the ratios.

    python benchmarks/bench_snapshot.py --repeat 5 [--small-only] [--junk 1000000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from optcheck.pytorch import probe
from optcheck.pytorch.gpt import GPT, GPTConfig
from optcheck.snapshot import assemble, dumps

GPT2_SMALL = GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=1024)


def trained(cfg: GPTConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model after one real AdamW step (batch 2 × 16 tokens), gradients kept."""
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = model.configure_optimizers(1e-4, 0.1, (0.9, 0.95))
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    _, loss = model(x, x)
    loss.backward()
    opt.step()
    return model, opt


def timed(fn, calls: int = 1) -> float:
    """Milliseconds per call of ``fn`` (mean of ``calls`` back-to-back calls)."""
    t0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t0) / calls * 1e3


def floors(model: torch.nn.Module) -> dict[str, float]:
    tensors = list({id(p): p for p in model.parameters()}.values())
    grads = [p.grad for p in tensors]
    values = [p.detach() for p in tensors]
    one_pass = {
        "foreach_norm": lambda: torch.stack(torch._foreach_norm(grads)).tolist(),
        "int32 sum": lambda: torch.stack([g.reshape(-1).view(torch.int32).sum(dtype=torch.int32)
                                          for g in grads]).tolist(),
    }
    for fn in one_pass.values():
        fn()  # warm-up
    out = {"floor": min(timed(fn) for fn in one_pass.values())}
    out["floor, values + grads"] = timed(lambda: torch.stack(torch._foreach_norm(values + grads)).tolist())
    return out


def measure(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, float]:
    params = [p for p in {id(p): p for p in model.parameters()}.values()]
    out = floors(model)
    out["pre-step check"] = timed(lambda: probe.fingerprint(model, opt), 200)
    with torch.no_grad():
        torch._foreach_add_(params, 0.0)  # an in-place write, as foreach AdamW does: versions move
    out["snapshot body"] = timed(lambda: probe.snapshot_body(model, opt, census=False))
    out["body, checksum read too"] = timed(lambda: probe.snapshot_body(model, opt, census=False))
    out["census"] = timed(probe.tensor_census)
    body = probe.snapshot_body(model, opt, census=True)
    snap = assemble(backend="pytorch", run="bench", step=100, phase="post-step", trigger="cadence", body=body,
                    events=[], loss=3.0, elapsed_s=1.0, step_time_s=0.01, versions=probe.versions(), threads=1)
    out["JSON line"] = len((dumps(snap) + "\n").encode("utf-8")) / 1e3  # kB, not ms
    out["body / floor"] = out["snapshot body"] / out["floor"]
    out["body / floor, values + grads"] = out["snapshot body"] / out["floor, values + grads"]
    return out


def release() -> None:
    """Unfreeze what the census froze (nothing to do on an optcheck before the frozen census,
    which this benchmark also runs on: ``PYTHONPATH=<old checkout> python benchmarks/...``)."""
    try:
        from optcheck.pytorch import census
    except ImportError:
        return
    census.release()


def step_ms(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = 20) -> float:
    """Median ms of one training step of ``model`` (batch 16 × 64 tokens, AdamW)."""
    x = torch.randint(0, model.config.vocab_size, (16, 64))

    def step():
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, x)
        loss.backward()
        opt.step()

    step()
    return statistics.median(timed(step) for _ in range(steps))


def dispatch_mode_step_ms(model: torch.nn.Module, opt: torch.optim.Optimizer) -> float:
    """A training step under a pass-through ``TorchDispatchMode`` that counts the tensors
    each op returns: the cheapest hook that sees every tensor made (what counting live
    tensors at creation, instead of finding them through the garbage collector, costs)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        made = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            Count.made += isinstance(out, torch.Tensor)
            return out

    with Count():
        return step_ms(model, opt)


def first_census(junk: int) -> tuple[float, float, list]:
    """(ms of the process's first census, ms of the one after, the junk kept alive)."""
    kept = [{"i": i} for i in range(junk)]  # unrelated objects, alive throughout
    release()  # start again: the next census is a first one
    return timed(probe.tensor_census), timed(probe.tensor_census), kept


ROWS = [("pre-step check", "ms"), ("snapshot body", "ms"), ("body, checksum read too", "ms"),
        ("floor", "ms"), ("floor, values + grads", "ms"), ("body / floor", "x"),
        ("body / floor, values + grads", "x"), ("census", "ms"), ("JSON line", "kB")]


def summary(xs: list[float]) -> str:
    return f"{statistics.median(xs):9.3f} [{min(xs):.3f}–{max(xs):.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--small-only", action="store_true", help="skip the GPT-2-small shape")
    ap.add_argument("--alternatives", action="store_true",
                    help="also time a training step under a TorchDispatchMode (counting tensors at creation)")
    ap.add_argument("--junk", type=int, default=1_000_000, help="unrelated objects alive for the census rows")
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = {"default GPT": trained(GPTConfig())}
    if not args.small_only:
        models["GPT-2 small"] = trained(GPT2_SMALL)
    runs: dict[str, list[dict]] = {k: [] for k in models}
    probe.tensor_census()  # the process's first census (timed below, with the junk)
    for _ in range(args.repeat):
        for label, (model, opt) in models.items():
            runs[label].append(measure(model, opt))
    model, opt = models["default GPT"]
    steps: dict[str, list[float]] = {"not frozen": [], "frozen": []}
    for _ in range(args.repeat):  # the census's gc.freeze() and the training loop: before and after
        release()
        steps["not frozen"].append(step_ms(model, opt))
        probe.tensor_census()
        steps["frozen"].append(step_ms(model, opt))
    if args.alternatives:
        steps["under a counting TorchDispatchMode"] = [dispatch_mode_step_ms(model, opt) for _ in range(args.repeat)]
    first, second, _kept = first_census(args.junk)
    later = [timed(probe.tensor_census) for _ in range(args.repeat)]
    for label, (model, _) in models.items():
        n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        print(f"{label}: {n / 1e6:.2f} M parameters in {len({id(p) for p in model.parameters()})} tensors")
    print(f"torch {torch.__version__}, 1 thread, {args.repeat} repeats: median [min–max]")
    print(f"{'part':32s} {'unit':4s} " + " ".join(f"{k:>28s}" for k in models))
    for row, unit in ROWS:
        print(f"{row:32s} {unit:4s} " + " ".join(f"{summary([r[row] for r in runs[k]]):>28s}" for k in models))
    print(f"{'census, ' + format(args.junk, ',') + ' unrelated objects':32s} ms   "
          f"{summary(later):>28s}  (both models alive; first census of the process {first:.1f} ms, "
          f"the next {second:.1f} ms)")
    for k, v in steps.items():
        print(f"{'training step, ' + ('heap ' if 'frozen' in k else '') + k:32s} ms   {summary(v):>28s}"
              f"  (default GPT, batch 16 x 64)")
    step = statistics.median(steps["frozen"])
    body = statistics.median(r["snapshot body"] for r in runs["default GPT"])
    cen = statistics.median(r["census"] for r in runs["default GPT"])
    print(f"default GPT at --every 100 (census every 10th snapshot): snapshot work "
          f"{(body + cen / 10) / (100 * step) * 100:.2f} % of training time")


if __name__ == "__main__":
    main()
