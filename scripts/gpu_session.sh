#!/usr/bin/env bash
# One GPU session: everything kspec proves and measures on an NVIDIA GPU, in one call.
#
#   bash scripts/gpu_session.sh [STEP...]      steps: verify lower bench tune anchors (default: all)
#
# On the lent GPU machine (jax + CUDA plugin installed, no jsonschema) the jsonschema
# wheels travel in .whl/ (git-ignored; copy ../shared/wheels-py312/*.whl there). Results
# go to $OUT (or ./out): verify-gpu.json, bench.json, bench.md, bench.png, tuning/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ! python3 -c "import jsonschema" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
kspec() { python3 -c "import cli; cli.run()" "$@"; }
steps=${*:-verify lower bench tune}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$OUT/gpu.txt"
for step in $steps; do
  echo "=== $step"
  case $step in
    verify) kspec verify --backend triton --backend mosaic_gpu --seed 11 --json "$OUT/verify-gpu.json" --junit "$OUT/verify-gpu.xml" 2>/dev/null ;;
    lower) kspec verify --lower --json "$OUT/lower.json" 2>/dev/null | tail -3 ;;
    bench) kspec bench --backend triton --backend mosaic_gpu --measure-ceilings --samples 15 \
             --json "$OUT/bench.json" --markdown "$OUT/bench.md" --plot "$OUT/bench.png" 2>/dev/null ;;
    tune) kspec tune specs/matmul.yaml --backend triton --case b4096 --samples 5 --tuning-dir "$OUT/tuning" 2>/dev/null
          kspec tune specs/matmul.yaml --backend triton --case b4096 --samples 5 --strategy random \
             --budget-trials "${RANDOM_TRIALS:-8}" --seed 3 --tuning-dir "$OUT/tuning-random" 2>/dev/null ;;
    anchors) python3 ../shared/perf/anchors_gpu.py ;;
  esac
done
