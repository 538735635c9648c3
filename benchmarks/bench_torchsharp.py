"""The TorchSharp soak's cost against the same trainer's plain loop, side by side, interleaved.

For each of ``--pairs`` rounds (order alternating) it runs, each in its own process:

- **plain**: the trainer's own loop inside .NET, as a user runs it: ``OptCheck.Probe.Bench.PlainLoop``
  (dotnet/Probe/Bench.cs) constructs the trainer, calls ``Setup`` with the soak's options, and
  steps through the soak's own batches (optcheck.data.BatchSchedule, generated in one block before
  the loop): no probe, no pre-step check, no Python per step. Time: the loop's Stopwatch.
- **soak**: ``optcheck soak --backend torchsharp`` of the same trainer, options and batches, with
  every probe on (pre-step check every step, a snapshot every ``--every`` steps). Time: training
  time, the ``elapsed_s`` of the last snapshot (set-up and the runtime's start are left out of both).

It prints both times per round, the median ratio soak/plain, and the in-process ladder: the plain loop
and the worker's loop in one process, CPU time, with the stages in between, each the previous one plus
one component — ``blocks`` (Driver.StepBlock looped inside .NET: the fingerprint after each step and the
block's bookkeeping), ``call`` (the pythonnet call per block, the block's batches handed over), ``batch``
(batch generation), ``loop`` (the worker loop, snapshots left out), ``messages`` (metrics messages to
/dev/null), ``snapshots`` (the whole worker loop) — so that the components add up to the measured
difference by construction; then the same components measured apart (a fingerprint looped in .NET, a
one-step block's pythonnet call, ``BatchSchedule.fill``, the loop over blocks that do not reach .NET, a
metrics message, a snapshot taken after ``--every`` steps) and their sum against the ladder's difference; and the
worker loop's own cost measured inside one run of it (its ``train_block`` calls timed: the rest of the loop is
what the worker adds around the trainer's blocks) plus the fingerprint and the call measured apart, against the
same difference (``--in-process-only`` runs just these). By default the trainer is the TorchSharp STAND-IN
(tests/dotnet/TestLoop.cs compiled with mcs: a ~1 ms step at its sizes here, no libtorch); the output says so.
Real TorchSharp: ``--torchsharp FOLDER`` (a folder of TorchSharp.dll + libLibTorchSharp.so, docs/torchsharp.md
"Making such a folder": the worker built with mcs, libtorch from this Python's torch,
docs/torchsharp.md "Real TorchSharp here"), ``--torchsharp 0.107.0`` (builds the worker with the .NET SDK) or
``--dotnet-assembly DLL --dotnet-trainer TYPE``.

Usage: ``python benchmarks/bench_torchsharp.py [--steps 2000] [--pairs 5] [--every 100]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STAND_IN_TRAINER = "OptCheckTest.LazyTrainer"


def soak_config(args, dll: str, trainer: str):
    from optcheck.config import DataConfig, ModelConfig, RunConfig, SoakConfig, TorchSharpConfig

    return SoakConfig(model=ModelConfig(n_embd=args.n_embd, n_head=args.n_head, n_layer=args.n_layer,
                                        block_size=args.block_size),
                      data=DataConfig(batch_size=args.batch_size, val_every=0),
                      run=RunConfig(backend="torchsharp", steps=args.steps, every=args.every, seed=args.seed,
                                    threads=1),
                      torchsharp=TorchSharpConfig(runtime=args.runtime, assembly=dll, trainer=trainer))


def plain_child(args) -> None:
    """In a fresh process: load .NET and the assembly, run Bench.PlainLoop, print JSON."""
    from optcheck.data import BatchSchedule, load_corpus
    from optcheck.torchsharp_bridge import libtorch, runtime
    from optcheck.torchsharp_bridge.worker import setup_config

    cfg = soak_config(args, args.dll, args.trainer)
    corpus = load_corpus(cfg.data.path, cfg.model.vocab_size)
    sched = BatchSchedule(corpus.train.size, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed)
    batches = np.empty((cfg.run.steps, 2, cfg.data.batch_size, cfg.model.block_size), dtype=np.int64)
    for step in range(1, cfg.run.steps + 1):  # the soak's batches, made before the timed loop
        x, y = sched.batch(corpus.train, step)
        batches[step - 1, 0], batches[step - 1, 1] = x, y
    libtorch.load_native(Path(args.dll).resolve().parent)  # as the worker does: LibTorchSharp (and libtorch) first
    runtime.load(args.runtime)
    runtime.load_assembly(args.dll)
    Bench = runtime.loaded_internal_type("OptCheck.Probe.Bench")  # internal: not importable
    from System import IntPtr

    config_json = setup_config(cfg, corpus)
    secs, first, last = Bench.PlainLoop(args.trainer, config_json, IntPtr(batches.ctypes.data), cfg.run.steps,
                                        cfg.data.batch_size, cfg.model.block_size)
    print(json.dumps({"seconds": secs, "loss_first": first, "loss_last": last}))


def run_plain(args, dll: str, trainer: str) -> dict:
    cmd = [sys.executable, __file__, "--plain-child", "--dll", dll, "--trainer", trainer, *common_flags(args)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        sys.exit(f"bench_torchsharp: the plain loop failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_soak(args, dll: str, trainer: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "optcheck", "soak", "--backend", "torchsharp", "--dotnet-assembly", dll,
           "--dotnet-trainer", trainer, "--dotnet-runtime", args.runtime, "--steps", str(args.steps),
           "--every", str(args.every), "--seed", str(args.seed), "--n-embd", str(args.n_embd),
           "--n-head", str(args.n_head), "--n-layer", str(args.n_layer), "--batch-size", str(args.batch_size),
           "--block-size", str(args.block_size), "--val-every", "0", "--threads", "1", "--out", str(out), "-q"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if res.returncode not in (0, 1):
        sys.exit(f"bench_torchsharp: the soak failed (exit {res.returncode}):\n{res.stderr[-2000:]}")
    snaps = [json.loads(ln) for ln in (out / "snapshots.jsonl").read_text().splitlines() if ln.strip()]
    summary = json.loads((out / "summary.json").read_text())
    return {"seconds": snaps[-1]["elapsed_s"], "status": summary["status"], "loss_first": summary["loss_first"],
            "loss_last": summary["loss_last"]}


def common_flags(args) -> list[str]:
    return ["--steps", str(args.steps), "--every", str(args.every), "--seed", str(args.seed),
            "--n-embd", str(args.n_embd), "--n-head", str(args.n_head), "--n-layer", str(args.n_layer),
            "--batch-size", str(args.batch_size), "--block-size", str(args.block_size), "--runtime", args.runtime]


def _setup(args, dll: str, trainer: str, steps: int):
    """The soak's configuration for ``steps`` steps, its corpus and schedule, .NET and the assembly loaded into
    this process; and the first ``steps`` batches generated in one go: inputs and targets, (steps, B, T) each."""
    from optcheck.data import BatchSchedule, load_corpus
    from optcheck.torchsharp_bridge.worker import TorchSharpBackend

    cfg = soak_config(args, dll, trainer)
    cfg.run.steps = steps
    corpus = load_corpus(cfg.data.path, cfg.model.vocab_size)
    sched = BatchSchedule(corpus.train.size, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed)
    xs = np.empty((steps, cfg.data.batch_size, cfg.model.block_size), dtype=np.int64)
    ys = np.empty_like(xs)
    sched.fill(corpus.train, 1, xs, ys)
    TorchSharpBackend().setup(cfg, corpus)  # loads .NET and the assembly into this process
    return cfg, corpus, sched, xs, ys


def _block(args) -> int:
    """Steps per block as the worker cuts them on the stand-in's short steps: up to the next snapshot."""
    from optcheck.drivers.worker_loop import METRICS_BATCH

    return min(args.every, METRICS_BATCH)


