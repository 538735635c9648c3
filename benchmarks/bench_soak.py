"""Cost of optcheck against the same training loop without it, in one run.

Two pairs, every run in a fresh process with the same model, steps, seed, batches
and 1 intra-op thread, interleaved in rounds (so load from other processes hits
all alike):

- the soak: (1) a plain loop (the default soak GPT and AdamW, no optcheck), (2)
  ``optcheck soak --no-hazards``, (3) ``optcheck soak`` with every probe;
- an ordinary loop written without optcheck (the zoo's GPT-ish loop,
  ``tests/integration/monitor_zoo.py``: AdamW with param groups, 4 micro-batches
  per step, bf16 autocast, gradient clipping), (4) as is, (5) under
  ``optcheck.Monitor(every=..., hazards=False)``, (6) under
  ``optcheck.Monitor(every=...)`` (every probe);
- two loops written independently of optcheck's own models, each as is, under
  ``Monitor(every=..., hazards=False)`` and under ``Monitor(every=...)``: a small GPT
  (4 blocks, 128 wide, SDPA attention, tied head, 0.8 M parameters, batch 8 x 64
  tokens; AdamW with two param groups, ``clip_grad_norm_``, a cosine LR schedule: the
  loop of issue 25) and a tiny MLP (8-64-64-4, 4.9 k parameters, batch 32; AdamW,
  no clipping), where the Monitor's fixed cost per step is largest against the step.

For each round it takes three ratios to that round's loop without optcheck: training
time per step (snapshots included; the soak worker reports its own elapsed time in
the final snapshot), the median step time (``metrics.jsonl`` for the soak, the
loop's own timer otherwise) and the CPU seconds of the training loop (the soak
worker's ``summary.json`` ``cost.train_cpu_s``; ``time.process_time()`` around the
loop otherwise: less disturbed by other processes on a shared machine than wall
time). It prints the median and the range (min-max) over rounds of each, and
optcheck's own per-step time as the run itself reports it (``cost.steps.mean_us``,
``docs/summary.md``) and the steps the hazard probes ran armed (``summary.json``'s
``hazards``; docs/hazards.md). The header names the optcheck that ran (path and git
commit) and the load average before and after. ``--always`` adds the rows with the
probes armed on every step (``soak --hazards always``, ``Monitor(hazards="always")``). Usage::

    python benchmarks/bench_soak.py --steps 1000 --monitor-steps 300 --every 100 --repeat 5

Every run is started in a session of its own, as the soak starts its worker: with
Linux's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) each
session gets its own share of the CPU, so a loop left in the benchmark's session
(shared with whatever else runs there) would be slowed by that load while the soak
worker is not; measured at load 7, that made the plain loop up to 2x slower than
the soak.

``--baseline-tree DIR`` also runs every configuration with optcheck imported from
DIR (e.g. ``git archive <commit> | tar -x -C DIR``), interleaved in the same rounds,
so that two versions are compared under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLAIN = r"""
import sys, time, torch
from optcheck.config import RunConfig, SoakConfig
from optcheck.data import BatchSchedule, load_corpus
from optcheck.pytorch.gpt import GPT, GPTConfig
from optcheck.pytorch.train import lr_at
steps, threads = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
cfg = SoakConfig(run=RunConfig(steps=steps))
corpus = load_corpus()
sched = BatchSchedule(corpus.train.size, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed)
torch.manual_seed(cfg.run.seed)
model = GPT(GPTConfig(block_size=cfg.model.block_size, vocab_size=corpus.vocab_size, n_layer=cfg.model.n_layer,
                      n_head=cfg.model.n_head, n_embd=cfg.model.n_embd))
opt = model.configure_optimizers(cfg.optimizer.lr, cfg.optimizer.weight_decay,
                                 (cfg.optimizer.beta1, cfg.optimizer.beta2), cfg.optimizer.eps)
t0, c0 = time.perf_counter(), time.process_time()
times = []
for step in range(1, steps + 1):
    x, y = sched.batch(corpus.train, step)
    ts = time.perf_counter()  # the span the soak's metrics.jsonl times (worker_loop: around train_step)
    for g in opt.param_groups:
        g["lr"] = lr_at(cfg, step)
    opt.zero_grad(set_to_none=True)
    _, loss = model(torch.from_numpy(x), torch.from_numpy(y))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.grad_clip)
    opt.step()
    last = loss.item()
    times.append(time.perf_counter() - ts)
