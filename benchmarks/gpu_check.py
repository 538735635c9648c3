"""The GPU check: optcheck on one CUDA card, in one script, in under 8 minutes.

Run it with ``benchmarks/gpu_check.sh OUT`` (which sets up the path and any wheels
carried beside it) or ``python3 benchmarks/gpu_check.py --out OUT``. Parts, each on its
own (a part that fails is reported in the table and the next one runs):

1. ``env``: the card (name, capability, memory), driver, torch, CUDA, Triton, and which
   of optcheck's dependencies are missing (docs/gpu.md says which to carry as wheels);
2. ``tests``: ``pytest -m gpu tests/gpu`` (seeds 000/001/002 on CUDA, fused/foreach
   AdamW, bf16 autocast, GradScaler fp16, ``torch.compile``, the GPU leak, the sync
   checks, the CLI with ``--device cuda``), its JUnit XML kept in OUT;
3. ``syncs``: synchronising calls made by optcheck on steps that take no snapshot
   (``torch.cuda.set_sync_debug_mode("warn")``; goal 0), and host reads by optcheck's
   code outside snapshots and metrics batches (``optcheck.pytorch.hostreads``, the
   CPU-side count; goal 0), for the soak's worker loop and ``Monitor(every=100)``;
4. ``overhead``: a GPT-2-small-sized model (124 M parameters: 12 layers, 768 wide,
   vocab 50,257, context ``--block``), bf16 autocast, fused AdamW, batch ``--batch``:
   (a) a plain loop with no optcheck, (b) the soak's worker loop with every probe
   (``optcheck.drivers.worker_loop.Loop`` + ``TorchBackend``, snapshots every ``--every``),
   (c) the plain loop under ``optcheck.Monitor(every=--every)``; interleaved in
   ``--rounds`` rounds after one warm-up run of each; CUDA-event time of all
   ``--steps`` steps of a run (snapshots included, the start snapshot before step 1 left
   out of all three); ratio to (a) of the same round (its plain loop timed before and after);
   median and range over rounds (goal <= 1.02);
5. ``snapshot``: on the same model after a step, ``probe.snapshot_body`` plus the
   probes' drains (``TorchProbe.snapshot_body``, census aside) against one read of
   everything it reads (one ``torch._foreach_norm`` over values, gradients and the
   floating optimizer state, and its host read); median of ``--repeat`` (goal <= 1.2).

Prints one table last and writes every number to OUT/gpu_check.json (and the table to
OUT/table.md). ``--device cpu --sizes tiny`` runs every part that can run on a CPU
(parts 2 and 3's CUDA count are skipped there) — the dry run made before a card is
used.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

DEPS = ("numpy", "click", "psutil", "scipy", "tqdm", "packaging", "jsonschema", "matplotlib", "pytest",
        "xdist", "hypothesis")


class Clock:
    """CUDA events on a GPU (GPU time, no sync until read), perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def ms(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)} \
        if values else {"median": None, "min": None, "max": None, "n": 0}


# -- 1. environment -------------------------------------------------------------------------
def part_env(args) -> dict:
    from optcheck.pytorch import device as devices

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": args.device, "missing": [], "optcheck": str(ROOT)}
    for mod in DEPS:
        try:
            importlib.import_module(mod)
        except ImportError:
            env["missing"].append(mod)
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    dev = torch.device(args.device)
    env.update(devices.describe(dev))
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env["memory_gib"] = round(props.total_memory / 2**30, 1)
        env["sms"] = props.multi_processor_count
    try:
        env["git"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001
        env["git"] = None
    return env


# -- 2. the gpu tests -----------------------------------------------------------------------
def part_tests(args) -> dict:
    if torch.device(args.device).type != "cuda":
        return {"skipped": "no CUDA device: tests/gpu skips itself (one line)"}
    xml = Path(args.out) / "gpu-tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "gpu", "-rs",
           "--junitxml", str(xml), str(ROOT / "tests" / "gpu")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=args.tests_timeout)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    (Path(args.out) / "gpu-tests.log").write_text(out)
    tail = [line for line in out.splitlines() if line.strip()][-1:] or [""]
    return {"rc": rc, "seconds": round(time.time() - t0, 1), "result": tail[0],
            "failed": [line for line in out.splitlines() if line.startswith("FAILED")]}


