"""The Monitor's added cost on the small, fast loop, step by step against a twin (issue 34).

``bench_paired.py`` pairs 100-step blocks in one process; two plain blocks there differ by
0.93-1.10x (quartiles over 30 pairs), wider than the 1.03x the issue asks to show. Here the
pairing is per step. One process builds the loop of ``bench_small_loop.py`` twice, from the
same seed (the same weights, batches and schedule): twin A is watched, twin B is not. They
take their steps in turn, A then B, then B then A (the order alternates every step), each
step timed alone (``time.process_time_ns``: the process's CPU time, so work on another
thread counts). A change of load or clock falls on both twins within milliseconds, and the
difference of a pair is what A's watcher added to that step, plus noise that averages out:
over 1,000 pairs the mean difference is known to about ±20 µs (95 %) on a 7 ms step.

- ``plain``: nothing watches A (the method's own floor: its interval should hold 0);
- ``burn``: A's optimizer has a step post-hook that spins ``--burn-us`` of CPU time (the
  method's accuracy: it should read about that);
- ``fused``: ``bench_floor.py``'s floor watcher on A (the reads a quiet step needs, in one pass
  at each of the Monitor's entry points, one host read per ``every`` steps; it judges nothing);
- ``fused-no-fingerprint``, ``fused-ids-only``, ``fused-no-arrival``, ``fused-arrival-hooks``,
  ``fused-no-copy``: ``fused`` less one of its reads, or with arrival read by hooks
  (``bench_floor.ABLATIONS``; named in ``--configs`` only): what each read costs in the loop;
  ``fused-hazards``: ``fused`` plus the least the hazard probes must do on an unarmed step
  (``bench_floor.py``), the floor of ``auto``;
- ``off`` / ``auto``: ``optcheck.Monitor(every=...)`` on A with ``hazards=False`` / every
  probe (``bench_small_loop.CONFIGS``), made after the warm-up steps, outside the timed loop;
- ``run``: A watched as ``optcheck run`` watches a script (issue 47): the global hooks of
  ``optcheck.autowatch.attach.AutoWatch`` installed after the warm-up, B left to itself
  (``AutoWatch.leave``), A's Monitor (``hazards="auto"``) opened by them at A's next steps
  (two untimed steps). Against ``auto`` it reads what attaching through torch's global hooks
  adds to the Monitor's cost.

``--compile BACKEND`` (issue 45): each twin's whole train step (forward, ``backward()``,
``clip_grad_norm_``, ``optimizer.step()``, ``zero_grad()``, the scheduler) is
``torch.compile(step, backend=BACKEND)``, as a user compiles a train step; after A's watcher is
made both twins take 5 more untimed steps (a recompile the watcher's hooks cause is not timed).
The Monitor then counts and snapshots its steps at the next ``backward()``
(``optcheck/pytorch/dynamo_safe.py``).

B is built before the Monitor with ``build_loop(..., bound=True)``: its step calls
``torch.autograd.backward`` and ``clip_grad_norm_`` as they were then, so the Monitor's
wrappers are not on B's path (``loss.backward()`` would not do: ``Tensor.backward`` looks
``torch.autograd.backward`` up at each call, and would reach the wrapper; a test holds B's
steps to adding nothing to the Monitor's own timer). What does reach B: the Monitor's global optimizer step hooks
(it follows optimizer switches, ``optcheck/pytorch/step_hooks.py``), which return at once
for an optimizer over other parameters (a few µs; it lowers the difference by that). The
twins' memory is twice one loop's, so each step starts with colder caches than in a loop
alone: the reads of a watcher miss more, which makes the figures here an upper bound rather
than a lower one.

Per configuration, over all pairs of all rounds (each round a fresh process per
configuration, configurations interleaved; which twin is built first alternates from round to
round, so that where their tensors land in memory does not favour one):

- the run's ratio ``ΣA / ΣB`` with its 95 % interval (from the pairs' differences, Student's t):
  snapshots, armed steps and quiet steps together, as a 1,000-step run at ``every`` has them;
- a quiet step's added time: the mean difference over the steps that take no cadence snapshot
  and are not the step after one (``auto`` arms it), with its 95 % interval, and the median;
- the Monitor's own timer (``summary.json``'s ``cost.steps``) for comparison: it counts the
  time inside optcheck's hooks, including reads the user's code would otherwise pay for
  (the first read of each new ``.grad``: ``bench_grad_objects.py``).

    python benchmarks/bench_twins.py                                   # plain, burn, fused, off, auto, run; 3 rounds of 1,000 pairs
    python benchmarks/bench_twins.py --configs off --rounds 5 --steps 2000
    python benchmarks/bench_twins.py --configs plain,auto,run --rounds 4 --steps 1000   # optcheck run against Monitor
    python benchmarks/bench_twins.py --loop llama-lora --configs plain,off,auto --steps 200 --rounds 2 --every 10
    python benchmarks/bench_twins.py --configs plain,off,auto --compile aot_eager --rounds 1 --steps 150 --every 50
    python benchmarks/bench_twins.py --configs plain,fused,fused-no-fingerprint,fused-ids-only,fused-no-arrival,\
fused-arrival-hooks,fused-no-copy --rounds 3 --steps 2000      # the floor watcher's reads, one at a time
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_small_loop import CONFIGS  # noqa: E402  (the loop, written for issue 34)

#: ``--loop``: the module whose ``build_loop`` makes the twins (``small``: ``bench_small_loop.py``;
#: ``llama-lora``: ``llama_lora_loop.py``, tiny Llama + PEFT LoRA, issue 46)
LOOPS = {"small": "bench_small_loop", "llama-lora": "llama_lora_loop"}

TWIN_CONFIGS = ("plain", "burn", "fused", "off", "auto", "run")
#: on request only: ``fused`` less one of its reads (``bench_floor.ABLATIONS``), and ``fused-hazards``
ABLATION_CONFIGS = ("fused-no-fingerprint", "fused-ids-only", "fused-no-arrival", "fused-arrival-hooks", "fused-no-copy",
                    "fused-hazards")


def spin(us: float) -> None:
    """Burn ``us`` microseconds of this thread's CPU time."""
    end = time.thread_time_ns() + int(us * 1e3)
    while time.thread_time_ns() < end:
        pass


