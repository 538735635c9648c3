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
import math
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

CONFIGS = {"auto": {"hazards": "auto"}, "off": {"hazards": False}}
SEQ, BATCH, WIDTH, LAYERS, HEADS = 32, 8, 64, 2, 4


def _loop():
    """The model, its optimizer and one training step (as ``bench_small_loop.py``'s)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = torch.tensor(list((Path(sysconfig.get_paths()["stdlib"]) / "difflib.py").read_bytes()))

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
            return self.out(self.norm(self.body(self.tok(x) + self.pos, mask=self.mask, is_causal=True)))

    model = CharTransformer()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and n != "pos"]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and n != "pos")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, 1000) / 1000)))
    g = torch.Generator().manual_seed(0)

    def step():
        i = torch.randint(0, len(data) - SEQ - 1, (BATCH,), generator=g).tolist()
        x = torch.stack([data[j:j + SEQ] for j in i])
        y = torch.stack([data[j + 1:j + SEQ + 1] for j in i])
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()

    return model, opt, step


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

    model, opt, step = _loop()
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
