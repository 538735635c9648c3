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
    python benchmarks/bench_small_loop.py --steps 1000 --rounds 5 --lockstep 10   # configurations side by side
    python benchmarks/bench_small_loop.py --components auto --steps 1000   # where the Monitor's time goes
    PYTHONPATH=/other/checkout python benchmarks/bench_small_loop.py ...   # another optcheck

Instruction counts (valgrind's callgrind, ``benchmarks/callgrind.py``: the same count on a
quiet and a loaded machine; about 1,000 times slower here, so 20 steps, ``every=10``):

    python benchmarks/bench_small_loop.py --components auto,off --instructions --steps 20 --every 10 --jobs 3
    python benchmarks/bench_small_loop.py --components auto,off,auto@base,off@base --instructions \
        --steps 20 --every 10 --jobs 3 --baseline-tree /other/checkout     # (auto@/a/checkout: that one)
    python benchmarks/bench_small_loop.py --instructions --steps 60        # whole loops only, no piece wrapped
    python benchmarks/bench_small_loop.py --instructions --cache-sim --configs plain,auto,off --steps 200 --jobs 2
                                                                   # ... and the simulated caches' misses

(Over 400 lines: the loop, its timed rounds and its two instruction-count modes share the
loop and the table of pieces; the callgrind plumbing itself is ``benchmarks/callgrind.py``.)

Configurations: ``plain``; ``plain2`` (the plain loop again, in a process of its own: what two
processes running the same loop differ by; ``--configs plain,plain2,auto,off``); ``auto``
(``Monitor(every=100)``: every probe, ``hazards="auto"``, the default); ``off``
(``Monitor(every=100, hazards=False)``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

#: plain2: the plain loop again in a process of its own (the floor of the method: two processes running the
#: same loop side by side differ by a few per cent, ``bench_paired.py``)
CONFIGS = {"plain": None, "plain2": None, "auto": {"hazards": "auto"}, "off": {"hazards": False}}
SEQ, BATCH, WIDTH, LAYERS, HEADS = 32, 8, 64, 2, 4


def build_loop(total: int, device: str = "cpu", bound: bool = False):
    """The loop's model, optimizer and one training step (``step()`` returns the loss), its
    schedule ``total`` steps long: the module docstring's loop (``bench_step_frames.py`` runs it too);
    ``device``: where the model and each batch live (the corpus and the sampling stay on the CPU).
    ``bound``: the step calls ``torch.autograd.backward`` and ``clip_grad_norm_`` as they are
    now, not as they are when it runs (``bench_twins.py``'s plain twin: a Monitor made later
    wraps them and ``Tensor.backward``, and its wrappers must not be on this loop's path;
    ``Tensor.backward`` itself looks ``torch.autograd.backward`` up at each call)."""
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

    model = CharTransformer().to(device)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and n != "pos"]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and n != "pos")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    g = torch.Generator().manual_seed(0)
    update = updater(model, opt, sched, bound)  # (backward and clip bound now, before any Monitor)

    def step():
        i = torch.randint(0, len(data) - SEQ - 1, (BATCH,), generator=g)
        x = torch.stack([data[j:j + SEQ] for j in i.tolist()])
        y = torch.stack([data[j + 1:j + SEQ + 1] for j in i.tolist()])
        if device != "cpu":
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        update(loss)
        return loss

    return model, opt, step


def updater(model, opt, sched, bound: bool):
    """The update half of a benchmark step, ``update(loss)``: ``zero_grad``, backward, clip to
    1.0, ``opt.step()``, ``sched.step()``. ``bound``: ``torch.autograd.backward`` and
    ``clip_grad_norm_`` as they are now (call before the Monitor exists), else looked up per step."""
    import torch

    backward, clip = torch.autograd.backward, torch.nn.utils.clip_grad_norm_

    def update(loss) -> None:
        opt.zero_grad(set_to_none=True)
        if bound:
            backward(loss)
            clip(model.parameters(), 1.0)
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()

    return update