# -- 3. syncs -------------------------------------------------------------------------------
def _soak_loop(device: str, steps: int = 120):
    from optcheck.config import DataConfig, ModelConfig, RunConfig, SoakConfig
    from optcheck.data import load_corpus
    from optcheck.drivers.protocol import Stream
    from optcheck.pytorch.train import TorchBackend
    from optcheck.drivers.worker_loop import Loop
    from optcheck.run.sequencer import Cost

    cfg = SoakConfig(model=ModelConfig(n_layer=2, n_embd=64, n_head=2, block_size=64),
                     data=DataConfig(val_every=40, batch_size=8),
                     run=RunConfig(steps=steps, every=50, run_id="sync", device=device))
    be = TorchBackend()
    corpus = load_corpus(None, None)
    be.setup(cfg, corpus)
    loop = Loop(be, cfg, Stream(None))
    return lambda: loop.run(corpus)


def _monitor_loop(device: str, steps: int = 250):
    import cuda_loop

    precision = "bf16" if device.startswith("cuda") else "fp32"
    optim = "fused" if device.startswith("cuda") else "foreach"
    return lambda: cuda_loop.train(device=device, steps=steps, optim=optim, precision=precision,
                                   monitor=dict(every=100, on_finding="ignore", ignore_config=False))


def _cuda_syncs(run, exempt) -> dict:
    """Synchronising calls seen by ``set_sync_debug_mode("warn")`` while ``run()`` runs:
    all, and those made by optcheck's code outside ``exempt``."""
    import traceback as tb
    import warnings

    import optcheck

    mine_dir = str(Path(optcheck.__file__).resolve().parent) + os.sep
    codes = {f.__code__ for f in exempt}
    seen = {"all": 0, "optcheck_outside_snapshots": 0, "where": {}}

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        seen["all"] += 1
        frames = [f for f, _ in tb.walk_stack(None)]
        if any(f.f_code in codes for f in frames):
            return
        mine = [f for f in frames if f.f_code.co_filename.startswith(mine_dir)]
        if mine:
            seen["optcheck_outside_snapshots"] += 1
            key = f"{os.path.relpath(mine[0].f_code.co_filename, ROOT)}:{mine[0].f_lineno}"
            seen["where"][key] = seen["where"].get(key, 0) + 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        old = warnings.showwarning
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = old
    return seen


def part_syncs(args) -> dict:
    from optcheck.pytorch.hostreads import HostReadCounter
    from optcheck.run.sequencer import Sequencer
    from optcheck.drivers.worker_loop import Loop

    out = {}
    for name, make, exempt in (("soak", _soak_loop, [Sequencer.take, Loop.flush_metrics]),
                               ("monitor", _monitor_loop, [Sequencer.take])):
        rec = {}
        with HostReadCounter(exempt=exempt) as reads:
            make(args.device)()
        rec["host_reads_by_optcheck_outside_snapshots"] = reads.count(by="optcheck", exempt=False)
        rec["host_reads_by_optcheck_in_snapshots"] = reads.count(by="optcheck", exempt=True)
        rec["host_reads_by_torch"] = reads.count(by="torch")
        if rec["host_reads_by_optcheck_outside_snapshots"]:
            rec["host_reads_where"] = reads.report(by="optcheck", exempt=False)
        if torch.device(args.device).type == "cuda":
            rec["cuda_syncs"] = _cuda_syncs(make(args.device), exempt)
        out[name] = rec
    return out


# -- 4. overhead ----------------------------------------------------------------------------
def _corpus(args, tmp: Path):
    """A nanoGPT .bin of random uint16 tokens below the vocabulary: GPT-2's 50,257 for the
    GPT-2-small shape (124 M parameters; the byte corpus would leave out 38.6 M of them)."""
    path = tmp / "tokens.bin"
    rng = np.random.default_rng(0)
    need = max(2_000_000, args.batch * args.block * 8)
    rng.integers(0, args.vocab, need, dtype=np.uint16).tofile(path)
    return path


def _soak_cfg(args, data: Path, hazards: bool = True):
    from optcheck.config import ChecksConfig, DataConfig, ModelConfig, OptimizerConfig, RunConfig, SoakConfig

    return SoakConfig(model=ModelConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                                        block_size=args.block, vocab_size=args.vocab),
                      optimizer=OptimizerConfig(warmup_steps=10, fused=args.device.startswith("cuda")),
                      data=DataConfig(val_every=0, batch_size=args.batch, path=str(data)),
                      run=RunConfig(steps=args.steps, every=args.every, run_id="bench", device=args.device,
                                    autocast=args.precision),
                      checks=ChecksConfig(hazards="auto" if hazards else "off"))