times.sort()
print(time.perf_counter() - t0, times[len(times) // 2], time.process_time() - c0, None, None)
"""

# the zoo's train_gpt loop (tests/integration/monitor_zoo.py), timed per step; argv: steps threads every mode
ORDINARY = r"""
import contextlib, sys, time, torch
import torch.nn as nn
sys.path.insert(0, sys.argv[5])
from monitor_zoo import MiniGPT, _text
steps, threads, every, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(threads)
torch.manual_seed(0)
data, ctx, accum = _text(), 32, 4
model = MiniGPT()
decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=3e-3, betas=(0.9, 0.95))
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
gen = torch.Generator().manual_seed(0)

def get_batch():
    ix = torch.randint(len(data) - ctx - 1, (4,), generator=gen)
    return (torch.stack([data[i:i + ctx] for i in ix]), torch.stack([data[i + 1:i + ctx + 1] for i in ix]))

if mode == "none":
    mon = contextlib.nullcontext()
else:
    import optcheck
    mon = optcheck.Monitor(model, opt, every=every, hazards={"all": True, "always": "always"}.get(mode, False))
times = []
t0, c0 = time.perf_counter(), time.process_time()
with mon:
    for step in range(steps):
        ts = time.perf_counter()
        for micro in range(accum):
            x, y = get_batch()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                _, loss = model(x, y)
            loss = loss / accum
            loss.item()
            loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - ts)
times.sort()
t, cpu = time.perf_counter() - t0, time.process_time() - c0
summary = mon.summary() if mode != "none" else {}
own = (summary.get("cost") or {}).get("steps")  # optcheck's own us/step, as it reports it
hz = summary.get("hazards") or {}  # the steps the hazard probes ran armed (docs/hazards.md)
print(t, times[len(times) // 2], cpu, (own or {}).get("mean_us"),
      f"{hz['armed_steps']}/{hz['steps']}" if hz.get("steps") else None)
"""

# loops written without optcheck's models; argv: steps threads every mode
_LOOP_HEAD = r"""
import contextlib, sys, time, torch
import torch.nn as nn
import torch.nn.functional as F
steps, threads, every, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(threads)
torch.manual_seed(0)
"""
_LOOP_TAIL = r"""
if mode == "none":
    mon = contextlib.nullcontext()
else:
    import optcheck
    mon = optcheck.Monitor(model, opt, every=every, hazards=mode == "all")
times = []
t0, c0 = time.perf_counter(), time.process_time()
with mon:
    for step in range(steps):
        ts = time.perf_counter()
        train_step()
        times.append(time.perf_counter() - ts)
times.sort()
t, cpu = time.perf_counter() - t0, time.process_time() - c0
summary = mon.summary() if mode != "none" else {}
own = (summary.get("cost") or {}).get("steps")
hz = summary.get("hazards") or {}
print(t, times[len(times) // 2], cpu, (own or {}).get("mean_us"),
      f"{hz['armed_steps']}/{hz['steps']}" if hz.get("steps") else None)
"""
SMALL_GPT = _LOOP_HEAD + r"""
V, C, T, L, H, B = 96, 128, 64, 4, 4, 8

class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(C), Attn(), nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

class SmallGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln_f, self.head = nn.LayerNorm(C), nn.Linear(C, V, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return F.cross_entropy(self.head(self.ln_f(x)).view(-1, V), targets.view(-1))

model = SmallGPT()
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.95))
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
data = torch.randint(V, (20000,), generator=torch.Generator().manual_seed(1))
gen = torch.Generator().manual_seed(0)

def train_step():
    ix = torch.randint(len(data) - T - 1, (B,), generator=gen)
    x = torch.stack([data[i:i + T] for i in ix])
    y = torch.stack([data[i + 1:i + T + 1] for i in ix])
    loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
""" + _LOOP_TAIL
TINY_MLP = _LOOP_HEAD + r"""
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(0)
X = torch.randn(4096, 8, generator=gen)
Y = (X[:, 0] > 0).long() + 2 * (X[:, 1] > 0).long()

def train_step():
    ix = torch.randint(len(X), (32,), generator=gen)
    loss = F.cross_entropy(model(X[ix]), Y[ix])
    opt.zero_grad()
    loss.backward()
    opt.step()
""" + _LOOP_TAIL
LOOPS = {"small-GPT loop": SMALL_GPT, "tiny-MLP loop": TINY_MLP}

Result = tuple  # (training seconds, median step seconds, CPU seconds or nan, optcheck's own us/step or None,
#                 "armed/steps" of the hazard probes or None)


def _env(tree: str | None) -> dict:
    """The environment of a run: optcheck imported from ``tree``, by default this
    checkout's (every run starts in a neutral directory: ``python -c`` puts the
    current directory first on ``sys.path``)."""
    path = [str(tree or ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def _run(code: str, *args, tree: str | None = None) -> Result:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, check=True,
                         env=_env(tree), cwd=tempfile.gettempdir(), start_new_session=True)
    t, med, cpu, own, armed = out.stdout.split()[-5:]
    return float(t), float(med), float(cpu), None if own == "None" else float(own), None if armed == "None" else armed


def plain(steps: int, threads: int) -> Result:
    """The plain soak loop (no optcheck)."""
    return _run(PLAIN, steps, threads)


def ordinary(steps: int, threads: int, every: int, mode: str, tree: str | None = None) -> Result:
    """The zoo's GPT loop; mode none|nohaz|all|always."""
    return _run(ORDINARY, steps, threads, every, mode, ROOT / "tests" / "integration", tree=tree)