def child(config: str, steps: int, every: int, out: str, marks=None, calibrate: bool = False) -> dict:
    """One configuration's run (see the module docstring); under callgrind (``marks``, a
    ``callgrind.Marks``) the counts are dumped after the calibration ("calibrate"), after
    ``Monitor()`` ("ctor") and after the loop ("loop")."""
    model, opt, step = build_loop(steps + 20)

    for _ in range(20):
        step()
    mon, ctor_cpu, ctor_wall, import_cpu = None, 0.0, 0.0, 0.0
    if marks is None and IN_CALLGRIND:
        import callgrind

        marks = callgrind.Marks()
    if CONFIGS[config] is not None:  # (imported before counting starts)
        import optcheck  # noqa: F401
    if marks is not None:
        marks.start()
        if calibrate:
            marks.calibrate(CALIBRATE)
        marks.dump("calibrate")
    if CONFIGS[config] is not None:
        c0 = time.process_time()
        import optcheck

        Monitor = optcheck.Monitor  # (its modules are imported here, once per process)
        import_cpu = time.process_time() - c0
        c0, t0 = time.process_time(), time.perf_counter()
        mon = Monitor(model, opt, every=every, out=out, on_finding="ignore", ignore_config=False, **CONFIGS[config])
        ctor_cpu, ctor_wall = time.process_time() - c0, time.perf_counter() - t0
    if marks is not None:
        marks.dump("ctor")
    prof = None
    if os.environ.get("BENCH_PROFILE"):  # cProfile of the timed loop into that file (not for timings)
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    c0, t0 = time.process_time(), time.perf_counter()
    gate = _Gate.from_env()
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(steps):
        if gate is not None and i % gate.block == 0:
            gate.wait()  # (blocked: no CPU time counted; the other configurations' children run)
        loss = step() if _ON_STEP is None else _ON_STEP(step, mon)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0  # fresh pages the loop took from the kernel
    if gate is not None:
        gate.done()
    if marks is not None:
        marks.dump("loop")
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.environ["BENCH_PROFILE"])
    res = {"config": config, "cpu_s": cpu, "wall_s": wall, "ctor_cpu_s": ctor_cpu, "ctor_wall_s": ctor_wall,
           "import_cpu_s": import_cpu, "faults_per_step": faults / max(steps, 1),
           "loss": loss.item(), "params": len(list(model.parameters()))}
    if mon is not None:
        sm = mon.close()
        res.update(own_us=sm["cost"]["steps"]["mean_us"], findings=len(mon.findings),
                   snapshots=sm["cost"]["snapshots"], hazards=sm.get("hazards"))
    return res


def config_env(c: str, baseline_tree: str | None) -> tuple[str, dict]:
    """A configuration's name and its child's environment: ``auto@base`` runs ``--baseline-tree``'s
    optcheck, ``auto@/some/checkout`` that checkout's (``PYTHONPATH``); a plain name, this one's."""
    name, _, tree = c.partition("@")
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = str(Path(tree if "/" in tree else baseline_tree).resolve())
    return name, env


class _Gate:
    """--lockstep: a child runs its timed loop in blocks of ``block`` steps, each when the parent
    says so (one byte on ``rfd``), and says it is waiting again (one byte on ``wfd``). The parent
    lets the configurations' children run one block each in turn, so a slow spell of the machine
    (other processes, the host) falls on all of them alike instead of on one round."""

    def __init__(self, rfd: int, wfd: int, block: int):
        self.rfd, self.wfd, self.block = rfd, wfd, block

    @classmethod
    def from_env(cls) -> "_Gate | None":
        spec = os.environ.get("BENCH_GATE")
        return cls(*map(int, spec.split(","))) if spec else None

    def wait(self) -> None:
        os.write(self.wfd, b"r")
        if os.read(self.rfd, 1) != b"g":
            raise SystemExit("lockstep: the parent went away")

    def done(self) -> None:
        os.write(self.wfd, b"e")


