"""The TorchSharp soak's cost against the same trainer's plain loop, side by side, interleaved.

For each of ``--pairs`` rounds (order alternating) it runs, each in its own process:

- **plain**: the trainer's own loop inside .NET, as a user runs it: ``OptCheck.Probe.Bench.PlainLoop``
  (dotnet/Probe/Bench.cs) constructs the trainer, calls ``Setup`` with the soak's options, and
  steps through the soak's own batches (optcheck.data.BatchSchedule, generated in one block before
  the loop): no probe, no pre-step check, no Python per step. Time: the loop's Stopwatch.
- **soak**: ``optcheck soak --backend torchsharp`` of the same trainer, options and batches, with
  every probe on (pre-step check every step, a snapshot every ``--every`` steps). Time: training
  time, the ``elapsed_s`` of the last snapshot (set-up and the runtime's start are left out of both).

It prints both times per round, the median ratio soak/plain, a breakdown of the soak's extra cost
per step measured in the same process as the bridge (pythonnet call of a step, the pre-step
fingerprint, one snapshot), and the in-process ladder: plain loop and the worker's loop in one
process, CPU time, with the stages in between (pythonnet call, fingerprint, batch generation, the
loop around the step, messages, snapshots), so that the components add up to the measured
difference (``--in-process-only`` runs just the ladder). By default the trainer is the TorchSharp STAND-IN
(tests/dotnet/TestLoop.cs compiled with mcs: a ~2 ms step with no libtorch), because TorchSharp
cannot be installed here; the output says so. On a machine with TorchSharp:
``--torchsharp 0.107.0`` (builds the worker with the .NET SDK) or ``--dotnet-assembly DLL
--dotnet-trainer TYPE``.

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
    from optcheck.torchsharp_bridge import runtime
    from optcheck.torchsharp_bridge.worker import setup_config

    cfg = soak_config(args, args.dll, args.trainer)
    corpus = load_corpus(cfg.data.path, cfg.model.vocab_size)
    sched = BatchSchedule(corpus.train.size, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed)
    batches = np.empty((cfg.run.steps, 2, cfg.data.batch_size, cfg.model.block_size), dtype=np.int64)
    for step in range(1, cfg.run.steps + 1):  # the soak's batches, made before the timed loop
        x, y = sched.batch(corpus.train, step)
        batches[step - 1, 0], batches[step - 1, 1] = x, y
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


def breakdown(args, dll: str, trainer: str, n: int = 300) -> dict:
    """Per-step costs in this process, CPU microseconds of this process (``time.process_time``, less
    disturbed by other processes than wall time; median of 3): the trainer's step inside .NET,
    Driver.StepBound looped inside .NET (the step + its fingerprint, no pythonnet call),
    the same step from Python as the worker makes it (StepBound + buffer copy + cached fingerprint),
    a fresh fingerprint from Python, a fingerprint inside .NET, and one snapshot (probe + conversion)."""
    from optcheck.data import BatchSchedule, load_corpus
    from optcheck.torchsharp_bridge import runtime
    from optcheck.torchsharp_bridge.worker import TorchSharpBackend
    from optcheck.drivers.worker_loop import Loop

    cfg = soak_config(args, dll, trainer)
    corpus = load_corpus(cfg.data.path, cfg.model.vocab_size)
    be = TorchSharpBackend()
    be.setup(cfg, corpus)
    Bench = runtime.loaded_internal_type("OptCheck.Probe.Bench")  # internal: not importable
    from System import IntPtr

    sched = BatchSchedule(corpus.train.size, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed)
    x, y = sched.batch(corpus.train, 1)
    xc, yc = np.ascontiguousarray(x), np.ascontiguousarray(y)
    d, step = be.driver, 1
    res: dict[str, list[float]] = {k: [] for k in ("net_step", "net_bound", "py_step", "py_fp", "net_fp", "snapshot",
                                                   "batch", "loop_nostep")}
    clock = time.process_time
    for _ in range(3):
        t = clock()
        Bench.TimeSteps(d, step, IntPtr(xc.ctypes.data), IntPtr(yc.ctypes.data), xc.shape[0], xc.shape[1], n)
        res["net_step"].append((clock() - t) / n)
        step += n
        be.train_step(step, x, y)  # binds the buffers (and holds this batch)
        t = clock()
        Bench.TimeStepBound(d, step, xc.shape[0], xc.shape[1], n)
        res["net_bound"].append((clock() - t) / n)
        step += n
        t = clock()
        for i in range(n):
            be.fingerprint()
            be.train_step(step + i, x, y)
        res["py_step"].append((clock() - t) / n)
        step += n
        t = clock()
        for _ in range(n):
            d.Fingerprint()
        res["py_fp"].append((clock() - t) / n)
        t = clock()
        Bench.TimeFingerprints(d, n)
        res["net_fp"].append((clock() - t) / n)
        t = clock()
        for _ in range(20):
            be.snapshot_body()
        res["snapshot"].append((clock() - t) / 20)
        t = clock()
        for i in range(n):
            sched.batch(corpus.train, i + 1)
        res["batch"].append((clock() - t) / n)
        # the worker loop alone: Loop.run over this backend with a step that does not reach .NET (the
        # batch, the pre-step compare, metrics, clocks, the start and final snapshots; no messages)
        c = soak_config(args, dll, trainer)
        c.run.steps, c.run.every = n, n
        t = clock()
        Loop(_NoStep(be), c, _NullStream()).run(corpus)
        res["loop_nostep"].append((clock() - t) / n)
    return {k: statistics.median(v) * 1e6 for k, v in res.items()}


class _NoStep:
    """A TorchSharpBackend whose train_step returns a constant without calling .NET (its fingerprint stays
    the cached one, as after a real step): the cost of the worker loop around the step, measured apart."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def train_step(self, step: int, x, y) -> float:
        self.inner._fp_valid = True
        return 1.0