def loop(name: str, steps: int, threads: int, every: int, mode: str, tree: str | None = None) -> Result:
    """One of :data:`LOOPS`; mode none|nohaz|all."""
    return _run(LOOPS[name], steps, threads, every, mode, tree=tree)


def soak(steps: int, every: int, threads: int, extra: list[str], tree: str | None = None) -> Result:
    """Training seconds from the final snapshot, median step seconds from metrics.jsonl, the worker's
    training CPU seconds and own us/step from summary.json (nan/None from an optcheck without them)."""
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--steps", str(steps), "--every",
                               str(every), "--threads", str(threads), "--val-every", "0", "--out", d, *extra],
                              capture_output=True, text=True, env=_env(tree), cwd=d, start_new_session=True)
        snaps = Path(d, "snapshots.jsonl")
        if not snaps.exists():
            raise SystemExit(f"optcheck soak failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
        last = [json.loads(line) for line in snaps.read_text().splitlines()][-1]
        step_times = sorted(json.loads(line)["step_time_s"] for line in Path(d, "metrics.jsonl").read_text().splitlines())
        summary = json.loads(Path(d, "summary.json").read_text())
        cost, hz = summary.get("cost") or {}, summary.get("hazards") or {}
        cpu = cost.get("train_cpu_s")
        return (last["elapsed_s"], step_times[len(step_times) // 2], float("nan") if cpu is None else cpu,
                (cost.get("steps") or {}).get("mean_us"),
                f"{hz['armed_steps']}/{hz['steps']}" if hz.get("steps") else None)


def describe(tree: str | None) -> str:
    """Which optcheck a run imports: its directory and git commit (``-dirty`` with uncommitted changes)."""
    code = "import optcheck, os; print(os.path.dirname(os.path.dirname(os.path.abspath(optcheck.__file__))))"
    where = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(tree),
                           cwd=tempfile.gettempdir()).stdout.strip()
    git = subprocess.run(["git", "-C", where, "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
                         text=True)
    return f"{where} @ {git.stdout.strip() if git.returncode == 0 else 'no git'}"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _fmt(ratios: list[float]) -> str:
    if not ratios or any(r != r for r in ratios):
        return "-"
    return f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000, help="soak steps per run")
    ap.add_argument("--monitor-steps", type=int, default=300, help="optimizer steps of the ordinary loop per run")
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--only", choices=["soak", "monitor", "loops"],
                    help="run only the soak pair, the zoo loop's rows, or the small-GPT and tiny-MLP loops")
    ap.add_argument("--loop-steps", type=int, default=1000, help="optimizer steps per run of the two loops")
    ap.add_argument("--loop", choices=list(LOOPS), action="append", help="run only this loop of the two (repeatable)")
    ap.add_argument("--no-all-probes", action="store_true", help="leave out the rows with the hazard probes on")
    ap.add_argument("--always", action="store_true",
                    help="also run every probe armed on every step (soak --hazards always, Monitor(hazards='always'))")
    ap.add_argument("--baseline-tree", metavar="DIR", help="also run every optcheck row with optcheck from DIR")
    a = ap.parse_args()
    if a.repeat < 1 or a.steps < 1 or a.monitor_steps < 1 or a.loop_steps < 1 or a.every < 1:
        ap.error("--steps, --monitor-steps, --loop-steps, --every and --repeat must be >= 1")
    if a.baseline_tree is not None and not (Path(a.baseline_tree) / "optcheck" / "__init__.py").is_file():
        ap.error(f"--baseline-tree {a.baseline_tree}: no optcheck/__init__.py there")
    trees = [(None, "")] + ([(a.baseline_tree, " [baseline]")] if a.baseline_tree else [])
    runs = {}
    if a.only in (None, "soak"):
        runs["plain soak loop"] = ("plain soak loop", lambda: plain(a.steps, a.threads))
        for tree, tag in trees:
            runs[f"soak --no-hazards{tag}"] = ("plain soak loop",
                                               lambda t=tree: soak(a.steps, a.every, a.threads, ["--no-hazards"], t))
            if not a.no_all_probes:
                runs[f"soak (all probes){tag}"] = ("plain soak loop",
                                                   lambda t=tree: soak(a.steps, a.every, a.threads, [], t))
            if a.always:
                runs[f"soak --hazards always{tag}"] = (
                    "plain soak loop", lambda t=tree: soak(a.steps, a.every, a.threads, ["--hazards", "always"], t))
    if a.only in (None, "monitor"):
        runs["ordinary loop"] = ("ordinary loop", lambda: ordinary(a.monitor_steps, a.threads, a.every, "none"))
        for tree, tag in trees:
            runs[f"Monitor(every={a.every}, hazards=False){tag}"] = (
                "ordinary loop", lambda t=tree: ordinary(a.monitor_steps, a.threads, a.every, "nohaz", t))
            if not a.no_all_probes:
                runs[f"Monitor(every={a.every}){tag}"] = (
                    "ordinary loop", lambda t=tree: ordinary(a.monitor_steps, a.threads, a.every, "all", t))
            if a.always:
                runs[f"Monitor(every={a.every}, hazards='always'){tag}"] = (
                    "ordinary loop", lambda t=tree: ordinary(a.monitor_steps, a.threads, a.every, "always", t))
    if a.only in (None, "loops"):
        for name in a.loop or LOOPS:
            runs[name] = (name, lambda n=name: loop(n, a.loop_steps, a.threads, a.every, "none"))
            for tree, tag in trees:
                runs[f"{name}: Monitor(hazards=False){tag}"] = (
                    name, lambda n=name, t=tree: loop(n, a.loop_steps, a.threads, a.every, "nohaz", t))
                if not a.no_all_probes:
                    runs[f"{name}: Monitor(every={a.every}){tag}"] = (
                        name, lambda n=name, t=tree: loop(n, a.loop_steps, a.threads, a.every, "all", t))
    load_before = load()
    res: dict[str, list[Result]] = {k: [] for k in runs}
    for r in range(a.repeat):  # interleaved: one of each per round
        for name, (_, fn) in runs.items():
            res[name].append(fn())
        print(f"round {r + 1}/{a.repeat} done", file=sys.stderr, flush=True)
    what = ([f"soak: {a.steps} steps"] if a.only in (None, "soak") else []) + \
        ([f"ordinary loop: {a.monitor_steps} steps (4 micro-batches each)"] if a.only in (None, "monitor") else []) + \
        ([f"small-GPT and tiny-MLP loops: {a.loop_steps} steps"] if a.only in (None, "loops") else [])
    print(f"{'; '.join(what)}; --every {a.every}; {a.threads} thread(s); {a.repeat} interleaved rounds, fresh processes")
    print(f"optcheck: {describe(None)}" + (f"; [baseline]: {describe(a.baseline_tree)}" if a.baseline_tree else ""))
    print(f"load average (1, 5, 15 min): before {load_before}, after {load()}; {os.cpu_count()} CPUs")
    print("ratio = this run / the same round's run without optcheck: median (min-max) over rounds; "
          "own = optcheck's own us/step as the run reports it (summary cost.steps)")
    print(f"{'configuration':44} {'ms/step':>8} {'ms/step ratio':>22} {'median step ratio':>22} "
          f"{'CPU ratio':>22} {'own us/step':>11} {'armed':>9}")
    for name, (base, _) in runs.items():
        steps = {"plain soak loop": a.steps, "ordinary loop": a.monitor_steps}.get(base, a.loop_steps)
        ms = statistics.median(v[0] for v in res[name]) / steps * 1e3
        t_ratio = [v[0] / b[0] for v, b in zip(res[name], res[base])]
        m_ratio = [v[1] / b[1] for v, b in zip(res[name], res[base])]
        cpu = [v[2] / b[2] for v, b in zip(res[name], res[base])]
        own = [v[3] for v in res[name] if v[3] is not None]
        own_text = f"{statistics.median(own):.1f}" if own else "-"
        armed = next((v[4] for v in res[name] if v[4] is not None), "-")  # the same every round (the policy)
        print(f"{name:44} {ms:8.2f} {_fmt(t_ratio):>22} {_fmt(m_ratio):>22} {_fmt(cpu):>22} {own_text:>11} {armed:>9}")


if __name__ == "__main__":
    main()