def lockstep_round(configs: list[str], steps: int, every: int, block: int, tmp: str, r: int,
                   baseline_tree: str | None) -> dict[str, dict]:
    """One round of --lockstep: every configuration's child started at once; after their
    set-up (the first "r"), blocks of ``block`` steps run one child at a time, the order
    rotated each block; returns each child's result."""
    procs = {}
    for c in configs:
        name, env = config_env(c, baseline_tree)
        from_parent, to_child = os.pipe()
        from_child, to_parent = os.pipe()
        env["BENCH_GATE"] = f"{from_parent},{to_parent},{block}"
        p = subprocess.Popen([sys.executable, __file__, "--child", name, "--steps", str(steps), "--every",
                              str(every), "--out", str(Path(tmp) / f"{c}-{r}")], stdout=subprocess.PIPE,
                             text=True, env=env, pass_fds=(from_parent, to_parent))
        os.close(from_parent)
        os.close(to_parent)
        procs[c] = (p, to_child, from_child)
    for c, (_, _, rd) in procs.items():  # every child set up and waiting
        if os.read(rd, 1) != b"r":
            raise SystemExit(f"lockstep: {c} ended before its loop")
    live = list(configs)
    k = 0
    while live:
        order = live[k % len(live):] + live[:k % len(live)]
        k += 1
        for c in order:
            _, wr, rd = procs[c]
            os.write(wr, b"g")
            if os.read(rd, 1) != b"r":  # "e": its loop is over
                live.remove(c)
    out = {}
    for c, (p, wr, rd) in procs.items():
        stdout, _ = p.communicate()
        os.close(wr)
        os.close(rd)
        if p.returncode:
            raise SystemExit(f"lockstep: {c} exited {p.returncode}")
        out[c] = json.loads(stdout.strip().splitlines()[-1])
    return out


# (label, class path, method, parent label or None): the pieces of the Monitor's per-step work
# timed one by one (their parents include them)
PIECES = (
    ("before_backward", "optcheck.drivers.monitor:Monitor", "before_backward", None),
    ("  hazards.check_loss", "optcheck.pytorch.hazards:HazardProbes", "check_loss", "before_backward"),
    ("  grad_clear.before_backward", "optcheck.pytorch.grad_clear:GradClearProbe", "before_backward",
     "before_backward"),
    ("after_backward", "optcheck.drivers.monitor:Monitor", "after_backward", None),
    ("  grad_clear.after_backward", "optcheck.pytorch.grad_clear:GradClearProbe", "after_backward",
     "after_backward"),
    ("  hazards.after_backward", "optcheck.pytorch.hazards:HazardProbes", "after_backward", "after_backward"),
    ("ClipNorm.record (clip total kept; OC207's shortcut)", "optcheck.pytorch.monitor_hooks:ClipNorm", "record",
     None),
    ("Monitor._pre_step", "optcheck.drivers.monitor:Monitor", "_pre_step", None),
    ("  hazards.check_grads_before_step (OC501)", "optcheck.pytorch.hazards:HazardProbes",
     "check_grads_before_step", "Monitor._pre_step"),
    ("  Sequencer.pre_step (identity fingerprint)", "optcheck.run.sequencer:Sequencer", "pre_step",
     "Monitor._pre_step"),
    ("GradClearProbe._before_step (OC207)", "optcheck.pytorch.grad_clear:GradClearProbe", "_before_step", None),
    ("HazardProbes._before_step", "optcheck.pytorch.hazards:HazardProbes", "_before_step", None),
    ("HazardProbes._after_step (arrival judged, step counted)", "optcheck.pytorch.hazards:HazardProbes",
     "_after_step", None),
    ("GradClearProbe._after_step (OC204, OC208)", "optcheck.pytorch.grad_clear:GradClearProbe", "_after_step",
     None),
    ("Monitor._post_step (step end; snapshots left out)", "optcheck.drivers.monitor:Monitor", "_post_step", None),
    ("  step context entered (arming decided)", "optcheck.pytorch.hazards.hooks:_StepContext", "__enter__",
     "Monitor._post_step (step end; snapshots left out)"),
    ("  step context left", "optcheck.pytorch.hazards.hooks:_StepContext", "__exit__",
     "Monitor._post_step (step end; snapshots left out)"),
    ("replay pass log (the model's forward pre-hook)", "optcheck.pytorch.hazards.replay:ForwardReplay",
     "_log_pass", None),
    ("snapshot", "optcheck.run.sequencer:Sequencer", "take", None),
)
# callgrind slots: the empty callable; whole steps: armed, quiet (neither armed nor with a snapshot), with a
# cadence snapshot; a piece K runs in slot K on a quiet step and in slot NOISY + K on the others
SNAP_STEP, CALIBRATE, ARMED, UNARMED = 28, 29, 30, 31
NOISY = 32
_NOISY = [0]  # the running step's slot offset (0 or NOISY), set by the step's wrapper