def _no_snapshots(loop):
    """``loop`` with its sequencer's snapshots left out: ``take`` flushes the metrics and takes the fingerprint
    to compare against (so that blocks and metrics batches are cut where a real snapshot cuts them) and builds,
    reads and sends nothing."""
    seq = loop.seq

    def take(step: int, phase: str, trigger: str):
        if seq.flush is not None:
            seq.flush()
        seq._fp = seq.probe.fingerprint()
        seq.last_snap_step = step

    seq.take = take
    return loop


def _py_blocks(be, cfg, xs, ys, sched, corpus, block: int, fill: bool) -> None:
    """Steps 1..cfg.run.steps through ``TorchSharpBackend.train_block`` in the worker's blocks, the batches copied
    from ``xs``/``ys`` into the bound buffers or (``fill``) generated there by ``BatchSchedule.fill``."""
    from optcheck.drivers.worker_loop import BLOCK_MAX_S

    b, t = cfg.data.batch_size, cfg.model.block_size
    ref = be.fingerprint()
    first = 1
    while first <= cfg.run.steps:
        count = min(block - (first - 1) % block, cfg.run.steps - first + 1)
        bx, by = be.block_inputs(count, b, t)
        if fill:
            sched.fill(corpus.train, first, bx, by)
        else:
            bx[...] = xs[first - 1:first - 1 + count]
            by[...] = ys[first - 1:first - 1 + count]
        first += be.train_block(first, count, b, t, ref, BLOCK_MAX_S)


