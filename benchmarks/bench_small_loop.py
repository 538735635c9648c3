"""The Monitor's own cost on a small, fast loop (issue 34): a ~5 ms step.

The loop is written for this benchmark, not taken from the project's GPT or the zoo:
a character-level Transformer (``nn.TransformerEncoderLayer``, pre-norm, causal mask)
trained on real text (the standard library's ``difflib.py``), AdamW with two param
groups (weight decay on matrices only), ``clip_grad_norm_``, a linear warm-up then
cosine schedule (``LambdaLR``), 1 thread.

Each configuration runs in a fresh process (as a user's job does: the census's first
walk, imports and the start snapshot happen once per process), configurations
interleaved in rounds; per process: 20 warm-up steps, then ``Monitor()`` (not in
"plain"), then ``--steps`` steps timed with ``time.process_time()`` (CPU time of the
process: optcheck's work on other threads counts too) and ``time.perf_counter()``.
The ratio is each configuration's loop CPU time over the same round's plain loop.
The Monitor's own figures come from its ``summary.json`` fields: ``cost.steps``
(its hooks' time per step, snapshots left out), ``cost.snapshots`` (each snapshot,
the start one first) and ``Monitor()``'s own time (CPU and wall).

    python benchmarks/bench_small_loop.py --steps 1000 --rounds 5
    python benchmarks/bench_small_loop.py --components auto --steps 1000   # where the Monitor's time goes
    PYTHONPATH=/other/checkout python benchmarks/bench_small_loop.py ...   # another optcheck

Configurations: ``plain``; ``auto`` (``Monitor(every=100)``: every probe,
``hazards="auto"``, the default); ``off`` (``Monitor(every=100, hazards=False)``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

CONFIGS = {"plain": None, "auto": {"hazards": "auto"}, "off": {"hazards": False}}
SEQ, BATCH, WIDTH, LAYERS, HEADS = 32, 8, 64, 2, 4


def child(config: str, steps: int, every: int, out: str) -> dict:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(0)
    raw = (Path(sysconfig.get_paths()["stdlib"]) / "difflib.py").read_bytes()
    data = torch.tensor(list(raw), dtype=torch.long)

    class CharTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(256, WIDTH)
            self.pos = nn.Parameter(torch.zeros(SEQ, WIDTH))
            layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True,
                                               norm_first=True)
            self.body = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(WIDTH)
            self.out = nn.Linear(WIDTH, 256)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ))

        def forward(self, x):
            h = self.tok(x) + self.pos
            return self.out(self.norm(self.body(h, mask=self.mask, is_causal=True)))

    model = CharTransformer()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and n != "pos"]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and n != "pos")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95))
    total = steps + 20
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    g = torch.Generator().manual_seed(0)

    def step():
        i = torch.randint(0, len(data) - SEQ - 1, (BATCH,), generator=g)
        x = torch.stack([data[j:j + SEQ] for j in i.tolist()])
        y = torch.stack([data[j + 1:j + SEQ + 1] for j in i.tolist()])
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        return loss

    for _ in range(20):
        step()
    mon, ctor_cpu, ctor_wall, import_cpu = None, 0.0, 0.0, 0.0
    if CONFIGS[config] is not None:
        c0 = time.process_time()
        import optcheck

        Monitor = optcheck.Monitor  # (its modules are imported here, once per process)
        import_cpu = time.process_time() - c0
        c0, t0 = time.process_time(), time.perf_counter()
        mon = Monitor(model, opt, every=every, out=out, on_finding="ignore", ignore_config=False, **CONFIGS[config])
        ctor_cpu, ctor_wall = time.process_time() - c0, time.perf_counter() - t0
    prof = None
    if os.environ.get("BENCH_PROFILE"):  # cProfile of the timed loop into that file (not for timings)
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        if _ON_STEP is None:
            loss = step()
        else:
            t = time.thread_time_ns()
            loss = step()
            _ON_STEP(time.thread_time_ns() - t, mon)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.environ["BENCH_PROFILE"])
    res = {"config": config, "cpu_s": cpu, "wall_s": wall, "ctor_cpu_s": ctor_cpu, "ctor_wall_s": ctor_wall,
           "import_cpu_s": import_cpu,
           "loss": loss.item(), "params": len(list(model.parameters()))}
    if mon is not None:
        sm = mon.close()
        res.update(own_us=sm["cost"]["steps"]["mean_us"], findings=len(mon.findings),
                   snapshots=sm["cost"]["snapshots"], hazards=sm.get("hazards"))
    return res


def components(config: str, steps: int, every: int) -> None:
    """Each piece's CPU time per call inside the running loop (``time.thread_time_ns``
    around it: cache effects included), median over the steps; the snapshots (median
    each, amortised at ``every``); armed steps against unarmed ones (median step each)."""
    import torch

    import optcheck
    from optcheck.run import sequencer

    times: dict[str, list[int]] = {}

    def timed(fn, label):
        def wrapper(*a, **k):
            t = time.thread_time_ns()
            try:
                return fn(*a, **k)
            finally:
                times.setdefault(label, []).append(time.thread_time_ns() - t)
        return wrapper

    from optcheck.drivers.monitor import Monitor
    from optcheck.pytorch.grad_clear import GradClearProbe
    from optcheck.pytorch.hazards import HazardProbes
    from optcheck.pytorch.monitor_hooks import ClipNorm

    real_monitor = optcheck.Monitor
    saved = []
    for cls, name, label in ((Monitor, "before_backward", "Monitor.before_backward (loss, hazards' loss check, arrival)"),
                             (Monitor, "after_backward", "Monitor.after_backward (arrival, hazards' judgment)"),
                             (Monitor, "_pre_step", "Monitor._pre_step (identity check; gradients' NaN/Inf)"),
                             (Monitor, "_post_step", "Monitor._post_step (step end, step context; no snapshot)"),
                             (GradClearProbe, "_before_step", "GradClearProbe._before_step (OC207)"),
                             (GradClearProbe, "_after_step", "GradClearProbe._after_step (OC204, OC208)"),
                             (HazardProbes, "_before_step", "HazardProbes._before_step"),
                             (HazardProbes, "_after_step", "HazardProbes._after_step (arrival judged)"),
                             (ClipNorm, "record", "ClipNorm.record (the clip total kept)")):
        saved.append((cls, name, cls.__dict__[name]))
        setattr(cls, name, timed(cls.__dict__[name], label))

    take = sequencer.Sequencer.take
    sequencer.Sequencer.take = timed(take, "snapshot")
    per_step: list[int] = []
    armed: list[bool] = []
    global _ON_STEP
    _ON_STEP = lambda ns, mon: (per_step.append(ns), armed.append(bool(getattr(mon.hazards, "armed", False))))
    try:
        child(config, steps, every, None)
    finally:
        optcheck.Monitor, sequencer.Sequencer.take = real_monitor, take
        for cls, name, fn in saved:
            setattr(cls, name, fn)
    print(f"{config}: {steps} steps, every={every}, 1 thread, load {os.getloadavg()[0]:.2f}")
    total = 0.0
    for label, ts in times.items():
        if label == "snapshot":
            continue
        us = statistics.median(ts) / 1e3 * len(ts) / steps
        total += us
        print(f"  {label:84s} {us:7.1f} µs/step")
    snaps = times.get("snapshot", [])[1:]  # (the first is Monitor()'s start snapshot)
    if snaps:
        us = statistics.median(snaps) / 1e3 / every
        total += us
        print(f"  {'snapshots: median ' + f'{statistics.median(snaps) / 1e6:.2f} ms, one per every steps':84s} "
              f"{us:7.1f} µs/step")
    on = [t for t, a in zip(per_step, armed) if a]
    off = [t for t, a in zip(per_step, armed) if not a]
    if on and off:
        extra = (statistics.median(on) - statistics.median(off)) / 1e3
        us = extra * len(on) / len(per_step)
        total += us
        print(f"  {f'armed steps: {len(on)} of {len(per_step)}, each {extra:.0f} µs over an unarmed one':84s} "
              f"{us:7.1f} µs/step")
    print(f"  {'total':84s} {total:7.1f} µs/step; unarmed step median {statistics.median(off or per_step) / 1e3:.0f} µs")


_ON_STEP = None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--configs", default="plain,auto,off")
    ap.add_argument("--baseline-tree", help="another optcheck checkout: its auto and off run in the same rounds "
                                            "(auto@base, off@base)")
    ap.add_argument("--components", metavar="CONFIG", help="time each piece of the Monitor's per-step work "
                                                             "inside the loop (auto or off), in this process")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.steps, a.every, a.out)))
        return
    if a.components:
        components(a.components, a.steps, a.every)
        return
    import tempfile

    import optcheck

    configs = a.configs.split(",")
    if a.baseline_tree:
        configs += [f"{c}@base" for c in configs if c != "plain"]
    print(f"optcheck from {Path(optcheck.__file__).parent.parent}; {a.steps} steps, every={a.every}, "
          f"{a.rounds} rounds; load {os.getloadavg()[0]:.2f} at start")
    rows: dict[str, list[dict]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for c in configs:
                out = str(Path(tmp) / f"{c}-{r}")
                name, _, tree = c.partition("@")
                env = dict(os.environ)
                if tree:
                    env["PYTHONPATH"] = str(Path(a.baseline_tree).resolve())
                p = subprocess.run([sys.executable, __file__, "--child", name, "--steps", str(a.steps), "--every",
                                    str(a.every), "--out", out], capture_output=True, text=True, check=True, env=env)
                rows[c].append(json.loads(p.stdout.strip().splitlines()[-1]))
    print(f"load {os.getloadavg()[0]:.2f} at end")
    base = rows.get("plain")
    n = rows[configs[0]][0]["params"]
    print(f"{n} parameter tensors")
    print("| configuration | plain ms/step | CPU ratio, median (min-max) | wall ratio, median | own µs/step | "
          "Monitor() CPU s (its start snapshot) | snapshots ms, median |")
    print("|---|---|---|---|---|---|---|")
    for c in configs:
        rs = rows[c]
        if base and c != "plain":
            cpu = sorted(x["cpu_s"] / b["cpu_s"] for x, b in zip(rs, base))
            wall = sorted(x["wall_s"] / b["wall_s"] for x, b in zip(rs, base))
            ratio = f"{statistics.median(cpu):.3f}x ({cpu[0]:.3f}-{cpu[-1]:.3f})"
            wr = f"{statistics.median(wall):.3f}x"
        else:
            ratio = wr = "1"
        ms = statistics.median(x["cpu_s"] for x in (base or rs)) / a.steps * 1e3
        own = statistics.median(x["own_us"] for x in rs) if "own_us" in rs[0] else None
        ctor = statistics.median(x["ctor_cpu_s"] for x in rs)
        snaps = [x.get("snapshots") or {} for x in rs]
        med = statistics.median(s.get("median_s", 0) or 0 for s in snaps) * 1e3 if "own_us" in rs[0] else None
        print(f"| {c} | {ms:.2f} | {ratio} | {wr} | {'-' if own is None else f'{own:.0f}'} | {ctor:.3f} | "
              f"{'-' if med is None else f'{med:.2f}'} |")


if __name__ == "__main__":
    main()
