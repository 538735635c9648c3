"""What ``optcheck compare`` costs on a long run: two run directories of N metrics
lines (a snapshot every ``--every`` steps, built from a real soak's records in
``tests/fixtures/runs/clean``), compared in a fresh process (``python -m optcheck
compare A B``, import time included) and in-process (:func:`optcheck.judge.compare.compare_runs`,
the reading and the verdict). Prints seconds; nothing is asserted (timings on a shared
machine are noisy; the CPU time printed beside the wall time is what an idle machine takes)::

    python benchmarks/bench_compare.py --steps 20000          # the main job's run: target <= 2 s
    python benchmarks/bench_compare.py --steps 1000000 --every 10000   # target <= 60 s

The reader's policy behind the figures (``optcheck/report/reader.py``): each record
file's first lines and the summary are checked against the published schemas, the
rest by a cheap structural check.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "runs" / "clean"


def make_run(path: Path, steps: int, every: int, seed: int) -> None:
    """A run directory of ``steps`` metrics lines and a snapshot every ``every`` steps."""
    path.mkdir(parents=True)
    rnd = random.Random(seed)
    with open(path / "metrics.jsonl", "w") as f:
        loss = 5.5
        for s in range(1, steps + 1):
            loss = max(0.1, loss * 0.9999 + rnd.uniform(-1e-3, 1e-3))
            f.write(json.dumps({"step": s, "loss": loss, "step_time_s": 0.0050 + rnd.random() * 1e-4},
                               separators=(",", ":")) + "\n")
    template = json.loads((FIXTURE / "snapshots.jsonl").read_text().splitlines()[-1])
    with open(path / "snapshots.jsonl", "w") as f:
        for s in range(0, steps + 1, every):
            f.write(json.dumps({**template, "step": s}, separators=(",", ":")) + "\n")
    (path / "findings.jsonl").write_text("")
    summary = json.loads((FIXTURE / "summary.json").read_text())
    summary.update(steps_requested=steps, last_step=steps, snapshots=steps // every + 1)
    (path / "summary.json").write_text(json.dumps(summary))


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        t = time.perf_counter()
        make_run(a, args.steps, args.every, 1)
        make_run(b, args.steps, args.every, 1)
        print(f"built 2 runs of {args.steps:,} metrics lines, {args.steps // args.every + 1} snapshots each "
              f"({(a / 'metrics.jsonl').stat().st_size / 1e6:.1f} MB + "
              f"{(a / 'snapshots.jsonl').stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t:.1f} s")
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        walls, cpus = [], []
        for _ in range(args.repeat):
            t, c = time.perf_counter(), _children_cpu()
            res = subprocess.run([sys.executable, "-m", "optcheck", "compare", str(a), str(b)], capture_output=True,
                                 text=True, env=env)
            walls.append(time.perf_counter() - t)
            cpus.append(_children_cpu() - c)
        print(f"optcheck compare (a fresh process): exit {res.returncode}, wall {min(walls):.2f} s best of "
              f"{args.repeat} ({', '.join(f'{w:.2f}' for w in walls)}), CPU {min(cpus):.2f} s "
              f"(user+sys; the wall time on an idle machine is about this)")
        sys.path.insert(0, str(ROOT))
        from optcheck.judge.compare import compare_runs

        t, c = time.perf_counter(), time.process_time()
        compare_runs(a, b)
        print(f"compare_runs in-process: wall {time.perf_counter() - t:.2f} s, CPU {time.process_time() - c:.2f} s")


if __name__ == "__main__":
    main()