def _resolve(path: str):
    import importlib

    mod, _, name = path.partition(":")
    return getattr(importlib.import_module(mod), name)


def components(config: str, steps: int, every: int, instructions: bool = False) -> None:
    """Each piece's cost per call inside the running loop, summed per step: CPU time
    (``time.thread_time_ns`` around it: cache effects and the timer's own ~1 µs per read
    included; median per call), or with ``instructions`` callgrind's instruction count
    (run under valgrind by :func:`components_instructions`). Snapshots apart (one per
    ``every`` steps, the start snapshot left out); armed steps against unarmed ones."""
    import optcheck
    from optcheck.run import sequencer

    marks = None
    if instructions:
        import callgrind

        marks = callgrind.Marks()
    times: dict[str, list[int]] = {}
    slot_of = {label: k for k, (label, *_rest) in enumerate(PIECES)}

    def timed(fn, label):
        if marks is not None:
            k = slot_of[label]

            def wrapper(*a, **kw):
                return marks.slot(k + _NOISY[0], fn, *a, **kw)
            return wrapper

        def wrapper(*a, **kw):
            t = time.thread_time_ns()
            try:
                return fn(*a, **kw)
            finally:
                times.setdefault(label, []).append(time.thread_time_ns() - t)
        return wrapper

    saved = []
    if config != "plain":
        for label, cls_path, name, _parent in PIECES:
            cls = next(c for c in _resolve(cls_path).__mro__ if name in c.__dict__)  # where it is defined
            fn = cls.__dict__[name]
            if isinstance(fn, staticmethod):
                fn = fn.__func__
            saved.append((cls, name, fn))
            setattr(cls, name, timed(fn, label))
    per_step: list[int] = []
    armed: list[bool] = []
    global _ON_STEP
    if marks is not None:
        def on_step(step, mon):
            a = bool(getattr(getattr(mon, "hazards", None), "armed", False))
            snap = mon is not None and (mon.step_count + 1) % mon.every == 0  # (a clean run: cadence only)
            armed.append(a)
            _NOISY[0] = NOISY if (a or snap) else 0
            return marks.slot(ARMED if a else SNAP_STEP if snap else UNARMED, step)
        _ON_STEP = on_step
    else:
        def on_step(step, mon):
            a = bool(getattr(getattr(mon, "hazards", None), "armed", False))
            t = time.thread_time_ns()
            loss = step()
            per_step.append(time.thread_time_ns() - t)
            armed.append(a)
            return loss
        _ON_STEP = on_step
    try:
        res = child(config, steps, every, None, marks=marks, calibrate=marks is not None)
        if marks is not None:
            res["calls"] = marks.calls
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)
    if marks is not None:  # the parent reads the counts from the dumps
        print(json.dumps({"armed": sum(armed), "steps": len(armed), **res}))
        return
    print(f"{config}: {steps} steps, every={every}, 1 thread, load {os.getloadavg()[0]:.2f}")
    total = 0.0
    for label, ts in times.items():
        if label == "snapshot":
            continue
        us = statistics.median(ts) / 1e3 * len(ts) / steps
        parent = next(p for lb, _c, _n, p in PIECES if lb == label)
        total += us if parent is None else 0.0
        print(f"  {label:70s} {us:7.1f} µs/step")
    snaps = times.get("snapshot", [])[1:]  # (the first is Monitor()'s start snapshot)
    if snaps:
        us = statistics.median(snaps) / 1e3 / every
        total += us
        print(f"  {'snapshots: median ' + f'{statistics.median(snaps) / 1e6:.2f} ms, one per every steps':70s} "
              f"{us:7.1f} µs/step")
    on = [t for t, a in zip(per_step, armed) if a]
    off = [t for t, a in zip(per_step, armed) if not a]
    if on and off:
        extra = (statistics.median(on) - statistics.median(off)) / 1e3
        us = extra * len(on) / len(per_step)
        total += us
        print(f"  {f'armed steps: {len(on)} of {len(per_step)}, each {extra:.0f} µs over an unarmed one':70s} "
              f"{us:7.1f} µs/step")
    print(f"  {'total (top-level rows)':70s} {total:7.1f} µs/step; unarmed step median "
          f"{statistics.median(off or per_step) / 1e3:.0f} µs")