def child(config: str, steps: int, every: int, burn_us: float, built_first: str = "a", loop: str = "small",
          compile_backend: str | None = None) -> dict:
    """One process: the twins of ``loop`` (:data:`LOOPS`; ``built_first`` of them first; each
    whole train step compiled with ``compile_backend`` if given), 20 warm-up steps each, A's
    watcher, then ``steps`` pairs timed.
    Returns ``{"a": [ns per step], "b": [...], "own_us": ..., "armed": ..., "same_weights": ...}``
    (the twins' weights bit-equal at the end: the watcher changed nothing A computed)."""
    import importlib

    import torch

    build_loop = importlib.import_module(LOOPS[loop]).build_loop
    # the schedule outlasts every step taken (20 warm-up, up to 7 untimed, ``steps``): its learning rate
    # never reaches 0, where a compiled AdamW step turns the rows that get no gradient into NaN (torch
    # 2.13, CPU, aot_eager; eager keeps them: docs/guide/monitor.md, "torch.compile")
    total = steps + 30
    if built_first == "a":
        a_model, a_opt, a_step = build_loop(total)
        b_model, b_opt, b_step = build_loop(total, bound=True)
    else:
        b_model, b_opt, b_step = build_loop(total, bound=True)
        a_model, a_opt, a_step = build_loop(total)
    if compile_backend:  # each twin's whole train step compiled (its own Dynamo frames: two step functions)
        a_step, b_step = (torch.compile(f, backend=compile_backend) for f in (a_step, b_step))
    for _ in range(20):
        a_step()
        b_step()
    mon, hook, watch = None, None, None
    floor = config == "fused" or config in ABLATION_CONFIGS  # bench_floor's watchers: their own timer is own_ns
    with tempfile.TemporaryDirectory() as out:
        if config == "burn":
            hook = a_opt.register_step_post_hook(lambda *_: spin(burn_us))
        elif floor:
            from bench_floor import ABLATIONS, Watcher

            mon = ABLATIONS.get(config, Watcher)(a_model, a_opt, every, fused=True, hazards=config == "fused-hazards")
        elif config == "run":  # optcheck run's watch: torch's global hooks find A's model at its next steps
            from optcheck.autowatch.attach import AutoWatch

            watch = AutoWatch(out, every=every, hazards="auto", on_finding="ignore").install()
            watch.leave(b_opt)
            for _ in range(2):  # A's first step finds its model, its next forward opens the Monitor
                a_step()
                b_step()
            mon = watch.monitors[0]
        elif CONFIGS.get(config) is not None:
            import optcheck

            mon = optcheck.Monitor(a_model, a_opt, every=every, out=out, on_finding="ignore",
                                   ignore_config=False, **CONFIGS[config])
        for _ in range(5 if compile_backend else 0):  # (recompiles the watcher's hooks cause: not timed)
            a_step()
            b_step()
        a_ns, b_ns = [0] * steps, [0] * steps
        clock = time.process_time_ns
        for i in range(steps):
            for twin in ((0, 1) if i % 2 == 0 else (1, 0)):
                t0 = clock()
                (a_step if twin == 0 else b_step)()
                (a_ns if twin == 0 else b_ns)[i] = clock() - t0
        own, armed = None, None
        if floor:
            own = mon.own_ns / 1e3 / steps
            mon.close()
        elif mon is not None:
            own = mon.step_cost.to_dict()["mean_us"]
            summary = watch.uninstall()[0] if watch is not None else mon.close()
            armed = ((summary or {}).get("hazards") or {}).get("armed_steps")
        if hook is not None:
            hook.remove()
    same = all(torch.equal(x.detach().contiguous().view(torch.int32), y.detach().contiguous().view(torch.int32))  # bit-equal, NaN too
               if x.dtype == torch.float32 else torch.equal(x, y)
               for x, y in zip(a_model.parameters(), b_model.parameters()))
    return {"a": a_ns, "b": b_ns, "own_us": own, "armed": armed, "same_weights": same}