class _NullStream:
    """A worker stream that sends nothing (the ladder's loop without messages)."""

    def send(self, type: str, **payload) -> None:  # noqa: A002 - Stream's signature
        pass

    def verdict(self) -> dict:
        return {}

    def close(self) -> None:
        pass


#: The ladder's stages, each the previous one plus one component of the worker's per-step cost.
STAGES = ("plain", "call", "fingerprint", "batch", "loop", "messages", "snapshots")
COMPONENTS = {
    "call": "pythonnet call of the step + copying the batch into the bound buffers",
    "fingerprint": "the pre-step fingerprint StepBound computes after the step",
    "batch": "batch generation (BatchSchedule) in Python",
    "loop": "the worker loop around the step (pre-step compare, metrics lists, clocks, start/final snapshot)",
    "messages": "messages (metrics batches, start/final snapshot JSON) written to the pipe (/dev/null here)",
    "snapshots": "cadence snapshots (probe, JSON, conversion) every --every steps",
}


def ladder(args, dll: str, trainer: str, steps: int = 500, rounds: int = 3) -> dict:
    """The in-process difference, worker loop against plain loop, taken apart: the same ``steps`` steps over
    the same batches in this one process, each stage the previous one plus one component (:data:`STAGES`),
    CPU time of the process (``time.process_time``), stages alternating in order and reverse order, median
    of ``rounds``. Returns ``{stage: seconds}`` plus ``"gc_s"`` (Python's own collections during the full
    stage, measured with gc.callbacks; .NET's GC runs inside the step and is in every stage alike). The
    components are differences of consecutive medians, so they add up to median(snapshots) - median(plain)."""
    import gc
    import os

    from optcheck.data import BatchSchedule, load_corpus
    from optcheck.drivers.protocol import Stream
    from optcheck.torchsharp_bridge import runtime
    from optcheck.torchsharp_bridge.worker import TorchSharpBackend, setup_config
    from optcheck.drivers.worker_loop import Loop

    cfg = soak_config(args, dll, trainer)
    cfg.run.steps = steps
    corpus = load_corpus(cfg.data.path, cfg.model.vocab_size)
    sched = BatchSchedule(corpus.train.size, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed)
    batches = np.empty((steps, 2, cfg.data.batch_size, cfg.model.block_size), dtype=np.int64)
    for step in range(1, steps + 1):
        batches[step - 1, 0], batches[step - 1, 1] = sched.batch(corpus.train, step)
    TorchSharpBackend().setup(cfg, corpus)  # loads .NET and the assembly into this process
    Bench = runtime.loaded_internal_type("OptCheck.Probe.Bench")  # internal: not importable
    from System import IntPtr

    config_json = setup_config(cfg, corpus)
    clock = time.process_time
    b, t = cfg.data.batch_size, cfg.model.block_size
    n = b * t
    gc_ns = [0]
    gc_t0 = [0]

    def gc_cb(phase, _info):
        if phase == "start":
            gc_t0[0] = time.perf_counter_ns()
        else:
            gc_ns[0] += time.perf_counter_ns() - gc_t0[0]

    def python_steps(stage: str) -> float:
        be = TorchSharpBackend()
        be.setup(cfg, corpus)
        d = be.driver
        xb, yb, fp = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(2, np.int64)
        d.Bind(IntPtr(xb.ctypes.data), IntPtr(yb.ctypes.data), n,
               IntPtr(fp.ctypes.data) if stage != "call" else IntPtr.Zero)
        t0 = clock()
        for step in range(1, steps + 1):
            if stage == "batch":
                x, y = sched.batch(corpus.train, step)
            else:
                x, y = batches[step - 1, 0], batches[step - 1, 1]
            xb[:] = np.ravel(x)
            yb[:] = np.ravel(y)
            d.StepBound(step, b, t)
        return clock() - t0

    def loop(stage: str) -> float:
        c = soak_config(args, dll, trainer)
        c.run.steps, c.run.every = steps, (steps if stage in ("loop", "messages") else args.every)
        be = TorchSharpBackend()
        be.setup(c, corpus)
        stream = _NullStream() if stage == "loop" else Stream(os.open(os.devnull, os.O_WRONLY))
        if stage == "snapshots":
            gc.callbacks.append(gc_cb)
        t0 = clock()
        try:
            Loop(be, c, stream).run(corpus)
        finally:
            if stage == "snapshots":
                gc.callbacks.remove(gc_cb)
        secs = clock() - t0
        stream.close()
        return secs

    times: dict[str, list[float]] = {s: [] for s in STAGES}
    gc_s = []
    for i in range(rounds):
        for stage in (STAGES if i % 2 == 0 else tuple(reversed(STAGES))):
            if stage == "plain":
                t0 = clock()
                Bench.PlainLoop(trainer, config_json, IntPtr(batches.ctypes.data), steps, b, t)
                times[stage].append(clock() - t0)
            elif stage in ("call", "fingerprint", "batch"):
                times[stage].append(python_steps(stage))
            else:
                gc_ns[0] = 0
                times[stage].append(loop(stage))
                if stage == "snapshots":
                    gc_s.append(gc_ns[0] / 1e9)
    out = {s: statistics.median(v) for s, v in times.items()}
    out["gc_s"] = statistics.median(gc_s)
    return out


