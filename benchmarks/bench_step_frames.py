"""How much Python the Monitor runs per training step: frames and C calls, counted (issue 34).

On a small, fast loop most of the Monitor's cost per step is Python's own: each frame of
optcheck's hooks (a call with its arguments, attribute reads, the interpreter's dispatch) costs
0.2-0.6 µs on this project's 2-core machine, far more than the C-level maps over the
parameters. This counts them with ``sys.setprofile`` over ``--steps`` training steps of the
loop of ``benchmarks/bench_small_loop.py`` (a character-level causal Transformer, 30 parameter
tensors, AdamW with two param groups, ``clip_grad_norm_``, ``LambdaLR``, 1 thread), once without
optcheck and once per configuration, and prints the difference per step: a count, the same on a
loaded and an idle machine, unlike a time. Steps with a snapshot are left out (``every`` is
larger than the steps counted) and no step is armed (the steps counted come after the first).

    python benchmarks/bench_step_frames.py                  # auto and off, the 30 largest items
    python benchmarks/bench_step_frames.py --configs off --top 80
    PYTHONPATH=/other/checkout python benchmarks/bench_step_frames.py   # another optcheck
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import sysconfig
import tempfile

CONFIGS = {"auto": {"hazards": "auto"}, "off": {"hazards": False}}


def count(step, steps: int) -> collections.Counter:
    """Python frames ("py" keys: file, function) and C calls ("C" keys) per step over ``steps`` steps."""
    seen: collections.Counter = collections.Counter()
    prefixes = sorted({os.path.dirname(os.path.dirname(os.__file__)) + os.sep, sysconfig.get_paths()["purelib"] + os.sep,
                       os.getcwd() + os.sep}, key=len, reverse=True)

    def short(path: str) -> str:
        for p in prefixes:
            if path.startswith(p):
                return path[len(p):]
        return path

    def profile(frame, event, arg):
        if event == "call":
            seen[("py", f"{short(frame.f_code.co_filename)}:{frame.f_code.co_name}")] += 1
        elif event == "c_call":
            seen[("C", getattr(arg, "__qualname__", repr(arg)))] += 1

    sys.setprofile(profile)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.setprofile(None)
    return collections.Counter({k: v / steps for k, v in seen.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="auto,off", help="comma-separated: auto, off")
    ap.add_argument("--steps", type=int, default=20, help="steps counted (after 30 warm-up steps and 5 watched)")
    ap.add_argument("--top", type=int, default=30, help="the largest items listed per configuration")
    args = ap.parse_args()
    import optcheck

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_small_loop import build_loop  # the same loop as the timed benchmark

    model, opt, step = build_loop(1000)
    for _ in range(30):
        step()
    plain = count(step, args.steps)
    print(f"optcheck from {os.path.dirname(os.path.dirname(optcheck.__file__))}; {args.steps} steps counted")
    for name in args.configs.split(","):
        with tempfile.TemporaryDirectory() as out:
            mon = optcheck.Monitor(model, opt, every=10**6, out=os.path.join(out, "run"), on_finding="ignore",
                                   ignore_config=False, **CONFIGS[name])
            for _ in range(5):  # past the first (armed) step
                step()
            watched = count(step, args.steps)
            mon.close()
        extra = {k: watched.get(k, 0) - plain.get(k, 0) for k in set(watched) | set(plain)}
        frames = sum(v for (kind, _), v in extra.items() if kind == "py")
        calls = sum(v for (kind, _), v in extra.items() if kind == "C")
        print(f"\n{name}: {frames:.1f} Python frames and {calls:.1f} C calls more per step than the plain loop")
        for (kind, where), v in sorted(extra.items(), key=lambda kv: -abs(kv[1]))[:args.top]:
            if v:
                print(f"  {v:6.1f}  {kind:2s} {where}")


if __name__ == "__main__":
    main()
