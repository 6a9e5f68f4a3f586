#!/usr/bin/env bash
# Everything kspec proves and measures on an NVIDIA GPU, in one run (docs/results/ holds the figures).
#
#   bash scripts/gpu_session.sh [STEP...]   steps: verify lower tune random bench attention hopper profile
#                                            verify-norms verify-tma tune-sweep tune-grad generate sweep grad-sweep
#                                            verify-grad grad-bench mutate fa3
#                                            (default: verify tune)
#
# SWEEP_SPECS, SWEEP_FAMILY (a family's name, or "all"), SWEEP_ARGS (e.g. --case NAME), SWEEP_SAMPLES, TUNE_BUDGET (seconds) and TUNE_ARGS
# shape the sweep steps; BENCH_SPECS and BENCH_ARGS the grad-bench step; MUTATE_ARGS (e.g. --sample 24 --jobs 4)
# the mutate step (scripts/mutation_test.py over the Triton and Mosaic GPU bodies; it goes on from the verdicts of
# MUTATE_RESULTS, a results file such as a CPU's pass writes: check's verdicts, and the Triton bodies' judged in
# Pallas interpret mode; $OUT/mutation.json holds them all).
#
# The machine needs jax with its CUDA plugin; where it lacks jsonschema and has no network, put
# the jsonschema wheels (and their dependencies) in .whl/ (git-ignored) and they are installed
# from there. Results go to $OUT (or ./out): verify-gpu.json, tuning.tgz (unpack at the repo root, then
# `kspec generate` embeds the configs), bench.json, bench.md, bench.png, attention.json, hopper.json,
# verify-fa3.json, bench-fa3.json and bench-fa3.md (fa3: specs/flash_attention_hopper.yaml, tuned at its bench
# cases first; SWEEP_SPECS=specs/flash_attention_hopper.yaml with the sweep step times its families), and
# ncu-details.csv / ncu-raw.csv.gz (profile: Nsight Compute over the 8192^3 matmuls, where the machine's
# runtime lets ncu read the counters; a sandboxed runtime may not, hence the timeout).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ! python3 -c "import jsonschema" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
# The repository root is the `kspec` package: reach it by that name wherever it was unpacked.
mkdir -p /tmp/kspec-root && ln -sfn "$PWD" /tmp/kspec-root/kspec
export PYTHONPATH=/tmp/kspec-root:${PYTHONPATH:-}
kspec() { python3 -m kspec "$@"; }
family=(--family "${SWEEP_FAMILY:-widths}")
[ "${SWEEP_FAMILY:-}" = all ] && family=()
# The bench cases each kernel is tuned on (its largest; the persistent matmuls also at the MLP shapes),
# each config timed against the reference under sustained load (kspec tune --sustained).
# (layer_norm and softmax bring their backward kernels: kspec tune takes a spec's vjp specs along.)
TUNE_CASES="matmul:b8192 matmul_bias_gelu:b8192 matmul_persistent:b8192 matmul_bias_gelu_persistent:b8192
  matmul_persistent:mlp4096 matmul_persistent:mlp2048 matmul_bias_gelu_persistent:mlp4096 matmul_bias_gelu_persistent:mlp2048
  matmul_pingpong:b8192 matmul_pingpong:mlp2048 matmul_bias_gelu_pingpong:b8192 matmul_bias_gelu_pingpong:mlp4096
  matmul_bias_gelu_pingpong:mlp2048 matmul_bias_gelu_pingpong:mlp1024
  flash_attention:full flash_attention:causal softmax:b8192 layer_norm:b16Kx8192 layer_norm:b8192
  rms_norm:b16Kx8192 rms_norm:b8192 layer_norm_tma:b16Kx8192 layer_norm_tma:b8192 rms_norm_tma:b16Kx8192
  rms_norm_tma:b8192 softmax_tma:b8192 softmax_tma:b4096 add:b1GiB add_1d:b1GiB"
# The norms and softmax whose Triton kernels mask their rows (any width), and their backward kernels.
NORM_FORWARD="specs/softmax.yaml specs/rms_norm.yaml specs/layer_norm.yaml"
NORM_SPECS="$NORM_FORWARD specs/softmax_dx.yaml specs/layer_norm_bwd.yaml specs/rms_norm_bwd.yaml
  specs/softmax_tma.yaml specs/rms_norm_tma.yaml specs/layer_norm_tma.yaml"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$OUT/gpu.txt"