def components_instructions(configs: list[str], steps: int, every: int, baseline_tree: str | None) -> None:
    """:func:`components` with instruction counts: the plain loop once, then each of
    ``configs`` (``auto``, ``off``; ``auto@base``: the same with ``baseline_tree``'s optcheck;
    ``auto@/a/checkout``: that one's), each once under callgrind.

    Steps fall in three classes: armed, with a cadence snapshot, and quiet (neither: the
    steady state, 985 of 1,000 steps at ``every=100``). Each piece is counted apart on quiet
    steps (its own slot) and on the others; each whole step's extra over the plain loop's
    mean step, per class. What no piece covers on a quiet step (the backward wrapper and
    the step hooks' dispatch, PyTorch's slower path for hooked calls) is the quiet step's
    extra less its pieces. The projection to 1,000 steps at ``every=100``: the quiet step's
    extra on 1,000 - 10 - ``ARMED_PER_1000`` steps, a snapshot step's on 10, an armed
    step's on ``ARMED_PER_1000``."""
    import tempfile

    import callgrind

    from concurrent.futures import ThreadPoolExecutor

    def one(c: str, tmp: str):
        name, env = config_env(c, baseline_tree)
        d = str(Path(tmp) / c.replace("/", "_"))
        counts, files, out = callgrind.run_full([__file__, "--components", name, "--instructions", "--in-callgrind",
                                                 "--steps", str(steps), "--every", str(every)], d, env=env)
        info = json.loads(out.strip().splitlines()[-1])
        print(f"({c}: {counts['loop'] / steps / 1e6:.3f} M instructions per step in the loop)", flush=True)
        return counts, info, callgrind.inclusive(files["loop"]), callgrind.inclusive(files["calibrate"])

    def kept_plain(folder: str):
        """The plain run's dumps kept from an earlier run of this command (``--plain-dumps``):
        the plain loop does not depend on optcheck's code."""
        totals, files = {}, {}
        for f in sorted(Path(folder).glob("callgrind.out.*")):
            m = re.search(r"^desc: Trigger: Client Request: (.*)$", f.read_text(errors="replace"), re.M)
            t = re.search(r"^totals: (\d+)", f.read_text(errors="replace"), re.M)
            if m and t:
                totals[m.group(1).strip()], files[m.group(1).strip()] = int(t.group(1)), f
        calls = [0] * 64
        calls[UNARMED], calls[CALIBRATE] = steps, 200
        return totals, {"calls": calls, "armed": 0, "steps": steps}, callgrind.inclusive(files["loop"]), \
            callgrind.inclusive(files["calibrate"])

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(JOBS[0]) as pool:  # counts: load-independent
        runs = configs if PLAIN_DUMPS[0] else ["plain", *configs]
        futures = {c: pool.submit(one, c, tmp) for c in runs}
        res = {"plain": kept_plain(PLAIN_DUMPS[0])} if PLAIN_DUMPS[0] else {}
        res.update({c: f.result() for c, f in futures.items()})
    cal = [res[c][3].get(CALIBRATE, 0) / max(1, res[c][1]["calls"][CALIBRATE]) for c in res]
    over = statistics.median(cal)  # one trampoline's own instructions (the same code in every run)
    pc, pinfo, pincl, _ = res["plain"]
    plain_step = (pincl.get(UNARMED, 0) - over * steps) / steps  # (every plain step runs in the quiet slot)
    print(f"{steps} steps, every={every}, 1 thread; instructions (callgrind Ir), each run once (deterministic); "
          f"trampoline {over:.0f} instructions per call taken off; plain step {plain_step / 1e6:.3f} M")
    snap_k = slot_of_snapshot()
    nested: dict[str, list[int]] = {}
    for k, (label, _c, _n, parent) in enumerate(PIECES):
        if parent is not None:
            nested.setdefault(parent, []).append(k)
    table: dict[str, dict[str, float]] = {}
    summary = {}
    for c in configs:
        cc, cinfo, cincl, _ = res[c]
        calls = cinfo["calls"]
        n_armed, n = cinfo["armed"], cinfo["steps"]
        n_snap = calls[SNAP_STEP]
        n_quiet = calls[UNARMED]

        def step_extra(k, count, inner_calls):
            return ((cincl.get(k, 0) - over * (count + inner_calls)) / count - plain_step) if count else 0.0

        per_class_calls = {}
        for k in range(len(PIECES)):
            per_class_calls[k] = (calls[k], calls[NOISY + k])
        top_quiet = 0.0
        for k, (label, _c, _n, parent) in enumerate(PIECES):
            if k == snap_k:
                continue
            q = calls[k]
            inner = sum(calls[j] for j in nested.get(label, []))
            ir = cincl.get(k, 0) - over * (q + inner)
            if parent is None:
                top_quiet += ir
            if q or calls[NOISY + k]:
                table.setdefault(label, {})[c] = ir / max(1, n_quiet)
        quiet_calls = sum(calls[k] for k in range(len(PIECES)))
        quiet_extra = step_extra(UNARMED, n_quiet, quiet_calls)
        table.setdefault("the rest (backward wrapper, step-hook dispatch, ...)", {})[c] = \
            quiet_extra - top_quiet / max(1, n_quiet)
        table.setdefault("**a quiet step in all**", {})[c] = quiet_extra
        noisy_calls = sum(calls[NOISY + k] for k in range(len(PIECES)))
        # (the pieces' trampolines of noisy steps split between the two classes by their count)
        armed_extra = step_extra(ARMED, n_armed, noisy_calls * n_armed / max(1, n_armed + n_snap))
        snap_extra = step_extra(SNAP_STEP, n_snap, noisy_calls * n_snap / max(1, n_armed + n_snap))
        snaps = calls[NOISY + snap_k]  # (the quiet slot's calls are Monitor()'s and close()'s, outside the loop)
        snap_ir = (cincl.get(NOISY + snap_k, 0) - over * snaps) / max(1, snaps)
        quiet_n = 1000 - 10 - ARMED_PER_1000
        projected = (quiet_extra * quiet_n + snap_extra * 10 + armed_extra * ARMED_PER_1000) / 1000
        total = (cc["loop"] - pc["loop"] - over * (quiet_calls + noisy_calls)) / steps
        summary[c] = dict(quiet=quiet_extra, n_quiet=n_quiet, snap_step=snap_extra, n_snap=n_snap, snap=snap_ir,
                          armed=armed_extra, n_armed=n_armed, n=n, projected=projected, total=total,
                          ctor=cc.get("ctor", 0) - pc.get("ctor", 0))
    print("| on a quiet step: piece (instructions per step) | " + " | ".join(configs) + " |")
    print("|---|" + "---:|" * len(configs))
    for label, by in table.items():
        print(f"| {label} | " + " | ".join(f"{by[c]:,.0f}" if c in by else "-" for c in configs) + " |")
    print()
    print(f"| per configuration | " + " | ".join(configs) + " |")
    print("|---|" + "---:|" * len(configs))
    rows = (("quiet step's extra, % of the plain step (steps)",
             lambda s: f"{100 * s['quiet'] / plain_step:.2f} % ({s['n_quiet']})"),
            ("a step with a cadence snapshot: its extra, M (steps)", lambda s: f"{s['snap_step'] / 1e6:.2f} ({s['n_snap']})"),
            ("... of which the snapshot, M", lambda s: f"{s['snap'] / 1e6:.2f}"),
            ("an armed step: its extra, M (steps)", lambda s: f"{s['armed'] / 1e6:.2f} ({s['n_armed']})"),
            ("this run's loop: Monitor's extra per step, % of plain", lambda s: f"{100 * s['total'] / plain_step:.2f} %"),
            (f"projected: 1,000 steps at every=100 ({ARMED_PER_1000} armed), instruction ratio",
             lambda s: f"{1 + s['projected'] / plain_step:.4f}x"),
            ("Monitor() (start snapshot, census), M instructions", lambda s: f"{s['ctor'] / 1e6:.0f}"))
    for label, fmt in rows:
        print(f"| {label} | " + " | ".join(fmt(summary[c]) for c in configs) + " |")