def interval(diffs: list[float]) -> tuple[float, float]:
    """Mean of ``diffs`` and the half-width of its 95 % interval (Student's t)."""
    from scipy import stats

    n = len(diffs)
    mean = statistics.fmean(diffs)
    if n < 2:
        return mean, math.inf
    return mean, stats.t.ppf(0.975, n - 1) * statistics.stdev(diffs) / math.sqrt(n)


def summarise(config: str, runs: list[dict], every: int) -> dict:
    """The module docstring's figures for ``config`` over ``runs`` (one per round)."""
    a = [x for r in runs for x in r["a"]]
    b = [x for r in runs for x in r["b"]]
    d = [x - y for x, y in zip(a, b)]
    mean_b = statistics.fmean(b)
    md, hw = interval(d)
    quiet = [x - y for r in runs for i, (x, y) in enumerate(zip(r["a"], r["b"]), start=1)
             if i % every not in (0, 1)]
    qd, qhw = interval(quiet)
    own = [r["own_us"] for r in runs if r["own_us"] is not None]
    return {"config": config, "pairs": len(d), "plain_ms": mean_b / 1e6, "rel": md / mean_b, "rel_hw": hw / mean_b,
            "ratio": sum(a) / sum(b), "ratio_lo": 1 + (md - hw) / mean_b, "ratio_hi": 1 + (md + hw) / mean_b,
            "quiet_us": qd / 1e3, "quiet_hw_us": qhw / 1e3, "quiet_median_us": statistics.median(quiet) / 1e3,
            "rounds": [sum(r["a"]) / sum(r["b"]) for r in runs],
            "own_us": statistics.median(own) if own else None,
            "armed": [r["armed"] for r in runs], "same_weights": all(r["same_weights"] for r in runs)}


def over_plain(row: dict, plain: dict) -> dict:
    """``row``'s figures less the ``plain`` configuration's (what A differs from B by when nothing
    watches it: the method's floor), the two intervals combined: ``ratio``, ``ratio_hw``,
    ``quiet_us``, ``quiet_hw_us``."""
    return {"ratio": 1 + row["rel"] - plain["rel"], "ratio_hw": math.hypot(row["rel_hw"], plain["rel_hw"]),
            "quiet_us": row["quiet_us"] - plain["quiet_us"],
            "quiet_hw_us": math.hypot(row["quiet_hw_us"], plain["quiet_hw_us"])}


