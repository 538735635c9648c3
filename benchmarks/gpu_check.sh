#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py; docs/gpu.md): optcheck on one CUDA card in under 8 minutes.
#
#   benchmarks/gpu_check.sh OUT [gpu_check.py options]
#
# Wheels for optcheck's dependencies the card's image lacks (docs/gpu.md, "What to carry") are
# installed from benchmarks/wheels/ (or $OPTCHECK_WHEELS) into OUT/site, with no index; without
# them the check still runs (jsonschema is only needed to read runs back, not to record them).
set -u
OUT=${1:?usage: benchmarks/gpu_check.sh OUT [options]}
shift
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
WHEELS=${OPTCHECK_WHEELS:-$HERE/wheels}
EXTRA=""
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --no-index --no-deps --target "$OUT/site" "$WHEELS"/*.whl \
        && EXTRA="$OUT/site" || echo "gpu_check: could not install the wheels in $WHEELS (going on without)" >&2
fi
export PYTHONPATH="$ROOT${EXTRA:+:$EXTRA}${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT" || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$OUT/nvidia-smi.csv" 2>&1 || true
exec timeout 470 "$PY" "$HERE/gpu_check.py" --out "$OUT" "$@"
