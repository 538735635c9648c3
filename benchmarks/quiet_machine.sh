#!/usr/bin/env bash
# Issue 34's cost figures on a quiet machine (docs/guide/cost.md, "part 5"): the small, fast loop's
# CPU ratio measured three ways, this checkout against another one, and the same loop on a CUDA card
# when there is one.
#
#   benchmarks/quiet_machine.sh OUT [BASE]     # BASE: another optcheck checkout (its auto@base, off@base)
#
# Three CPU measurements run side by side, each one thread on a core of its own (a machine with
# fewer than 4 idle cores measures the load instead): bench_small_loop.py's interleaved rounds (one
# process per configuration, the issue's method), its --lockstep rounds, and bench_paired.py (one
# process, paired blocks). Then bench_paired.py --device cuda. Each writes OUT/<name>.txt.
set -u
OUT=${1:?usage: benchmarks/quiet_machine.sh OUT [BASE]}
BASE=${2:-}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PY=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-1000}
PAIRS=${PAIRS:-20}
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
    echo "cores: $(nproc); load: $(cut -d' ' -f1-3 /proc/loadavg)"
    grep -m1 'model name' /proc/cpuinfo
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
              "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))'
    git -C "$ROOT" log -1 --format='checkout %h %s' 2>/dev/null
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
configs=plain,plain2,auto,off
base_args=()
[ -n "$BASE" ] && base_args=(--baseline-tree "$BASE")  # (adds auto@base and off@base to the rounds)
timeout 300 "$PY" "$HERE/bench_small_loop.py" --configs "$configs" --steps "$STEPS" --rounds "$ROUNDS" \
    "${base_args[@]}" > "$OUT/rounds.txt" 2>&1 &
jobs_=($!)
timeout 300 "$PY" "$HERE/bench_small_loop.py" --configs "$configs" --steps "$STEPS" --rounds "$ROUNDS" \
    --lockstep 100 "${base_args[@]}" > "$OUT/lockstep.txt" 2>&1 &
jobs_+=($!)
(
    timeout 150 "$PY" "$HERE/bench_paired.py" --pairs "$PAIRS" || exit
    if [ -n "$BASE" ]; then
        echo "--- BASE: $BASE"
        PYTHONPATH="$BASE" timeout 150 "$PY" "$HERE/bench_paired.py" --pairs "$PAIRS"
    fi
) > "$OUT/paired.txt" 2>&1 &
jobs_+=($!)
rc=0
for j in "${jobs_[@]}"; do
    wait "$j" || rc=1
done
if "$PY" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    timeout 120 "$PY" "$HERE/bench_paired.py" --pairs 10 --device cuda > "$OUT/paired_cuda.txt" 2>&1 || rc=1
fi
for f in rounds lockstep paired paired_cuda; do
    if [ -f "$OUT/$f.txt" ]; then
        echo "=== $f"
        tail -n 14 "$OUT/$f.txt"
    fi
done
[ "$rc" = 0 ] || echo "quiet_machine: a measurement failed (its file in $OUT says why)" >&2
exit "$rc"
