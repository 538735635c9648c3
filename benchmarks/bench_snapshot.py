"""What one PyTorch snapshot costs, against the floors of one read of what it reads.

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
- ``whole snapshot``: what the soak and ``optcheck.Monitor`` take after a step,
  census aside: ``TorchProbe.snapshot_body()`` (``optcheck/pytorch/monitor_hooks.py``,
  the same three calls as ``TorchBackend.snapshot_body``), i.e. the body, the hazard
  probes' drain (its NaN/Inf check of parameters and optimizer state: OC501) and
  the gradient-clear probe's drain, with real ``HazardProbes`` and ``GradClearProbe``
  on the model, versions moved as after a step;
- ``floor``: the fastest of the honest one-pass reads of every unique gradient's
  memory (one ``torch._foreach_norm`` over them; an int32 sum over each one's
  flat view), ``floor, values + grads`` (one ``torch._foreach_norm`` over both:
  one read of all the memory the body's fields depend on) and ``floor, everything
  read`` (one ``torch._foreach_norm`` over values, gradients and every floating
  optimizer-state tensor: what the whole snapshot must read, ``exp_avg`` and
  ``exp_avg_sq`` for AdamW);
- ``census``: ``probe.tensor_census()``, after the first census of the process
  (timed once, on its own row) and with ``--junk`` unrelated Python objects alive
  (dicts, as an imported library leaves behind);
- ``JSON line``: the bytes of one ``snapshots.jsonl`` line (``optcheck.record.snapshot.dumps``);
- with ``--monitor N``: N training steps of the GPT-2-small shape (batch 1 × 64
  tokens, AdamW) under ``optcheck.Monitor(every=2)``: the snapshot cost it reports in
  ``summary.json`` (``cost``, wall time) against its median step, and in CPU time all
  the work of one cadence snapshot against the median step, both scaled to ``--every 100``.

Prints one table: median and [min–max] ms over the repeats; the ratios the goals
are stated in (whole snapshot or body / a floor) are computed per repeat, then summarised
the same way.
CPU time of the process (``time.process_time``; with one torch thread it is the
wall time of an idle machine, and far less disturbed by other processes on a shared
one); still noisy there: read the ratios.

Runs against an older optcheck too (``PYTHONPATH=<old checkout> python
benchmarks/bench_snapshot.py``): the before column of a before/after table.

    python benchmarks/bench_snapshot.py --repeat 5 [--small-only] [--junk 1000000] [--monitor 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from optcheck.pytorch import probe
from optcheck.pytorch.gpt import GPT, GPTConfig
from optcheck.pytorch.grad_clear import GradClearProbe
from optcheck.pytorch.hazards import HazardProbes
from optcheck.pytorch.monitor_hooks import TorchProbe
from optcheck.record.snapshot import assemble, dumps

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


def floors(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, float]:
    tensors = list({id(p): p for p in model.parameters()}.values())
    grads = [p.grad for p in tensors]
    values = [p.detach() for p in tensors]
    state = [v for p in tensors for v in opt.state.get(p, {}).values()
             if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0]
    one_pass = {
        "foreach_norm": lambda: torch.stack(torch._foreach_norm(grads)).tolist(),
        "int32 sum": lambda: torch.stack([g.reshape(-1).view(torch.int32).sum(dtype=torch.int32)
                                          for g in grads]).tolist(),
    }
    for fn in one_pass.values():
        fn()  # warm-up
    out = {"floor": min(timed(fn) for fn in one_pass.values())}
    out["floor, values + grads"] = timed(lambda: torch.stack(torch._foreach_norm(values + grads)).tolist())
    out["floor, everything read"] = timed(lambda: torch.stack(torch._foreach_norm(values + grads + state)).tolist())
    return out


def measure(model: torch.nn.Module, opt: torch.optim.Optimizer, whole: TorchProbe) -> dict[str, float]:
    params = [p for p in {id(p): p for p in model.parameters()}.values()]
    out = floors(model, opt)
    out["pre-step check"] = timed(lambda: probe.fingerprint(model, opt), 200)
    with torch.no_grad():
        torch._foreach_add_(params, 0.0)  # an in-place write, as foreach AdamW does: versions move
    out["snapshot body"] = timed(lambda: probe.snapshot_body(model, opt, census=False))
    out["body, checksum read too"] = timed(lambda: probe.snapshot_body(model, opt, census=False))
    with torch.no_grad():
        torch._foreach_add_(params, 0.0)
    whole.snapshots = 1  # not a census snapshot (that is the census row)
    out["whole snapshot"] = timed(whole.snapshot_body)
    out["census"] = timed(probe.tensor_census)
    body = probe.snapshot_body(model, opt, census=True)
    snap = assemble(backend="pytorch", run="bench", step=100, phase="post-step", trigger="cadence", body=body,
                    events=[], loss=3.0, elapsed_s=1.0, step_time_s=0.01, versions=probe.versions(), threads=1)
    out["JSON line"] = len((dumps(snap) + "\n").encode("utf-8"))  # bytes, not ms
    out["body / floor"] = out["snapshot body"] / out["floor"]
    out["body / floor, values + grads"] = out["snapshot body"] / out["floor, values + grads"]
    out["whole / floor"] = out["whole snapshot"] / out["floor"]
    out["whole / floor, everything read"] = out["whole snapshot"] / out["floor, everything read"]
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
        ("whole snapshot", "ms"), ("floor", "ms"), ("floor, values + grads", "ms"),
        ("floor, everything read", "ms"), ("body / floor", "x"), ("body / floor, values + grads", "x"),
        ("whole / floor", "x"), ("whole / floor, everything read", "x"), ("census", "ms"), ("JSON line", "B")]


def summary(xs: list[float], unit: str = "ms") -> str:
    if unit == "B":
        return f"{statistics.median(xs):9,.0f} [{min(xs):,.0f}–{max(xs):,.0f}]"
    return f"{statistics.median(xs):9.3f} [{min(xs):.3f}–{max(xs):.3f}]"


def monitor_run(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, every: int = 2) -> dict:
    """``steps`` training steps of ``model`` (batch 1 × 64 tokens) under
    ``optcheck.Monitor(every=every)``: its ``summary.json`` ``cost`` (wall time, what a
    user reads) and the median wall time of the steps without a snapshot (step 1, which
    allocates the optimizer state, left out); and in CPU time (less disturbed by other
    processes on a shared machine) the median of those steps and of everything the
    Monitor does per cadence snapshot (``Sequencer.take``: body, hazard and grad-clear
    drains, assembly, the rule checks and the writes; the start snapshot, which holds
    the Monitor's first census, left out)."""
    import json
    import tempfile

    import optcheck

    x = torch.randint(0, model.config.vocab_size, (1, 64))
    wall, cpu, take_cpu = [], [], []
    with tempfile.TemporaryDirectory() as d:
        with optcheck.Monitor(model, opt, every=every, out=f"{d}/run", on_finding="log") as mon:
            take = mon.seq.take

            def timed_take(*a, **k):
                c0 = time.process_time()
                try:
                    return take(*a, **k)
                finally:
                    take_cpu.append(time.process_time() - c0)

            mon.seq.take = timed_take
            for i in range(1, steps + 1):
                t0, c0 = time.perf_counter(), time.process_time()
                opt.zero_grad(set_to_none=True)
                _, loss = model(x, x)
                loss.backward()
                opt.step()  # the Monitor's snapshot runs in the step's post-hook
                if i > 1 and i % every:
                    cpu.append(time.process_time() - c0)
                    wall.append(time.perf_counter() - t0)
        with open(f"{d}/run/summary.json", encoding="utf-8") as f:
            cost = json.load(f)["cost"]
    return {"cost": cost, "step_s": statistics.median(wall), "step_cpu_s": statistics.median(cpu),
            "snapshot_cpu_s": statistics.median(take_cpu[:steps // every])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--small-only", action="store_true", help="skip the GPT-2-small shape")
    ap.add_argument("--alternatives", action="store_true",
                    help="also time a training step under a TorchDispatchMode (counting tensors at creation)")
    ap.add_argument("--junk", type=int, default=1_000_000, help="unrelated objects alive for the census rows")
    ap.add_argument("--monitor", type=int, default=0, metavar="N",
                    help="also run N steps of the GPT-2-small shape under optcheck.Monitor(every=2)")
    args = ap.parse_args()
    if args.monitor and args.small_only:
        ap.error("--monitor runs the GPT-2-small shape: drop --small-only")
    if args.monitor and args.monitor < 3:
        ap.error("--monitor needs at least 3 steps (step 1 is left out, every=2)")
    torch.set_num_threads(1)
    models = {"default GPT": trained(GPTConfig())}
    if not args.small_only:
        models["GPT-2 small"] = trained(GPT2_SMALL)
    runs: dict[str, list[dict]] = {k: [] for k in models}
    probe.tensor_census()  # the process's first census (timed below, with the junk)
    hazards = {k: HazardProbes(m, o) for k, (m, o) in models.items()}
    clears = {k: GradClearProbe(o) for k, (_, o) in models.items()}
    wholes = {k: TorchProbe(m, o, hazards[k], clears[k]) for k, (m, o) in models.items()}
    for _ in range(args.repeat):
        for label, (model, opt) in models.items():
            runs[label].append(measure(model, opt, wholes[label]))
    for k in models:  # the training-step rows below time a loop without optcheck's hooks
        hazards[k].remove()
        clears[k].remove()
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
        print(f"{row:32s} {unit:4s} " + " ".join(f"{summary([r[row] for r in runs[k]], unit):>28s}" for k in models))
    print(f"{'census, ' + format(args.junk, ',') + ' unrelated objects':32s} ms   "
          f"{summary(later):>28s}  (both models alive; first census of the process {first:.1f} ms, "
          f"the next {second:.1f} ms)")
    for k, v in steps.items():
        print(f"{'training step, ' + ('heap ' if 'frozen' in k else '') + k:32s} ms   {summary(v):>28s}"
              f"  (default GPT, batch 16 x 64)")
    step = statistics.median(steps["frozen"])
    body = statistics.median(r["whole snapshot"] for r in runs["default GPT"])
    cen = statistics.median(r["census"] for r in runs["default GPT"])
    print(f"default GPT at --every 100 (census every 10th snapshot): snapshot work "
          f"{(body + cen / 10) / (100 * step) * 100:.2f} % of training time")
    if args.monitor and "GPT-2 small" in models:
        got = monitor_run(*models["GPT-2 small"], args.monitor)
        snaps, checks = got["cost"]["snapshots"], got["cost"]["checks"]
        work = snaps["median_s"] + (checks["median_s"] or 0.0)
        print(f"GPT-2 small under optcheck.Monitor(every=2), {args.monitor} steps of batch 1 x 64, wall time: step "
              f"{got['step_s']:.2f} s (median, steps without a snapshot); summary.json cost: {snaps['count']} "
              f"snapshots, median {snaps['median_s'] * 1e3:.0f} ms (total {snaps['total_s']:.2f} s), rule checks "
              f"median {(checks['median_s'] or 0) * 1e3:.1f} ms; at --every 100: "
              f"{work / (100 * got['step_s']) * 100:.2f} % of training time")
        print(f"  CPU time: step {got['step_cpu_s']:.2f} s, all the work of one cadence snapshot (body, drains, "
              f"rule checks, writes) {got['snapshot_cpu_s'] * 1e3:.0f} ms; at --every 100: "
              f"{got['snapshot_cpu_s'] / (100 * got['step_cpu_s']) * 100:.2f} % of training time")


if __name__ == "__main__":
    main()