def print_table(rows: list[dict], steps: int, every: int, burn_us: float, loop: str = "small") -> None:
    print(f"{loop} loop: {steps} pairs of steps per round, every={every}, CPU time (process), 1 thread, "
          f"load {os.getloadavg()[0]:.2f}; burn = {burn_us:.0f} µs planted")
    print("| configuration | plain twin, ms/step | ratio ΣA/ΣB (95 %) | rounds | quiet step: added µs (95 %), median "
          "| own timer µs/step | twins' weights equal |")
    print("|---|---:|---:|---|---:|---:|---|")
    for r in rows:
        own = f"{r['own_us']:.0f}" if r["own_us"] is not None else "-"
        rounds = ", ".join(f"{x:.3f}" for x in r["rounds"])
        print(f"| {r['config']} | {r['plain_ms']:.2f} | {r['ratio']:.4f}x ({r['ratio_lo']:.4f}-{r['ratio_hi']:.4f}) "
              f"| {rounds} | {r['quiet_us']:+.0f} ± {r['quiet_hw_us']:.0f}, {r['quiet_median_us']:+.0f} | {own} "
              f"| {'yes' if r['same_weights'] else 'NO'} |")
    plain = next((r for r in rows if r["config"] == "plain"), None)
    if plain is None or len(rows) < 2:
        return
    print("\nLess the plain configuration's figures (the method's floor), 95 % intervals combined:")
    print("| configuration | ratio over plain | a quiet step's added time over plain, µs |")
    print("|---|---:|---:|")
    for r in rows:
        if r is not plain:
            o = over_plain(r, plain)
            print(f"| {r['config']} | {o['ratio']:.4f}x ± {o['ratio_hw']:.4f} | {o['quiet_us']:+.0f} ± {o['quiet_hw_us']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=",".join(TWIN_CONFIGS),
                    help="comma-separated: " + ", ".join(TWIN_CONFIGS + ABLATION_CONFIGS))
    ap.add_argument("--steps", type=int, default=1000, help="pairs of steps per round")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per configuration, interleaved")
    ap.add_argument("--every", type=int, default=100, help="the Monitor's every=")
    ap.add_argument("--burn-us", type=float, default=100.0, help="the burn configuration's planted CPU time a step")
    ap.add_argument("--loop", choices=sorted(LOOPS), default="small",
                    help="the twins' loop: small (bench_small_loop.py) or llama-lora (tiny Llama + PEFT LoRA)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures and each step's times as JSON")
    ap.add_argument("--compile", metavar="BACKEND", help="compile each twin's whole train step with this "
                    "torch.compile backend (aot_eager, inductor)")
    ap.add_argument("--child", metavar="CONFIG", help=argparse.SUPPRESS)
    ap.add_argument("--built-first", choices=("a", "b"), default="a", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        json.dump(child(a.child, a.steps, a.every, a.burn_us, a.built_first, a.loop, a.compile), sys.stdout)
        return
    configs = a.configs.split(",")
    unknown = [c for c in configs if c not in TWIN_CONFIGS + ABLATION_CONFIGS]
    if unknown or a.steps < 2 or a.rounds < 1 or a.every < 2:
        sys.exit(f"bench_twins.py: error: configurations {', '.join(TWIN_CONFIGS + ABLATION_CONFIGS)}; --steps ≥ 2, "
                 f"--rounds ≥ 1, "
                 f"--every ≥ 2 (got {a.configs!r}, {a.steps}, {a.rounds}, {a.every})")
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for r in range(a.rounds):
        for c in (configs if r % 2 == 0 else configs[::-1]):
            p = subprocess.run([sys.executable, __file__, "--child", c, "--steps", str(a.steps), "--every",
                                str(a.every), "--burn-us", str(a.burn_us), "--built-first", "ab"[r % 2],
                                "--loop", a.loop] + (["--compile", a.compile] if a.compile else []),
                               capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"bench_twins.py: the {c} child failed:\n{p.stderr[-2000:]}")
            runs[c].append(json.loads(p.stdout))
    rows = [summarise(c, runs[c], a.every) for c in configs]
    print_table(rows, a.steps, a.every, a.burn_us, a.loop)
    if a.json:
        Path(a.json).write_text(json.dumps({"figures": rows, "runs": runs}))


if __name__ == "__main__":
    main()