class Plain:
    """The soak's step without optcheck: the same GPT, fused AdamW, batches, learning-rate
    schedule, autocast and clipping (``optcheck.pytorch.train.Trainer.train_step`` less
    its probes)."""

    def __init__(self, args, data: Path):
        from optcheck.data import BatchSchedule, load_corpus
        from optcheck.pytorch.gpt import GPT, GPTConfig

        self.cfg = _soak_cfg(args, data, hazards=False)
        c = self.cfg
        self.corpus = load_corpus(c.data.path, c.model.vocab_size)
        self.sched = BatchSchedule(self.corpus.train.size, c.model.block_size, c.data.batch_size, c.run.seed)
        self.device = torch.device(args.device)
        torch.manual_seed(c.run.seed)
        m, o = c.model, c.optimizer
        self.model = GPT(GPTConfig(block_size=m.block_size, vocab_size=self.corpus.vocab_size, n_layer=m.n_layer,
                                   n_head=c.model.n_head, n_embd=c.model.n_embd)).to(self.device)
        self.opt = self.model.configure_optimizers(o.lr, o.weight_decay, (o.beta1, o.beta2), o.eps,
                                                   fused=self.device.type == "cuda")
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)

    def batch(self, step):
        x, y = self.sched.batch(self.corpus.train, step)
        xb, yb = torch.from_numpy(x), torch.from_numpy(y)
        if self.device.type == "cpu":
            return xb, yb
        return xb.pin_memory().to(self.device, non_blocking=True), yb.pin_memory().to(self.device, non_blocking=True)

    def step(self, step):
        from optcheck.pytorch.train import lr_at

        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.cfg, step)
        self.opt.zero_grad(set_to_none=True)
        xb, yb = self.batch(step)
        if self.dtype is not None:
            with torch.autocast(self.device.type, dtype=self.dtype):
                _, loss = self.model(xb, yb)
        else:
            _, loss = self.model(xb, yb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optimizer.grad_clip)
        self.opt.step()
        return loss.detach()

    def run(self, clock: Clock, steps: int, monitor: dict | None = None) -> float:
        mon = None
        if monitor is not None:
            import optcheck

            mon = optcheck.Monitor(self.model, self.opt, **monitor)
        losses = []
        a = clock.mark()
        for s in range(1, steps + 1):
            losses.append(self.step(s))
        b = clock.mark()
        ms = clock.ms(a, b)
        if mon is not None:
            mon.close()
        torch.stack(losses).float().mean().item()  # the losses read once, after the timed span
        return ms


def _soak_run(args, data: Path, clock: Clock) -> tuple[float, dict]:
    from optcheck.data import load_corpus
    from optcheck.drivers.protocol import Stream
    from optcheck.pytorch.train import TorchBackend
    from optcheck.drivers.worker_loop import Loop
    from optcheck.run.sequencer import Cost

    cfg = _soak_cfg(args, data)
    be = TorchBackend()
    corpus = load_corpus(cfg.data.path, cfg.model.vocab_size)
    be.setup(cfg, corpus)
    loop = Loop(be, cfg, Stream(None))
    marks = []
    restart = loop.seq.restart_clock

    def timed_from_here():  # the loop restarts its clock after the start snapshot: time from there
        marks.append(clock.mark())
        restart()

    loop.seq.restart_clock = timed_from_here
    taken, emit = Cost(), loop.seq.emit  # what the snapshots cost (the supervisor's recorder counts it in a soak)

    def counted(snap, seconds):
        taken.add(seconds)
        return emit(snap, seconds)

    loop.seq.emit = counted
    loop.run(corpus)
    b = clock.mark()
    ms = clock.ms(marks[0], b)
    info = {"snapshots": len(taken.seconds), "snapshot_s": taken.to_dict(),
            "step_cost": loop.step_cost.to_dict(), "hazards": be.hazard_stats(),
            "params": sum(p.numel() for p in be.trainer.model.parameters())}
    del be, loop
    return ms, info