for step in ${*:-verify tune}; do
  echo "=== $step $(date +%T)"
  case $step in
    verify) kspec verify --backend triton --backend mosaic_gpu --seed 11 \
              --json "$OUT/verify-gpu.json" --junit "$OUT/verify-gpu.xml" 2>/dev/null ;;
    lower) kspec verify --lower --json "$OUT/lower.json" 2>/dev/null | tail -3 ;;
    tune) for kc in $TUNE_CASES; do
            kspec tune "specs/${kc%%:*}.yaml" --case "${kc##*:}" --sustained --samples 20 --seed 5 2>/dev/null | grep -v '^\[' 
          done
          tar czf "$OUT/tuning.tgz" tuning ;;
    random) kspec tune specs/matmul.yaml --backend triton --case b8192 --strategy random --budget-trials 24 \
              --samples 5 --seed 9 --tuning-dir /tmp/random 2>/dev/null | grep -v '^\['
            tar czf "$OUT/tuning-random.tgz" -C /tmp random ;;
    bench) kspec bench --backend triton --backend mosaic_gpu --measure-ceilings --samples 30 \
             --json "$OUT/bench.json" --markdown "$OUT/bench.md" --plot "$OUT/bench.png" 2>/dev/null ;;
    attention) python3 scripts/bench_attention.py --samples 30 --json "$OUT/attention.json" ;;
    hopper) python3 scripts/bench_hopper_matmul.py --samples 40 --json "$OUT/hopper.json" ;;
    profile) NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
             if [ -z "$NCU" ]; then echo "no ncu on this machine"; continue; fi
             timeout 300 "$NCU" --profile-from-start off --clock-control none --set full -f -o /tmp/kspec-matmul \
               python3 scripts/profile_matmul.py | grep -v '^==PROF=='
             "$NCU" -i /tmp/kspec-matmul.ncu-rep --page details --csv > "$OUT/ncu-details.csv"
             "$NCU" -i /tmp/kspec-matmul.ncu-rep --page raw --csv | gzip -c > "$OUT/ncu-raw.csv.gz" ;;
    generate) kspec generate 2>/dev/null | tail -1 ;;
    verify-grad) kspec verify $NORM_FORWARD --backend triton --seed 11 --json "$OUT/verify-grad.json" 2>/dev/null | tail -40 ;;
    fa3) kspec tune specs/flash_attention_hopper.yaml -b mosaic_gpu --samples 10 --seed 5 2>/dev/null | grep -v '^\['
         kspec generate specs/flash_attention_hopper.yaml | tail -1
         kspec verify specs/flash_attention_hopper.yaml -b mosaic_gpu --seed 11 --json "$OUT/verify-fa3.json" 2>/dev/null | tail -20
         kspec bench specs/flash_attention_hopper.yaml -b mosaic_gpu --samples 30 --json "$OUT/bench-fa3.json" \
           --markdown "$OUT/bench-fa3.md" 2>/dev/null | tail -20 ;;
    verify-tma) kspec verify specs/softmax_tma.yaml specs/rms_norm_tma.yaml specs/layer_norm_tma.yaml \
              --backend mosaic_gpu --seed 11 --json "$OUT/verify-tma.json" 2>/dev/null | tail -22 ;;
    verify-norms) kspec verify $NORM_SPECS --backend triton --backend mosaic_gpu --seed 11 \
              --json "$OUT/verify-norms.json" 2>/dev/null | tail -25 ;;
    tune-sweep) kspec tune ${SWEEP_SPECS:-$NORM_FORWARD} --sweep "${family[@]}" --sustained --backend triton --backend mosaic_gpu \
              --samples 10 --seed 5 --budget-seconds "${TUNE_BUDGET:-300}" ${TUNE_ARGS:-} 2>/dev/null | grep -v '^\['
          tar czf "$OUT/tuning.tgz" tuning ;;
    tune-grad) kspec tune ${SWEEP_SPECS:-$NORM_FORWARD} --grad --sweep "${family[@]}" --backend triton --backend mosaic_gpu \
              --samples "${SWEEP_SAMPLES:-5}" --seed 5 --budget-seconds "${TUNE_BUDGET:-300}" ${TUNE_ARGS:-} 2>/dev/null
          tar czf "$OUT/tuning.tgz" tuning ;;
    sweep) plot=(); python3 -c "import matplotlib" 2>/dev/null && plot=(--plot "$OUT/sweep.png")
           kspec bench ${SWEEP_SPECS:-$NORM_FORWARD} --sweep "${family[@]}" --backend triton --backend mosaic_gpu \
              --samples "${SWEEP_SAMPLES:-10}" --seed 3 ${SWEEP_ARGS:-} --json "$OUT/sweep.json" --markdown "$OUT/sweep.md" \
              "${plot[@]}" 2>"$OUT/sweep.err" | sed -n '/^## Sweep/,$p' ;;
    grad-sweep) kspec bench ${SWEEP_SPECS:-$NORM_FORWARD} --grad --sweep "${family[@]}" --backend triton --backend mosaic_gpu \
              --samples "${SWEEP_SAMPLES:-10}" --seed 3 ${SWEEP_ARGS:-} --json "$OUT/grad-sweep.json" \
              --markdown "$OUT/grad-sweep.md" 2>"$OUT/grad-sweep.err" | sed -n '/^## Sweep/,$p' ;;
    mutate) if [ -n "${MUTATE_RESULTS:-}" ]; then cp "$MUTATE_RESULTS" "$OUT/mutation.json"; fi
            python3 scripts/mutation_test.py -b triton -b mosaic_gpu ${MUTATE_ARGS:-} --resume "$OUT/mutation.json" \
              2>"$OUT/mutation.err" | tail -60 ;;
    grad-bench) kspec bench ${BENCH_SPECS:-specs/flash_attention.yaml} --grad --backend triton \
              --samples "${SWEEP_SAMPLES:-10}" --seed 3 ${BENCH_ARGS:-} --json "$OUT/grad-bench.json" \
              --markdown "$OUT/grad-bench.md" 2>"$OUT/grad-bench.err" | tail -30 ;;
  esac
done