def in_process(args, dll: str, trainer: str, steps: int = 500, rounds: int = 3) -> tuple[float, float]:
    """The worker's whole loop (optcheck.drivers.worker_loop: batches, pre-step check, step, metrics, snapshots
    every --every, messages serialised to /dev/null) against Bench.PlainLoop over the same batches, both in
    this one process and timed in its CPU time: the ladder's first and last stages. Returns the medians
    (plain s, worker s). No supervisor, no second process: what is left is the worker's own cost."""
    lad = ladder(args, dll, trainer, steps, rounds)
    return lad["plain"], lad["snapshots"]


def print_ladder(lad: dict, steps: int, every: int) -> None:
    """The breakdown per step, each component and their sum against the measured difference."""
    us = {s: 1e6 * lad[s] / steps for s in STAGES}
    diff = us["snapshots"] - us["plain"]
    print(f"  one process, CPU time, {steps} steps, median of the rounds, stages alternating: plain {us['plain'] / 1e3:.3f} ms/step, "
          f"the worker's loop with every probe (snapshot every {every}) {us['snapshots'] / 1e3:.3f} ms/step, ratio "
          f"{lad['snapshots'] / lad['plain']:.3f}; difference {diff:.1f} us/step, by component:", flush=True)
    total = 0.0
    for prev, stage in zip(STAGES, STAGES[1:]):
        c = us[stage] - us[prev]
        total += c
        print(f"    {stage:<12} {c:8.1f} us/step  {COMPONENTS[stage]}")
    print(f"    {'sum':<12} {total:8.1f} us/step  (measured difference {diff:.1f}; of the full stage, Python's own GC "
          f"{1e6 * lad['gc_s'] / steps:.1f} us/step)")