def part_overhead(args) -> dict:
    device = torch.device(args.device)
    clock = Clock(device)
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    data = _corpus(args, tmp)
    plain = Plain(args, data)
    n_params = sum(p.numel() for p in plain.model.parameters())
    monitor = dict(every=args.every, on_finding="ignore", ignore_config=False, out=None)
    # warm-up: kernels, autotuning, the caching allocator's growth, the census's first walk
    plain.run(clock, min(args.steps, 20))
    plain.run(clock, min(args.steps, 20), monitor)
    _soak_run(args, data, clock)
    rounds = []
    for r in range(args.rounds):
        row = {"plain_ms": plain.run(clock, args.steps)}
        row["soak_ms"], row["soak"] = _soak_run(args, data, clock)
        row["monitor_ms"] = plain.run(clock, args.steps, monitor)
        row["plain_after_ms"] = plain.run(clock, args.steps)  # the round's load, measured twice
        base = (row["plain_ms"] + row["plain_after_ms"]) / 2
        row["soak_ratio"], row["monitor_ratio"] = row["soak_ms"] / base, row["monitor_ms"] / base
        rounds.append(row)
        print(f"  round {r + 1}: plain {base / args.steps:.2f} ms/step, soak x{row['soak_ratio']:.4f}, "
              f"monitor x{row['monitor_ratio']:.4f}", flush=True)
    out = {"params": n_params, "steps": args.steps, "every": args.every, "batch": args.batch, "block": args.block,
           "precision": args.precision, "rounds": rounds,
           "plain_ms_per_step": summary([(r["plain_ms"] + r["plain_after_ms"]) / 2 / args.steps for r in rounds]),
           "soak_ratio": summary([r["soak_ratio"] for r in rounds]),
           "monitor_ratio": summary([r["monitor_ratio"] for r in rounds])}
    out["snapshot"] = _snapshot_cost(args, plain, clock)
    if device.type == "cuda":
        out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return out


# -- 5. snapshot against one read ---------------------------------------------------------------
def _snapshot_cost(args, plain: Plain, clock: Clock) -> dict:
    from optcheck.pytorch import probe
    from optcheck.pytorch.grad_clear import GradClearProbe
    from optcheck.pytorch.hazards import HazardProbes
    from optcheck.pytorch.monitor_hooks import TorchProbe

    model, opt = plain.model, plain.opt
    hz = HazardProbes(model, opt)
    gc = GradClearProbe(opt)
    tp = TorchProbe(model, opt, hz, gc)
    tp.snapshots = 1  # census aside (it runs on every 10th snapshot; timed on its own below)
    plain.step(1)  # gradients and optimizer state in place
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.is_floating_point()
             and v.dim() > 0]
    every = [p.detach() for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None] \
        + state

    def one_read():
        torch.stack(torch._foreach_norm(every)).tolist()

    def snapshot():
        tp.snapshots = 1
        tp.snapshot_body()

    def census():
        probe.tensor_census()

    timings = {"snapshot": [], "one_read": [], "census": []}
    for fn in (one_read, snapshot, census):  # warm-up
        fn()
    for _ in range(args.repeat):
        for name, fn in (("one_read", one_read), ("snapshot", snapshot), ("census", census)):
            if clock.cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if clock.cuda:
                torch.cuda.synchronize()
            timings[name].append((time.perf_counter() - t) * 1e3)
    hz.remove()
    gc.remove()
    ratios = [s / r for s, r in zip(timings["snapshot"], timings["one_read"])]
    gib = sum(t.numel() * t.element_size() for t in every) / 2**30
    return {"read_gib": round(gib, 3), "snapshot_ms": summary(timings["snapshot"]),
            "one_read_ms": summary(timings["one_read"]), "census_ms": summary(timings["census"]),
            "ratio": summary(ratios)}