def breakdown(args, dll: str, trainer: str, n: int = 300, run_steps: int = 500) -> dict:
    """The per-step components, each measured on its own (none a difference of ladder stages), CPU microseconds
    of this process (``time.process_time``), median of 3: ``fingerprint`` (ProbeCore.Fingerprint looped in .NET),
    ``call`` (a Driver call from Python whose .NET side does next to nothing, + handing a block its batches, per
    block of the steps StepBlock's time budget lets run), ``batch`` (BatchSchedule.fill), ``loop`` (Loop.run over a backend whose blocks do not reach .NET,
    without snapshots or messages, less its batches), ``messages`` (a metrics message of a block's steps written
    to /dev/null, per step) and ``snapshot`` (a snapshot taken and sent to /dev/null after ``--every`` steps, the
    take() call alone, averaged over the snapshots a run of ``run_steps`` steps takes, from a fresh probe), plus
    ``net_step`` (the trainer's step) for scale."""
    import os

    from optcheck.drivers.protocol import Stream
    from optcheck.drivers.worker_loop import BLOCK_MAX_S, Loop
    from optcheck.torchsharp_bridge import runtime
    from optcheck.torchsharp_bridge.worker import TorchSharpBackend

    cfg, corpus, sched, xs, ys = _setup(args, dll, trainer, n)
    be = TorchSharpBackend()
    be.setup(cfg, corpus)
    Bench = runtime.loaded_internal_type("OptCheck.Probe.Bench")  # internal: not importable
    from System import IntPtr

    net = TorchSharpBackend()  # its own driver: Bench.StepBlocks binds it to buffers that the others never see
    net.setup(cfg, corpus)
    d, b, t, block = net.driver, cfg.data.batch_size, cfg.model.block_size, _block(args)
    px, py = IntPtr(xs.ctypes.data), IntPtr(ys.ctypes.data)
    devnull = Stream(os.open(os.devnull, os.O_WRONLY))
    res: dict[str, list[float]] = {k: [] for k in ("net_step", "fingerprint", "call", "batch", "loop", "messages",
                                                   "snapshot")}
    clock = time.process_time
    metrics = {"steps": list(range(1, block + 1)), "losses": [float(v) for v in np.linspace(4.2, 4.1, block)],
               "step_times_s": [0.000987] * block}
    for _ in range(3):
        t0 = clock()
        wall_step = Bench.TimeSteps(d, 1, px, py, b, t, n) / n
        res["net_step"].append((clock() - t0) / n)
        # steps per block as StepBlock cuts them: up to the next snapshot, or the 0.25 s budget (wall time) first
        per_block = max(1, min(block, int(BLOCK_MAX_S / wall_step) + 1))
        res.setdefault("per_block", []).append(per_block / 1e6)
        res.setdefault("guarded", []).append(float(guarded(d)) / 1e6)
        t0 = clock()
        Bench.TimeFingerprints(d, n)
        res["fingerprint"].append((clock() - t0) / n)
        # the pythonnet call of a block, without a step in it (a step's own noise is larger than the call on real
        # TorchSharp): a Driver call whose .NET side does next to nothing (TakeInStep with nothing to take), + handing
        # a block its batches
        t0 = clock()
        for i in range(n):
            bx, by = be.block_inputs(per_block, b, t)
            d.TakeInStep()
        res["call"].append((clock() - t0) / n / per_block)
        bx, by = be.block_inputs(per_block, b, t)
        t0 = clock()
        for i in range(0, n, per_block):
            sched.fill(corpus.train, i + 1, bx, by)
        res["batch"].append((clock() - t0) / (-(-n // per_block) * per_block))
        c = soak_config(args, dll, trainer)
        c.run.steps = n
        t0 = clock()
        _no_snapshots(Loop(_NoStep(be, per_block, wall_step), c, _NullStream())).run(corpus)
        res["loop"].append((clock() - t0) / n - res["batch"][-1])
        t0 = clock()
        for _ in range(n // block):
            devnull.send("metrics", **metrics)
        res["messages"].append((clock() - t0) / (n // block * block))
        # the snapshots a run of `run_steps` steps takes, where the worker takes them: a fresh probe (its first
        # read collects, then at least every 10th), each snapshot after `every` steps of its trainer (the forced .NET
        # collection, when it runs, costs more there than back to back); the take() calls alone, so that the
        # steps' own noise does not enter
        fresh = TorchSharpBackend()
        fresh.setup(c, corpus)
        seq = Loop(fresh, c, devnull).seq
        n_snap, spent = snapshots_in(run_steps, args.every), 0.0
        for _ in range(n_snap):
            Bench.TimeSteps(fresh.driver, 1, px, py, b, t, args.every)
            t0 = clock()
            seq.take(1, "post-step", "cadence")
            spent += clock() - t0
        res["snapshot"].append(spent / n_snap)
    devnull.close()
    return {k: statistics.median(v) * 1e6 for k, v in res.items()}  # per_block: steps (stored / 1e6 above)


def guarded(driver) -> bool:
    """Whether the driver's trainer is an IGuardedTrainer (a ModuleTrainer: its optimizer's zero_grad() and step()
    run the pre-step check, a fingerprint each, inside the trainer's own Step; StepBlock then reuses the step()
    one instead of taking its own, so the worker adds no fingerprint to such a trainer's step)."""
    return any(str(i.Name) == "IGuardedTrainer" for i in driver.Trainer.GetType().GetInterfaces())


class _NoStep:
    """A TorchSharpBackend whose blocks return at once without calling .NET, every step done with a constant loss
    (its fingerprint stays the cached one, as after real steps): the worker loop around the steps, measured apart.
    Its blocks end after ``per_block`` steps and report steps of ``step_s`` seconds, as the trainer's real blocks
    do (StepBlock's time budget), so that the loop runs as many blocks as it does around real steps."""

    def __init__(self, inner, per_block: int = 1 << 30, step_s: float = 0.001) -> None:
        self.inner, self.per_block, self.step_s = inner, per_block, step_s

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def train_block(self, first: int, count: int, b: int, t: int, reference: int, budget_s: float) -> int:
        self.inner._fp_valid = True
        self.count = min(count, self.per_block)
        return self.count

    def block_results(self, n: int) -> tuple[list[float], list[float]]:
        return [1.0] * n, [self.step_s] * n


class _Timed:
    """A TorchSharpBackend whose ``train_block`` calls are timed (CPU of the process): what the worker loop spends
    inside the trainer's blocks, the rest of the loop being its own cost."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.cpu = 0.0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def train_block(self, *args) -> int:
        t0 = time.process_time()
        try:
            return self.inner.train_block(*args)
        finally:
            self.cpu += time.process_time() - t0


def in_loop(args, dll: str, trainer: str, steps: int = 500, rounds: int = 3) -> dict:
    """The worker loop's own cost measured inside one run of it, free of the steps' noise: the whole worker loop
    (every probe, snapshots every ``--every``, metrics to /dev/null) with its ``train_block`` calls timed; the
    loop's CPU outside those calls is what the worker adds around the trainer's blocks (batches, the loop,
    messages, snapshots). Median over ``rounds``, microseconds per step: ``outside`` and ``inside`` (the blocks:
    the trainer's steps, the fingerprint after each, the pythonnet call)."""
    import os

    from optcheck.drivers.protocol import Stream
    from optcheck.drivers.worker_loop import Loop
    from optcheck.torchsharp_bridge.worker import TorchSharpBackend

    cfg, corpus, _sched, _xs, _ys = _setup(args, dll, trainer, 1)
    res: dict[str, list[float]] = {"outside": [], "inside": []}
    for _ in range(rounds):
        c = soak_config(args, dll, trainer)
        c.run.steps = steps
        be = TorchSharpBackend()
        be.setup(c, corpus)
        timed = _Timed(be)
        stream = Stream(os.open(os.devnull, os.O_WRONLY))
        t0 = time.process_time()
        Loop(timed, c, stream).run(corpus)
        total = time.process_time() - t0
        stream.close()
        res["outside"].append(1e6 * (total - timed.cpu) / steps)
        res["inside"].append(1e6 * timed.cpu / steps)
    return {k: statistics.median(v) for k, v in res.items()}


def print_in_loop(loop: dict, b: dict, plain_step_us: float, steps: int, every: int, diff_us: float) -> None:
    """The worker's cost from inside its loop of ``steps`` steps, against the components measured apart
    (:func:`breakdown`, the snapshots as many as such a run takes) and against the ladder's measured difference
    ``diff_us`` (us/step)."""
    snap = b["snapshot"] * snapshots_in(steps, every) / steps
    outside_parts = {"batch": b["batch"], "loop": b["loop"], "messages": b["messages"], "snapshots": snap}
    apart = sum(outside_parts.values())
    gap = (apart - loop["outside"]) / loop["outside"] if loop["outside"] else float("nan")
    fingerprint = 0.0 if b.get("guarded") else b["fingerprint"]  # a guarded trainer's Step takes it (guarded())
    overhead = loop["outside"] + fingerprint + b["call"]
    print(f"  inside the worker loop (CPU, median of the rounds): outside the trainer's blocks {loop['outside']:.1f} us/step, "
          f"inside them {loop['inside']:.1f} us/step", flush=True)
    print(f"    outside, from components measured apart: " + ", ".join(f"{k} {v:.1f}" for k, v in outside_parts.items())
          + f" = {apart:.1f} us/step: {100 * gap:+.1f}% ({'within' if abs(gap) <= 0.10 else 'NOT within'} 10%)")
    if b.get("guarded"):
        print(f"    the trainer is guarded (ModuleTrainer): its own Step takes two fingerprints ({2 * b['fingerprint']:.1f} "
              f"us/step), in its plain loop too, and the worker reuses the second: none added")
    print(f"    the worker's cost: outside {loop['outside']:.1f} + fingerprint {fingerprint:.1f} + call {b['call']:.1f} "
          f"= {overhead:.1f} us/step on a {plain_step_us / 1e3:.2f} ms plain step: ratio {1 + overhead / plain_step_us:.4f}")
    gap = (overhead - diff_us) / diff_us if diff_us else float("nan")
    print(f"    against the measured difference {diff_us:.1f} us/step (worker loop less plain loop): {100 * gap:+.1f}% "
          f"({'within' if abs(gap) <= 0.10 else 'NOT within'} 10%)")


class _NullStream:
    """A worker stream that sends nothing (the ladder's loop without messages)."""

    def send(self, type: str, **payload) -> None:  # noqa: A002 - Stream's signature
        pass

    def verdict(self) -> dict:
        return {}

    def close(self) -> None:
        pass


#: The ladder's stages, each the previous one plus one component of the worker's per-step cost.
STAGES = ("plain", "blocks", "call", "batch", "loop", "messages", "snapshots")
COMPONENTS = {
    "blocks": "Driver.StepBlock looped in .NET: the fingerprint after each step, losses/step times written",
    "call": "the pythonnet call of StepBlock per block + handing the block its batches",
    "batch": "batch generation (BatchSchedule.fill) in Python",
    "loop": "the worker loop around the blocks (pre-step compare, metrics lists, clocks)",
    "messages": "metrics messages encoded and written to /dev/null",
    "snapshots": "snapshots (start, cadence every --every, final: probe, JSON, conversion, message)",
}


def ladder(args, dll: str, trainer: str, steps: int = 500, rounds: int = 3, stages: tuple = STAGES) -> dict:
    """The in-process difference, worker loop against plain loop, taken apart: the same ``steps`` steps over
    the same batches in this one process, each stage the previous one plus one component (:data:`STAGES`),
    CPU time of the process (``time.process_time``), stages alternating in order and reverse order, median
    of ``rounds``. ``blocks`` and ``call`` cut the steps into the blocks the worker's loop makes (up to the next
    snapshot); ``loop`` and ``messages`` are the worker's loop (optcheck.drivers.worker_loop.Loop) with its
    snapshots left out (the fingerprint to compare against still taken where they are), ``snapshots`` the whole
    loop. Returns ``{stage: seconds}`` plus ``"gc_s"`` (Python's own collections during the full stage,
    measured with gc.callbacks; .NET's GC runs inside the step and is in every stage alike). The components are
    differences of consecutive medians, so they add up to median(snapshots) - median(plain)."""
    import gc
    import os

    from optcheck.drivers.protocol import Stream
    from optcheck.drivers.worker_loop import BLOCK_MAX_S, Loop
    from optcheck.torchsharp_bridge import runtime
    from optcheck.torchsharp_bridge.worker import TorchSharpBackend, setup_config

    cfg, corpus, sched, xs, ys = _setup(args, dll, trainer, steps)
    batches = np.ascontiguousarray(np.stack([xs, ys], axis=1))  # (steps, 2, B, T): PlainLoop's layout
    Bench = runtime.loaded_internal_type("OptCheck.Probe.Bench")  # internal: not importable
    from System import IntPtr

    config_json = setup_config(cfg, corpus)
    clock = time.process_time
    b, t, block = cfg.data.batch_size, cfg.model.block_size, _block(args)
    gc_ns = [0]
    gc_t0 = [0]

    def gc_cb(phase, _info):
        if phase == "start":
            gc_t0[0] = time.perf_counter_ns()
        else:
            gc_ns[0] += time.perf_counter_ns() - gc_t0[0]

    def blocks(stage: str) -> float:
        be = TorchSharpBackend()
        be.setup(cfg, corpus)
        if stage == "blocks":
            t0 = clock()
            Bench.StepBlocks(be.driver, IntPtr(xs.ctypes.data), IntPtr(ys.ctypes.data), steps, b, t, block, BLOCK_MAX_S)
            return clock() - t0
        t0 = clock()
        _py_blocks(be, cfg, xs, ys, sched, corpus, block, fill=stage == "batch")
        return clock() - t0

    def loop(stage: str) -> float:
        c = soak_config(args, dll, trainer)
        c.run.steps = steps
        be = TorchSharpBackend()
        be.setup(c, corpus)
        stream = _NullStream() if stage == "loop" else Stream(os.open(os.devnull, os.O_WRONLY))
        lp = Loop(be, c, stream)
        if stage != "snapshots":
            _no_snapshots(lp)
        else:
            gc.callbacks.append(gc_cb)
        t0 = clock()
        try:
            lp.run(corpus)
        finally:
            if stage == "snapshots":
                gc.callbacks.remove(gc_cb)
        secs = clock() - t0
        stream.close()
        return secs

    times: dict[str, list[float]] = {s: [] for s in stages}
    gc_s = []
    for i in range(rounds):
        for stage in (stages if i % 2 == 0 else tuple(reversed(stages))):
            if stage == "plain":
                t0 = clock()
                Bench.PlainLoop(trainer, config_json, IntPtr(batches.ctypes.data), steps, b, t)
                times[stage].append(clock() - t0)
            elif stage in ("blocks", "call", "batch"):
                times[stage].append(blocks(stage))
            else:
                gc_ns[0] = 0
                times[stage].append(loop(stage))
                if stage == "snapshots":
                    gc_s.append(gc_ns[0] / 1e9)
    out = {s: statistics.median(v) for s, v in times.items()}
    out["gc_s"] = statistics.median(gc_s)
    # the spread of the difference, round by round (same round: the stages ran next to each other)
    out["diff_s"] = sorted(w - p for w, p in zip(times["snapshots"], times["plain"]))
    return out


def snapshots_in(steps: int, every: int) -> int:
    """Snapshots a clean run of ``steps`` steps takes: the start, one every ``every`` steps, the final."""
    return 1 + steps // every + (1 if steps % every else 0)


def print_ladder(lad: dict, steps: int, every: int) -> None:
    """The breakdown per step, each component and their sum against the measured difference."""
    stages = tuple(s for s in STAGES if s in lad)
    us = {s: 1e6 * lad[s] / steps for s in stages}
    diff = us["snapshots"] - us["plain"]
    print(f"  one process, CPU time, {steps} steps, median of the rounds, stages alternating: plain {us['plain'] / 1e3:.3f} ms/step, "
          f"the worker's loop with every probe (snapshot every {every}) {us['snapshots'] / 1e3:.3f} ms/step, ratio "
          f"{lad['snapshots'] / lad['plain']:.3f}; difference {diff:.1f} us/step, by stage (each the one before plus one component):",
          flush=True)
    total = 0.0
    for prev, stage in zip(stages, stages[1:]):
        c = us[stage] - us[prev]
        total += c
        print(f"    {stage:<12} {c:8.1f} us/step  {COMPONENTS[stage] if prev == STAGES[STAGES.index(stage) - 1] else 'the rest'}")
    spread = [1e6 * d / steps for d in lad["diff_s"]]
    print(f"    (the difference round by round: {', '.join(f'{d:.0f}' for d in spread)} us/step)")
    print(f"    {'sum':<12} {total:8.1f} us/step  (measured difference {diff:.1f}; of the full stage, Python's own GC "
          f"{1e6 * lad['gc_s'] / steps:.1f} us/step)")


def print_independent(b: dict, lad: dict, steps: int, every: int) -> None:
    """The same difference from components measured apart (:func:`breakdown`), none of them a difference of
    ladder stages, against the ladder's measured difference: the check that nothing is left unlisted."""
    diff = 1e6 * (lad["snapshots"] - lad["plain"]) / steps
    n_snap = snapshots_in(steps, every)
    parts = {
        "fingerprint": (0.0 if b.get("guarded") else b["fingerprint"],
                        "ProbeCore.Fingerprint, looped in .NET" + (f" ({b['fingerprint']:.1f}): none added, the guarded "
                                                                  f"trainer's Step takes it" if b.get("guarded") else "")),
        "call": (b["call"], f"a pythonnet call of the Driver + a block's batches handed over, per block / "
                            f"{b['per_block']:.0f} steps a block"),
        "batch": (b["batch"], "batch generation (BatchSchedule.fill)"),
        "loop": (b["loop"], "worker loop with blocks that do not reach .NET, no snapshots or messages, less batches"),
        "messages": (b["messages"], "one metrics message of a block's steps to /dev/null, per step"),
        "snapshots": (b["snapshot"] * n_snap / steps, f"a snapshot after --every steps ({b['snapshot']:.0f} us on average) x {n_snap} in {steps} steps"),
    }
    total = sum(v for v, _ in parts.values())
    print(f"  the same difference from components measured apart (CPU us/step, median of 3):")
    for name, (v, what) in parts.items():
        print(f"    {name:<12} {v:8.1f} us/step  {what}")
    gap = (total - diff) / diff if diff else float("nan")
    print(f"    {'sum':<12} {total:8.1f} us/step  against the measured difference {diff:.1f} us/step: "
          f"{100 * gap:+.1f}% ({'within' if abs(gap) <= 0.10 else 'NOT within'} 10%)")


def stages_of(args) -> tuple:
    """``--ladder-stages`` in ladder order, plain and snapshots always included."""
    chosen = {x.strip() for x in args.ladder_stages.split(",") if x.strip()} | {"plain", "snapshots"}
    unknown = chosen - set(STAGES)
    if unknown:
        sys.exit(f"bench_torchsharp: --ladder-stages: no stage {', '.join(sorted(unknown))} ({', '.join(STAGES)})")
    return tuple(s for s in STAGES if s in chosen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1337)
    # None: the soak's defaults (64 / 16 / 64) for a real worker; 16 / 4 / 16 for the stand-in, whose
    # naive C# step would take ~300 ms at the GPT's sizes (TestLoop.cs has no BLAS)
    ap.add_argument("--n-embd", type=int, default=None)
    ap.add_argument("--n-head", type=int, default=2)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--runtime", choices=["coreclr", "mono"], default="coreclr")
    ap.add_argument("--torchsharp", help="build the real worker for this TorchSharp version (the .NET SDK) or folder (mcs)")
    ap.add_argument("--dotnet-assembly", help="a built worker assembly (with --dotnet-trainer)")
    ap.add_argument("--dotnet-trainer", default=None)
    ap.add_argument("--ladder-steps", type=int, default=500, help="steps of each in-process stage")
    ap.add_argument("--ladder-rounds", type=int, default=3, help="rounds of the in-process stages (median)")
    ap.add_argument("--ladder-stages", default=",".join(STAGES),
                    help="the ladder's stages (plain and snapshots always; on real TorchSharp's ~20 ms step the "
                         "intermediate stages are within the steps' noise: plain,snapshots)")
    ap.add_argument("--in-process-only", action="store_true",
                    help="only the in-process breakdown (no subprocess pairs)")
    ap.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dll", help=argparse.SUPPRESS)
    ap.add_argument("--trainer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_child:
        plain_child(args)
        return

    stand_in = not (args.torchsharp or args.dotnet_assembly)
    for name, real, small in (("n_embd", 64, 16), ("batch_size", 16, 4), ("block_size", 64, 16)):
        if getattr(args, name) is None:
            setattr(args, name, small if stand_in else real)
    if args.torchsharp:
        from optcheck.torchsharp_bridge.build import TRAINER_TYPE, ensure_worker_assembly

        dll, trainer, what = str(ensure_worker_assembly(args.torchsharp)), TRAINER_TYPE, f"TorchSharp {args.torchsharp}"
    elif args.dotnet_assembly:
        dll, trainer = args.dotnet_assembly, args.dotnet_trainer or "OptCheck.Worker.GptTrainer"
        what = f"{trainer} in {dll}"
    else:
        sys.path.insert(0, str(ROOT / "tests" / "dotnet"))
        from build import build_testloop

        dll, trainer = str(build_testloop()), STAND_IN_TRAINER
        what = (f"the TorchSharp STAND-IN {trainer} (tests/dotnet/TestLoop.cs, no libtorch: not TorchSharp; "
                f"pass --torchsharp VERSION on a machine with TorchSharp)")
    print(f"bench_torchsharp: {what}; {args.steps} steps (n_embd {args.n_embd}, batch {args.batch_size} x "
          f"{args.block_size}), snapshot every {args.every}, {args.pairs} interleaved pairs, {args.runtime}, wall time "
          f"of the training loop", flush=True)
    if args.in_process_only:
        lad = ladder(args, dll, trainer, steps=args.ladder_steps, rounds=args.ladder_rounds, stages=stages_of(args))
        print_ladder(lad, args.ladder_steps, args.every)
        b = breakdown(args, dll, trainer, run_steps=args.ladder_steps)
        print_independent(b, lad, args.ladder_steps, args.every)
        print_in_loop(in_loop(args, dll, trainer, steps=args.ladder_steps, rounds=args.ladder_rounds), b,
                      1e6 * lad["plain"] / args.ladder_steps, args.ladder_steps, args.every,
                      1e6 * (lad["snapshots"] - lad["plain"]) / args.ladder_steps)
        return
    plain_s, soak_s = [], []
    with tempfile.TemporaryDirectory(prefix="bench_torchsharp.") as tmp:
        for i in range(args.pairs):
            order = ("plain", "soak") if i % 2 == 0 else ("soak", "plain")
            got = {}
            for kind in order:
                got[kind] = run_plain(args, dll, trainer) if kind == "plain" else \
                    run_soak(args, dll, trainer, Path(tmp) / f"soak{i}")
            plain_s.append(got["plain"]["seconds"])
            soak_s.append(got["soak"]["seconds"])
            print(f"  pair {i + 1}: plain {plain_s[-1]:7.2f} s ({1e3 * plain_s[-1] / args.steps:6.2f} ms/step)   "
                  f"soak {soak_s[-1]:7.2f} s ({1e3 * soak_s[-1] / args.steps:6.2f} ms/step, {got['soak']['status']})   "
                  f"ratio {soak_s[-1] / plain_s[-1]:.3f}   loss plain {got['plain']['loss_first']:.3f} -> "
                  f"{got['plain']['loss_last']:.3f}, soak {got['soak']['loss_first']:.3f} -> "
                  f"{got['soak']['loss_last']:.3f}", flush=True)
    ratios = sorted(s / p for s, p in zip(soak_s, plain_s))
    print(f"  ratio soak/plain: median {statistics.median(ratios):.3f} (range {ratios[0]:.3f} to {ratios[-1]:.3f}); "
          f"median step plain {1e3 * statistics.median(plain_s) / args.steps:.2f} ms, soak "
          f"{1e3 * statistics.median(soak_s) / args.steps:.2f} ms")
    b = breakdown(args, dll, trainer, run_steps=args.ladder_steps)  # loads .NET into this process
    lad = ladder(args, dll, trainer, steps=args.ladder_steps, rounds=args.ladder_rounds, stages=stages_of(args))
    print_ladder(lad, args.ladder_steps, args.every)
    print_independent(b, lad, args.ladder_steps, args.every)
    print_in_loop(in_loop(args, dll, trainer, steps=args.ladder_steps, rounds=args.ladder_rounds), b,
                  1e6 * lad["plain"] / args.ladder_steps, args.ladder_steps, args.every,
                  1e6 * (lad["snapshots"] - lad["plain"]) / args.ladder_steps)
    print(f"  for scale: the trainer's step looped inside .NET {b['net_step']:.1f} us (CPU, this process)")

if __name__ == "__main__":
    main()