def print_independent(b: dict, lad: dict, steps: int, every: int) -> None:
    """The same difference from components measured apart (:func:`breakdown`), none of them a difference of
    ladder stages, against the ladder's measured difference: the check that nothing is left unlisted."""
    diff = 1e6 * (lad["snapshots"] - lad["plain"]) / steps
    ends = 2 * b["snapshot"] / steps  # the start and final snapshots of a run of `steps` steps
    parts = {
        "call": (b["py_step"] - b["net_bound"], "pythonnet call of StepBound + batch copy (Python step - .NET loop of StepBound)"),
        "fingerprint": (b["net_bound"] - b["net_step"], "fingerprint inside StepBound (.NET StepBound - .NET step)"),
        "loop": (b["loop_nostep"] - b["batch"] - ends, "worker loop around the step (Loop.run with no .NET step, less "
                                                       "its batches and start/final snapshots)"),
        "batch": (b["batch"], "batch generation (BatchSchedule.batch)"),
        "snapshots": (b["snapshot"] / every + ends, f"one snapshot every {every} steps + start/final snapshot"),
    }
    total = sum(v for v, _ in parts.values())
    print(f"  the same difference from components measured apart (CPU us/step, median of 3; messages not included):")
    for name, (v, what) in parts.items():
        print(f"    {name:<12} {v:8.1f} us/step  {what}")
    gap = (total - diff) / diff if diff else float("nan")
    print(f"    {'sum':<12} {total:8.1f} us/step  against the measured difference {diff:.1f} us/step: "
          f"{100 * gap:+.1f}% ({'within' if abs(gap) <= 0.10 else 'NOT within'} 10%)")


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
    ap.add_argument("--torchsharp", help="build the real worker for this TorchSharp version (needs the .NET SDK)")
    ap.add_argument("--dotnet-assembly", help="a built worker assembly (with --dotnet-trainer)")
    ap.add_argument("--dotnet-trainer", default=None)
    ap.add_argument("--ladder-steps", type=int, default=500, help="steps of each in-process stage")
    ap.add_argument("--ladder-rounds", type=int, default=3, help="rounds of the in-process stages (median)")
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
        lad = ladder(args, dll, trainer, steps=args.ladder_steps, rounds=args.ladder_rounds)
        print_ladder(lad, args.ladder_steps, args.every)
        print_independent(breakdown(args, dll, trainer), lad, args.ladder_steps, args.every)
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
    b = breakdown(args, dll, trainer)  # loads .NET into this process
    lad = ladder(args, dll, trainer, steps=args.ladder_steps, rounds=args.ladder_rounds)
    print_ladder(lad, args.ladder_steps, args.every)
    print_independent(b, lad, args.ladder_steps, args.every)
    snap_per_step = b["snapshot"] / args.every
    print(f"  where the soak's time goes, per step (CPU time of one process, median of 3): step inside .NET {b['net_step']:.1f} us; "
          f"Driver.StepBound looped inside .NET {b['net_bound']:.1f} us; "
          f"the worker's step from Python (StepBound + batch copy + the pre-step fingerprint it returns) "
          f"{b['py_step']:.1f} us (+{b['py_step'] - b['net_step']:.1f}); a separate fingerprint call would cost "
          f"{b['py_fp']:.1f} us ({b['net_fp']:.1f} of it inside .NET); batch generation {b['batch']:.1f} us; "
          f"one snapshot {b['snapshot']:.0f} us = {snap_per_step:.1f} us/step at --every {args.every}")


if __name__ == "__main__":
    main()
