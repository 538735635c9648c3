"""How far apart separate runs of one environment land in CPU time per step, and what
``optcheck upgrade``'s interleaved pairs make of it (``optcheck.judge.speed_pairs``).

Both sides are this interpreter, so every pair's ratio is noise. ``--pairs`` pairs of
``optcheck soak`` subprocesses, the order alternating as the upgrade's pairs do (baseline
first, then candidate first, ...). Per pair it prints each run's median CPU time per step
(``cost.train_cpu_block_s``, first block left out) and the ratio
(``optcheck.judge.speed_pairs.pair_ratio``); at the end the spread of the ratios and the
median of each three consecutive pairs, which is what ``optcheck upgrade --speed-pairs 3``
compares with the limit (1 + ``SPEED_TOLERANCE``)::

    python benchmarks/bench_speed_pairs.py [--pairs 6] [--steps 120] [--n-layer 2] [--n-embd 64] [--busy]

``--busy``: another soak trains beside the runs the whole time (a neighbour on a shared
runner). Nothing is asserted: the figures are read and recorded (docs/guide/upgrade.md).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from optcheck.judge.baseline import SPEED_TOLERANCE, cpu_blocks  # noqa: E402
from optcheck.judge.speed_pairs import first_side, pair_ratio  # noqa: E402


def soak(out: Path, args, env: dict) -> dict:
    """One clean soak into ``out``; its summary. Exits with one line if it fails."""
    cmd = [sys.executable, "-m", "optcheck", "soak", "-q", "--steps", str(args.steps), "--every", "100",
           "--val-every", "0", "--seed", "7", "--n-layer", str(args.n_layer), "--n-embd", str(args.n_embd),
           "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"bench_speed_pairs: the soak into {out} failed (exit {r.returncode}): {r.stderr.strip()[-300:]}")
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--busy", action="store_true", help="another soak trains beside the runs")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.pairs < 1 or args.steps < 30:
        sys.exit("bench_speed_pairs: --pairs must be >= 1 and --steps >= 30 (two 10-step blocks after the first)")
    root = args.out or Path(tempfile.mkdtemp(prefix="bench-speed-pairs-"))
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    neighbour = subprocess.Popen([sys.executable, "-m", "optcheck", "soak", "-q", "--steps", "1000000", "--every",
                                  "100", "--val-every", "0", "--out", str(root / "neighbour")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env) if args.busy else None
    ratios = []
    try:
        for k in range(args.pairs):
            order = ("baseline", "candidate") if first_side(k) == 0 else ("candidate", "baseline")
            got = {side: soak(root / f"pair-{k + 1}" / side, args, env) for side in order}
            ms = {side: statistics.median(cpu_blocks(s)) * 1e3 for side, s in got.items()}
            ratios.append(pair_ratio(got["baseline"], got["candidate"]))
            print(f"pair {k + 1}: {order[0]} first  baseline {ms['baseline']:.2f} ms/step  candidate "
                  f"{ms['candidate']:.2f} ms/step  ratio {ratios[-1]:.3f}x", flush=True)
    finally:
        if neighbour is not None:
            neighbour.terminate()
            neighbour.wait(60)
    limit = 1 + SPEED_TOLERANCE
    threes = [statistics.median(ratios[i:i + 3]) for i in range(len(ratios) - 2)]
    print(f"\n{len(ratios)} pairs of {args.steps}-step runs (n_layer {args.n_layer}, n_embd {args.n_embd}"
          f"{', a neighbour training beside them' if args.busy else ''}); load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"pair ratios: min {min(ratios):.3f}x median {statistics.median(ratios):.3f}x max {max(ratios):.3f}x; "
          f"single pairs above {limit:.2f}x: {sum(r > limit for r in ratios)} of {len(ratios)}")
    if threes:
        print(f"medians of three consecutive pairs: min {min(threes):.3f}x max {max(threes):.3f}x; above "
              f"{limit:.2f}x (a false failure of --speed-pairs 3): {sum(m > limit for m in threes)} of {len(threes)}")


if __name__ == "__main__":
    main()
