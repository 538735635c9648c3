"""False failures of the baseline's speed check on a loaded machine.

One clean baseline soak, then ``--reruns`` clean reruns of the same soak, each judged with
``optcheck soak --baseline`` (``optcheck.judge.baseline``: findings, loss band, speed, peak RSS),
while another soak of the same model trains beside them the whole time (a busy neighbour on
a shared runner). Every rerun is the same code on the same data, so every failure is a
false failure. For each rerun it prints the job's exit code, the speed check's ratio
(worker CPU time per training step, ``cost.train_cpu_s``, against the baseline's) and, for
comparison, the ratio the old wall-clock check would have used (median step time)::

    python benchmarks/bench_speed_noise.py [--reruns 20] [--steps 300] [--out DIR]

Ends with ``false failures: N of M`` (speed check on CPU time) and the wall-clock figure.
Nothing is asserted: the figure is read and recorded (``docs/nightly.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from optcheck.judge.baseline import SPEED_TOLERANCE  # noqa: E402


def soak(out: Path, steps: int, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "optcheck", "soak", "-q", "--steps", str(steps), "--every", "50",
           "--val-every", "0", "--out", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def median_step(run: Path) -> float:
    times = [json.loads(line).get("step_time_s") for line in (run / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(t for t in times if isinstance(t, (int, float)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reruns", type=int, default=20)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="bench-speed-noise-"))
    root.mkdir(parents=True, exist_ok=True)
    base = root / "baseline"
    r = soak(base, args.steps)
    if r.returncode != 0:
        sys.exit(f"baseline soak failed (exit {r.returncode}): {r.stderr[-500:]}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    neighbour = subprocess.Popen([sys.executable, "-m", "optcheck", "soak", "-q", "--steps", "1000000", "--every",
                                  "100", "--val-every", "0", "--out", str(root / "neighbour")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    b = summary(base)
    b_cpu = b["cost"]["train_cpu_s"] / b["last_step"]
    b_wall = median_step(base)
    rows, fails, wall_fails = [], 0, 0
    try:
        for i in range(args.reruns):
            run = root / f"rerun-{i + 1:02d}"
            t0 = time.time()
            r = soak(run, args.steps, "--baseline", str(base))
            s = summary(run)
            cpu = s["cost"]["train_cpu_s"] / s["last_step"]
            wall = median_step(run)
            speed = next((line.strip() for line in r.stdout.splitlines() if " speed: " in line), "?")
            fails += r.returncode != 0
            wall_fails += wall / b_wall > 1 / 0.85  # the old check: steps/s below 85 % of the baseline's
            rows.append((i + 1, r.returncode, cpu / b_cpu, wall / b_wall, s.get("steps_per_s"), time.time() - t0))
            print(f"rerun {i + 1:2d}: exit {r.returncode}  CPU/step {cpu / b_cpu:.3f}x  wall median step "
                  f"{wall / b_wall:.3f}x  steps/s {s.get('steps_per_s')}  ({speed})", flush=True)
            if r.returncode != 0:
                print("   " + "\n   ".join(r.stdout.splitlines()[-10:]), flush=True)
    finally:
        neighbour.terminate()
        try:
            neighbour.wait(60)
        except subprocess.TimeoutExpired:
            neighbour.kill()
    cpu_r, wall_r = [x[2] for x in rows], [x[3] for x in rows]
    print(f"\nbaseline: {args.steps} steps, train CPU {b_cpu * 1e3:.2f} ms/step, wall median step "
          f"{b_wall * 1e3:.2f} ms; load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"CPU time per step / baseline's: min {min(cpu_r):.3f}x median {statistics.median(cpu_r):.3f}x "
          f"max {max(cpu_r):.3f}x (the check fails above {1 + SPEED_TOLERANCE:.2f}x)")
    print(f"wall median step time / baseline's: min {min(wall_r):.3f}x median {statistics.median(wall_r):.3f}x "
          f"max {max(wall_r):.3f}x (the old steps/s check failed above {1 / 0.85:.3f}x)")
    print(f"false failures: {fails} of {len(rows)} (soak --baseline exit != 0); "
          f"the wall-clock check would have failed {wall_fails} of {len(rows)}")


if __name__ == "__main__":
    main()
