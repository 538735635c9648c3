"""What ``optcheck run`` costs a training step (issue 47), against the same script run plainly
and the same script with an ``optcheck.Monitor`` written in.

One small training script (a 2-layer causal Transformer, d 32, 16 tokens, batch 8, AdamW;
``torch.set_num_threads(1)``) is run as

- ``plain``: ``python script.py``;
- ``run``: ``python -m optcheck run --every 100 --out DIR -- python script.py`` (the watch finds
  the optimizer and opens a Monitor at its second step);
- ``monitor``: ``python script.py --monitor``: the loop inside ``with optcheck.Monitor(model,
  opt, every=100, out=DIR)``.

Each round starts each configuration once, as a fresh process, in an order rotated round by
round. The script times its own steps (``time.perf_counter_ns`` around each step, the first
``--warmup`` steps left out: start-up, imports, the Monitor's open and first snapshot are
outside the figure) and prints one JSON line: the median and mean ns per step. The ratios
``run/plain`` and ``monitor/plain`` are taken within each round (the same load), and reported
as median (min-max) over the rounds, for the median and the mean step (the mean includes the
snapshots every 100 steps).

    python benchmarks/bench_run_steps.py                    # 300 steps, 4 rounds
    python benchmarks/bench_run_steps.py --steps 300 --rounds 6 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys, time
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
STEPS, WARMUP = int(sys.argv[1]), int(sys.argv[2])
V, T, B, D = 64, 16, 8, 32
layer = torch.nn.TransformerEncoderLayer(D, 2, 4 * D, dropout=0.0, batch_first=True)
class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.pos = torch.nn.Parameter(torch.zeros(T, D))
        self.body = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(D, V)
    def forward(self, x):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
        return self.head(self.body(self.emb(x) + self.pos, mask=mask, is_causal=True))
model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
data = torch.randint(0, V, (64, T + 1))
times = []
def train():
    for step in range(STEPS):
        t0 = time.perf_counter_ns()
        batch = data[torch.randint(0, 64, (B,))]
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter_ns() - t0)
if "--monitor" in sys.argv:
    import optcheck
    with optcheck.Monitor(model, opt, every=100, out=sys.argv[3]):
        train()
else:
    train()
t = sorted(times[WARMUP:])
print(json.dumps({"median_ns": t[len(t) // 2], "mean_ns": sum(t) / len(t), "steps": len(t)}))
"""


def one(kind: str, script: Path, steps: int, warmup: int, tmp: Path, n: int) -> dict:
    """One fresh process of configuration ``kind``; the script's own JSON line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    out = tmp / f"{kind}-{n}"
    cmd = [sys.executable, str(script), str(steps), str(warmup)]
    if kind == "run":
        cmd = [sys.executable, "-m", "optcheck", "run", "--every", "100", "--out", str(out), "--", *cmd]
    elif kind == "monitor":
        cmd += [str(out), "--monitor"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    line = next(x for x in p.stdout.splitlines() if x.startswith('{"median_ns"'))
    return json.loads(line)


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f}x ({min(xs):.3f}-{max(xs):.3f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    kinds = ["plain", "run", "monitor"]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        script = tmp / "train.py"
        script.write_text(textwrap.dedent(SCRIPT))
        for r in range(a.rounds):
            order = kinds[r % 3:] + kinds[:r % 3]
            got = {k: one(k, script, a.steps, a.warmup, tmp, r) for k in order}
            rows.append(got)
            print(f"round {r + 1} ({', '.join(order)}): " + ", ".join(
                f"{k} {got[k]['median_ns'] / 1e6:.2f} ms" for k in kinds) + "; " + ", ".join(
                f"{k}/plain {got[k]['median_ns'] / got['plain']['median_ns']:.3f}x median, "
                f"{got[k]['mean_ns'] / got['plain']['mean_ns']:.3f}x mean" for k in kinds[1:]),
                file=sys.stderr, flush=True)  # each round as it ends: a run cut short keeps its rounds
    res = {"steps": a.steps, "warmup": a.warmup, "rounds": a.rounds,
           "plain_median_ms": statistics.median(r["plain"]["median_ns"] for r in rows) / 1e6,
           "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    for k in ("run", "monitor"):
        for stat in ("median_ns", "mean_ns"):
            res[f"{k}/plain {stat[:-3]}"] = [r[k][stat] / r["plain"][stat] for r in rows]
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{a.rounds} rounds of {a.steps} steps ({a.warmup} left out), plain step median "
              f"{res['plain_median_ms']:.2f} ms, load {res['load']:.1f}")
        for k in ("run", "monitor"):
            print(f"  {k}/plain: median step {spread(res[f'{k}/plain median'])}, "
                  f"mean step {spread(res[f'{k}/plain mean'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
