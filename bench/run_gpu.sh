#!/usr/bin/env bash
# kiln's GPU benchmark (issue 14; see bench/README.md, "GPU mode"): the base model compiled
# for host-cuda-cuda_capability_86 (model_bench_cuda) on W1, W2 and W4 next to PyTorch eager
# FP32 and torch.compile on the same GPU, and the table (bench/report.py --gpu).
#
#   bench/run_gpu.sh build   # here (Halide, no GPU): builds model_bench_cuda into $KILN_BENCH_BUILD
#                            # and copies the shared libraries it needs beside it (gpu-libs/)
#   bench/run_gpu.sh run     # on the GPU machine (CUDA driver, PyTorch; no Halide needed):
#                            # the carried build, the checkpoint, the runs and the table
#   bench/run_gpu.sh         # both (a machine with Halide and a GPU)
#
# `run` stops first, with "no CUDA driver/device" and a non-zero status, where the CUDA driver
# (libcuda.so.1) or a device is missing.
#
# Environment:
#   KILN_BENCH_BUILD   build directory          (default /tmp/build-bench-gpu)
#   KILN_BENCH_CACHE   weights, results         (default /tmp/kiln-bench-gpu; ~0.4 GB)
#   KILN_BENCH_JOBS    build parallelism        (default 2)
#   KILN_BENCH_REPS    kiln repetitions / PyTorch runs per workload (default 10)
#   KILN_BENCH_ROUNDS  rounds of kiln + PyTorch (default 2; the report takes each best)
#   KILN_BENCH_PYTHON  Python with PyTorch      (default python3)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${KILN_BENCH_BUILD:-/tmp/build-bench-gpu}
CACHE=${KILN_BENCH_CACHE:-/tmp/kiln-bench-gpu}
JOBS=${KILN_BENCH_JOBS:-2}
REPS=${KILN_BENCH_REPS:-10}
ROUNDS=${KILN_BENCH_ROUNDS:-2}
PY=${KILN_BENCH_PYTHON:-python3}
STEP=${1:-all}
BIN=$BUILD/bench/model_bench_cuda
START=$(date +%s)
log() { echo "[run_gpu.sh +$(( $(date +%s) - START ))s] $*" >&2; }
die() { echo "run_gpu.sh: $*" >&2; exit 1; }
case $STEP in build | run | all) ;; *) die "unknown step '$STEP' (build, run, or nothing for both)" ;; esac

# 1. Build (needs Halide and kiln's build dependencies; no GPU, no CUDA).
if [[ $STEP != run ]]; then
  mkdir -p "$BUILD"
  log "configure + build model_bench_cuda in $BUILD (-j$JOBS)"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_BENCH=ON \
    -DKILN_BENCH_GPU=ON -DKILN_BUILD_TESTS=OFF > "$BUILD/gpu-build.log" 2>&1 \
    || die "cmake configure failed (see $BUILD/gpu-build.log)"
  CCACHE_NOHASHDIR=1 cmake --build "$BUILD" -j"$JOBS" --target model_bench_cuda \
    >> "$BUILD/gpu-build.log" 2>&1 || die "build of model_bench_cuda failed (see $BUILD/gpu-build.log)"
  # The shared libraries the binary needs beyond glibc (Google Benchmark, libstdc++), so the
  # GPU machine needs none of the build's packages.
  mkdir -p "$BUILD/bench/gpu-libs"
  ldd "$BIN" | awk '$3 ~ /^\// {print $3}' \
    | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' \
    | while read -r lib; do cp -L "$lib" "$BUILD/bench/gpu-libs/"; done
  log "built $BIN; carry $BUILD/bench/model_bench_cuda and $BUILD/bench/gpu-libs/ with the repository"
  [[ $STEP == build ]] && exit 0
fi

# 2. A CUDA driver and a device, or stop.
[[ -x $BIN ]] || die "$BIN is missing: run 'bench/run_gpu.sh build' on a machine with Halide and carry $BUILD"
why=$("$PY" - <<'EOF'
import ctypes
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print("no CUDA driver (libcuda.so.1 not found: %s)" % e)
    raise SystemExit
n = ctypes.c_int(0)
rc = cuda.cuInit(0)
if rc != 0:
    print("no CUDA device (cuInit failed with CUDA error %d)" % rc)
elif cuda.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value < 1:
    print("no CUDA device (cuDeviceGetCount found none)")
EOF
) || die "cannot run $PY to look for the CUDA driver"
[[ -z $why ]] || die "$why: the GPU bench runs on a machine with an NVIDIA GPU and its driver"
export LD_LIBRARY_PATH=$BUILD/bench/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# 3. The checkpoint (the one bench/run.sh makes) and PyTorch's W1 reference logits.
OUT=$CACHE/results
mkdir -p "$CACHE" "$OUT"
rm -rf "$OUT"/round* "$OUT"/*.log "$OUT"/report.md
{ echo "start $(date -Is)"; nvidia-smi -L 2>/dev/null; grep -m1 'model name' /proc/cpuinfo; } > "$OUT/machine.log"
log "weights / reference (cached in $CACHE)"
"$PY" "$ROOT/bench/peers.py" --weights-out "$CACHE/base.safetensors" \
  --reference-out "$CACHE/reference.safetensors" 2> "$OUT/peers-prepare.log" \
  || die "peers.py (weights, reference) failed (see $OUT/peers-prepare.log)"
export KILN_BENCH_WEIGHTS=$CACHE/base.safetensors
export KILN_BENCH_REFERENCE=$CACHE/reference.safetensors

# 4. Rounds of kiln and PyTorch (eager FP32, torch.compile), in reverse order in even rounds.
run_kiln() {
  log "round $r: kiln model_bench_cuda (W1, W2, W4, check; $REPS repetitions)"
  "$BIN" --benchmark_repetitions="$REPS" --benchmark_display_aggregates_only=true \
    --benchmark_enable_random_interleaving=true --benchmark_out="$R/kiln.json" \
    --benchmark_out_format=json > "$R/kiln.log" 2>&1 \
    || echo "round $r: model_bench_cuda failed (see $R/kiln.log)" >> "$OUT/status.log"
}
run_pytorch() {
  log "round $r: PyTorch eager FP32 and torch.compile on cuda"
  "$PY" "$ROOT/bench/peers.py" --weights "$CACHE/base.safetensors" --device cuda --runs "$REPS" \
    --json-out "$R/pytorch.json" 2> "$R/pytorch.log" \
    || echo "round $r: PyTorch run failed (see $R/pytorch.log)" >> "$OUT/status.log"
}
for r in $(seq 1 "$ROUNDS"); do
  R=$OUT/round$r
  mkdir -p "$R"
  if (( r % 2 )); then run_kiln; run_pytorch; else run_pytorch; run_kiln; fi
done
echo "end $(date -Is) elapsed $(( $(date +%s) - START ))s" >> "$OUT/machine.log"

# 5. The table.
"$PY" "$ROOT/bench/report.py" --gpu "$OUT" | tee "$OUT/report.md"
log "done in $(( $(date +%s) - START )) s; JSON and logs in $OUT"
