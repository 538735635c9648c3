"""Cost of ``optcheck soak`` against a plain training loop, in one run.

Times, each in a fresh process, with the same model, steps, seed, batches and
threads: (1) the plain loop (the default GPT and AdamW, no optcheck), (2)
``optcheck soak`` with every probe, (3) ``optcheck soak --no-hazards``. Prints
ms/step and the ratios. Training time is compared (the soak's worker reports its
own elapsed time in the final snapshot); end-to-end wall time, with process
start-up and corpus loading, is printed beside it.

    python benchmarks/bench_soak.py --steps 2000 --every 100 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAIN = r"""
import sys, time, torch
from optcheck.config import SoakConfig
from optcheck.data import BatchSchedule, load_corpus
from optcheck.pytorch.gpt import GPT, GPTConfig
from optcheck.pytorch.train import lr_at
steps, threads = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
cfg = SoakConfig(steps=steps)
corpus = load_corpus()
sched = BatchSchedule(corpus.train.size, cfg.block_size, cfg.batch_size, cfg.seed)
torch.manual_seed(cfg.seed)
model = GPT(GPTConfig(block_size=cfg.block_size, vocab_size=corpus.vocab_size, n_layer=cfg.n_layer,
                      n_head=cfg.n_head, n_embd=cfg.n_embd))
opt = model.configure_optimizers(cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), cfg.eps)
t0 = time.perf_counter()
times = []
for step in range(1, steps + 1):
    ts = time.perf_counter()
    x, y = sched.batch(corpus.train, step)
    for g in opt.param_groups:
        g["lr"] = lr_at(cfg, step)
    opt.zero_grad(set_to_none=True)
    _, loss = model(torch.from_numpy(x), torch.from_numpy(y))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    last = loss.item()
    times.append(time.perf_counter() - ts)
times.sort()
print(time.perf_counter() - t0, times[len(times) // 2])
"""


def plain(steps: int, threads: int) -> tuple[float, float, float]:
    """(training seconds, wall seconds, median step seconds) of the plain loop."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PLAIN, str(steps), str(threads)], capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), time.perf_counter() - t, float(out[1])


def soak(steps: int, every: int, threads: int, extra: list[str]) -> tuple[float, float, float]:
    """(training seconds from the final snapshot, wall seconds, median step seconds from metrics.jsonl)."""
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--steps", str(steps), "--every", str(every),
                        "--threads", str(threads), "--val-every", "0", "--out", d, *extra],
                       capture_output=True, text=True)
        wall = time.perf_counter() - t
        last = [json.loads(line) for line in Path(d, "snapshots.jsonl").read_text().splitlines()][-1]
        step_times = sorted(json.loads(line)["step_time_s"] for line in Path(d, "metrics.jsonl").read_text().splitlines())
        return last["elapsed_s"], wall, step_times[len(step_times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    rows: dict[str, list[tuple[float, float, float]]] = {"plain loop": [], "soak (all probes)": [], "soak --no-hazards": []}
    for _ in range(a.repeat):  # interleaved, so load on the machine hits all three alike
        rows["plain loop"].append(plain(a.steps, a.threads))
        rows["soak (all probes)"].append(soak(a.steps, a.every, a.threads, []))
        rows["soak --no-hazards"].append(soak(a.steps, a.every, a.threads, ["--no-hazards"]))
    base = min(v[0] for v in rows["plain loop"])
    base_wall = min(v[1] for v in rows["plain loop"])
    base_med = min(v[2] for v in rows["plain loop"])
    print(f"{a.steps} steps, --every {a.every}, {a.threads} thread(s), best of {a.repeat}")
    print("ms/step = training time / steps (snapshots included); median = median time of one training step")
    print(f"{'':22} {'ms/step':>8} {'ratio':>6} {'median':>7} {'ratio':>6} {'wall s':>7} {'wall ratio':>10}")
    for name, vals in rows.items():
        t, w, m = (min(v[i] for v in vals) for i in range(3))
        print(f"{name:22} {t / a.steps * 1e3:8.2f} {t / base:6.3f} {m * 1e3:7.2f} {m / base_med:6.3f} "
              f"{w:7.1f} {w / base_wall:10.3f}")


if __name__ == "__main__":
    main()