# -- the table ----------------------------------------------------------------------------------
def fmt(s: dict | None, unit: str = "", digits: int = 3) -> str:
    if not s or s.get("median") is None:
        return "—"
    return f"{s['median']:.{digits}f}{unit} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def table(res: dict) -> str:
    env = res.get("env", {})
    lines = [f"## optcheck GPU check — {env.get('device', '?')} (capability {env.get('cuda_capability', '—')}, "
             f"driver {env.get('cuda_driver', '—')}, CUDA {env.get('cuda', '—')}, torch {env.get('torch', '?')}, "
             f"optcheck {env.get('git') or '?'})", "",
             "| check | result | goal |", "| --- | --- | --- |"]
    if env.get("missing"):
        lines.append(f"| missing modules | {', '.join(env['missing'])} | (carry as wheels, docs/gpu.md) |")
    t = res.get("tests", {})
    if t:
        lines.append(f"| gpu tests | {t.get('result') or t.get('skipped') or t.get('error', '?')} | all pass |")
    for name, rec in (res.get("syncs") or {}).items():
        if not isinstance(rec, dict):
            continue
        cs = (rec.get("cuda_syncs") or {}).get("optcheck_outside_snapshots", "—")
        lines.append(f"| {name}: syncs by optcheck on non-snapshot steps (CUDA) | {cs} | 0 |")
        lines.append(f"| {name}: host reads by optcheck outside snapshots (counter) | "
                     f"{rec.get('host_reads_by_optcheck_outside_snapshots')} | 0 |")
    o = res.get("overhead") or {}
    if "soak_ratio" in o:
        cuda = str(env.get("device", "")).startswith("cuda")
        lines.append(f"| model | {o['params'] / 1e6:.1f} M params, batch {o['batch']}x{o['block']}, {o['precision']}, "
                     f"{'fused AdamW' if cuda else 'AdamW'}; plain {fmt(o['plain_ms_per_step'], ' ms/step', 2)} | |")
        lines.append(f"| soak, every probe, every={o['every']} / plain ({len(o['rounds'])} rounds, "
                     f"{'CUDA events' if cuda else 'wall clock'}) | "
                     f"{fmt(o['soak_ratio'], 'x', 4)} | <= 1.02x |")
        lines.append(f"| Monitor(every={o['every']}) / plain | {fmt(o['monitor_ratio'], 'x', 4)} | <= 1.02x |")
        sn = o.get("snapshot") or {}
        if sn:
            lines.append(f"| snapshot / one read of everything it reads ({sn['read_gib']} GiB) | "
                         f"{fmt(sn['ratio'], 'x', 3)} ({fmt(sn['snapshot_ms'], ' ms', 2)} vs "
                         f"{fmt(sn['one_read_ms'], ' ms', 2)}) | <= 1.2x |")
            lines.append(f"| tensor census (every 10th snapshot) | {fmt(sn['census_ms'], ' ms', 2)} | |")
        if "peak_allocated_gib" in o:
            lines.append(f"| peak device memory allocated | {o['peak_allocated_gib']} GiB | |")
    for part in ("env", "tests", "syncs", "overhead"):
        if isinstance(res.get(part), dict) and res[part].get("error"):
            lines.append(f"| {part} FAILED | {res[part]['error'].splitlines()[-1][:160]} | |")
    lines.append(f"| wall time of this script | {res.get('seconds', 0):.0f} s | <= 480 s |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json, table.md and the test logs")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", choices=["gpt2-small", "tiny"], default="gpt2-small")
    ap.add_argument("--steps", type=int, default=200, help="steps of each timed run")
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--repeat", type=int, default=7, help="snapshot timings")
    ap.add_argument("--parts", default="env,tests,syncs,overhead")
    ap.add_argument("--tests-timeout", type=int, default=240)
    args = ap.parse_args(argv)
    if args.sizes == "tiny":
        args.n_layer, args.n_head, args.n_embd, args.vocab = 2, 2, 64, 256
        args.block = min(args.block, 64)
    else:
        args.n_layer, args.n_head, args.n_embd, args.vocab = 12, 12, 768, 50257
    Path(args.out).mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    t0 = time.time()
    res: dict = {"args": {k: v for k, v in vars(args).items()}}
    parts = {"env": part_env, "tests": part_tests, "syncs": part_syncs, "overhead": part_overhead}
    for name in args.parts.split(","):
        print(f"[gpu_check] {name} ...", flush=True)
        try:
            res[name] = parts[name](args)
        except Exception:  # noqa: BLE001 - one part's failure is a row of the table, not the end
            res[name] = {"error": traceback.format_exc()}
            print(res[name]["error"], file=sys.stderr, flush=True)
        res["seconds"] = time.time() - t0
        (Path(args.out) / "gpu_check.json").write_text(json.dumps(res, indent=1, default=str))
    text = table(res)
    (Path(args.out) / "table.md").write_text(text + "\n")
    print(text)
    failed = any(isinstance(v, dict) and v.get("error") for v in res.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