#: armed steps of a 1,000-step run at every=100 with hazards="auto" (the first step, and the steps after
#: the 1st, 2nd, 4th and 8th snapshot: optcheck/pytorch/hazards/hooks.py, HazardProbes.drain)
ARMED_PER_1000 = 5


def slot_of_snapshot() -> int:
    return next(k for k, (label, *_r) in enumerate(PIECES) if label == "snapshot")


def instructions_ratio(configs: list[str], steps: int, every: int, baseline_tree: str | None,
                       cache_sim: bool = False) -> None:
    """Each configuration once under callgrind (no piece wrapped): the loop's instructions
    per step against the plain loop's, and ``Monitor()``'s own (its start snapshot); with
    ``cache_sim``, the simulated caches' misses per step as well (``callgrind.CACHE_SIM``)."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    import callgrind

    def one(c: str):
        name, env = config_env(c, baseline_tree)
        totals, files, _ = callgrind.run_full([__file__, "--child", name, "--steps", str(steps), "--every", str(every),
                                               "--out", str(Path(tmp) / f"{c}-out"), "--in-callgrind"],
                                              str(Path(tmp) / c), env=env,
                                              tool_args=callgrind.CACHE_SIM if cache_sim else ())
        return totals, callgrind.events(files["loop"]) if cache_sim else {}

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(JOBS[0]) as pool:
        rows = dict(zip(configs, pool.map(one, configs)))
    base = rows.get("plain")
    print(f"{steps} steps, every={every}, 1 thread; instructions (callgrind Ir), one run each (deterministic)")
    print("| configuration | instructions/step | ratio to plain | Monitor() (start snapshot), M instructions |")
    print("|---|---:|---:|---:|")
    for c in configs:
        per = rows[c][0]["loop"] / steps
        ratio = f"{rows[c][0]['loop'] / base[0]['loop']:.4f}x" if base else "-"
        ctor = rows[c][0].get("ctor", 0) - (base[0] if base else {}).get("ctor", 0)
        print(f"| {c} | {per / 1e6:.3f} M | {ratio} | {'-' if c == 'plain' else f'{ctor / 1e6:.0f}'} |")
    if cache_sim and base:
        names = list(base[1])
        print("\nsimulated caches (callgrind.CACHE_SIM): per step, the plain loop's count and each configuration's "
              "extra (its ratio to plain)")
        print("| event | plain | " + " | ".join(c for c in configs if c != "plain") + " |")
        print("|---|---:|" + "---:|" * (len(configs) - 1))
        for e in names:
            p = base[1][e]
            extra = [f"{(rows[c][1][e] - p) / steps:+,.0f} ({rows[c][1][e] / p:.4f}x)" if p else "-"
                     for c in configs if c != "plain"]
            print(f"| {e} | {p / steps:,.0f} | " + " | ".join(extra) + " |")


_ON_STEP = None
PLAIN_DUMPS = [None]  # --plain-dumps: a folder with an earlier plain run's callgrind dumps (same --steps)
JOBS = [1]  # --jobs: callgrind runs at once (instruction counts do not move with the load)
IN_CALLGRIND = False  # --in-callgrind: this process runs under valgrind (callgrind.run)


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
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions with valgrind's callgrind instead of timing (load-independent; "
                         "about 50x slower: use --steps 300 or so); one run per configuration")
    ap.add_argument("--jobs", type=int, default=1, help="with --instructions: callgrind runs at once")
    ap.add_argument("--cache-sim", action="store_true",
                    help="with --instructions (whole loops): simulate this machine's caches too and print each "
                         "configuration's misses per step (about 4x slower again: --steps 200 takes ~25 min)")
    ap.add_argument("--lockstep", type=int, default=0, metavar="BLOCK",
                    help="run each round's configurations side by side, BLOCK steps of one at a time in turn "
                         "(a slow spell of the machine falls on all of them alike); CPU ratio only")
    ap.add_argument("--plain-dumps", help="with --instructions --components: reuse the plain loop's callgrind dumps "
                                          "(callgrind.out.PID.1 and .3 of an earlier run with the same --steps)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--in-callgrind", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    global IN_CALLGRIND
    IN_CALLGRIND = a.in_callgrind
    JOBS[0] = max(1, a.jobs)
    PLAIN_DUMPS[0] = a.plain_dumps
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # callgrind.py beside this file
    if a.child:
        print(json.dumps(child(a.child, a.steps, a.every, a.out)))
        return
    if a.components and a.instructions and not a.in_callgrind:
        components_instructions(a.components.split(","), a.steps, a.every, a.baseline_tree)
        return
    if a.components:
        components(a.components, a.steps, a.every, instructions=a.instructions)
        return
    if a.instructions:
        configs = a.configs.split(",")
        if a.baseline_tree and not any("@" in c for c in configs):
            configs += [f"{c}@base" for c in configs if c != "plain"]
        instructions_ratio(configs, a.steps, a.every, a.baseline_tree, cache_sim=a.cache_sim)
        return
    import tempfile

    import optcheck

    configs = a.configs.split(",")
    if a.baseline_tree:
        configs += [f"{c}@base" for c in configs if c != "plain"]
    print(f"optcheck from {Path(optcheck.__file__).parent.parent}; {a.steps} steps, every={a.every}, "
          f"{a.rounds} rounds{f', in lockstep blocks of {a.lockstep} steps' if a.lockstep else ''}; "
          f"load {os.getloadavg()[0]:.2f} at start")
    rows: dict[str, list[dict]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            if a.lockstep:
                for c, res in lockstep_round(configs, a.steps, a.every, a.lockstep, tmp, r, a.baseline_tree).items():
                    rows[c].append(res)
                continue
            for c in configs:
                out = str(Path(tmp) / f"{c}-{r}")
                name, env = config_env(c, a.baseline_tree)
                p = subprocess.run([sys.executable, __file__, "--child", name, "--steps", str(a.steps), "--every",
                                    str(a.every), "--out", out], capture_output=True, text=True, check=True, env=env)
                rows[c].append(json.loads(p.stdout.strip().splitlines()[-1]))
    print(f"load {os.getloadavg()[0]:.2f} at end")
    base = rows.get("plain")
    n = rows[configs[0]][0]["params"]
    print(f"{n} parameter tensors")
    print("| configuration | plain ms/step | CPU ratio, median (min-max) | wall ratio, median | own µs/step | "
          "Monitor() CPU s (its start snapshot) | snapshots ms, median | page faults per step, median |")
    print("|---|---|---|---|---|---|---|---|")
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
        faults = statistics.median(x.get("faults_per_step", float("nan")) for x in rs)
        print(f"| {c} | {ms:.2f} | {ratio} | {wr} | {'-' if own is None else f'{own:.0f}'} | {ctor:.3f} | "
              f"{'-' if med is None else f'{med:.2f}'} | {faults:.1f} |")


if __name__ == "__main__":
    main()
