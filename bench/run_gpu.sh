#!/usr/bin/env bash
# kiln's GPU benchmark (issue 14; see bench/README.md, "GPU mode"): the base model compiled
# for host-cuda-cuda_capability_86 (model_bench_cuda) on W1, W2 and W4 next to PyTorch eager
# FP32 and torch.compile on the same GPU, and the table (bench/report.py --gpu).
#
#   bench/run_gpu.sh build   # here (Halide, no GPU): builds model_bench_cuda, gpu_kernel_bench and
#                            # the CUDA tests (device_tests, gpu_models_tests) into $KILN_BENCH_BUILD,
#                            # copies the shared libraries they need (bench/gpu-libs/) and stages
#                            # what the GPU machine needs in $KILN_BENCH_BUILD/carry (below)
#   bench/run_gpu.sh run     # on the GPU machine (CUDA driver, PyTorch; no Halide needed): the
#                            # CUDA tests, the checkpoint, the runs, the kernels and the table
#   bench/run_gpu.sh         # both (a machine with Halide and a GPU)
#
# The carry folder mirrors the build folder (tests/, bench/): copy it over $KILN_BENCH_BUILD on
# the GPU machine, with the repository at the same path as here (the tests read their data
# from the paths they were built with).
#
# `run` stops first, with "no CUDA driver/device" and a non-zero status, where the CUDA driver
# (libcuda.so.1) or a device is missing.
#
# Environment:
#   KILN_BENCH_BUILD   build directory          (default /tmp/build-bench-gpu)
#   KILN_BENCH_CACHE   weights, results         (default /tmp/kiln-bench-gpu; ~0.4 GB)
#   KILN_BENCH_JOBS    build parallelism        (default 2)
#   KILN_BENCH_REPS    kiln repetitions / PyTorch runs per workload (default 10)
#   KILN_BENCH_ROUNDS  rounds of kiln + PyTorch (default 2; the report takes each best; 0: none,
#                      e.g. for a kernels-only run)
#   KILN_BENCH_PYTHON  Python with PyTorch      (default python3)
#   KILN_BENCH_TESTS   0: skip the CUDA tests   (default 1)
#   KILN_BENCH_KERNELS 0: skip the kernel bench (default 1); else a Google Benchmark filter
#                      for gpu_kernel_bench      (default: all)
#   KILN_BENCH_TORCH_COMPILE  0: PyTorch eager only (default 1: eager and torch.compile)
#   KILN_BENCH_GPU_VARIANTS   1: build gpu_kernel_bench with every GEMM and attention schedule
#                      variant of the experiment (bench/CMakeLists.txt; default 0: kiln's
#                      schedules and the GEMM schedule before issue 30)
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
KBIN=$BUILD/bench/gpu_kernel_bench
TESTS=${KILN_BENCH_TESTS:-1}
KERNELS=${KILN_BENCH_KERNELS:-1}
START=$(date +%s)
log() { echo "[run_gpu.sh +$(( $(date +%s) - START ))s] $*" >&2; }
die() { echo "run_gpu.sh: $*" >&2; exit 1; }
case $STEP in build | run | all) ;; *) die "unknown step '$STEP' (build, run, or nothing for both)" ;; esac

# 1. Build (needs Halide and kiln's build dependencies; no GPU, no CUDA).
if [[ $STEP != run ]]; then
  mkdir -p "$BUILD"
  log "configure + build model_bench_cuda, gpu_kernel_bench and the CUDA tests in $BUILD (-j$JOBS)"
  variants=OFF
  [[ ${KILN_BENCH_GPU_VARIANTS:-0} != 0 ]] && variants=ON
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_BENCH=ON \
    -DKILN_BENCH_GPU=ON -DKILN_BENCH_GPU_VARIANTS=$variants -DKILN_BUILD_TESTS=ON \
    > "$BUILD/gpu-build.log" 2>&1 \
    || die "cmake configure failed (see $BUILD/gpu-build.log)"
  CCACHE_NOHASHDIR=1 cmake --build "$BUILD" -j"$JOBS" \
    --target model_bench_cuda gpu_kernel_bench device_tests gpu_models_tests \
    >> "$BUILD/gpu-build.log" 2>&1 || die "build failed (see $BUILD/gpu-build.log)"
  # The shared libraries the binaries need beyond glibc (Google Benchmark, libstdc++), so the
  # GPU machine needs none of the build's packages.
  mkdir -p "$BUILD/bench/gpu-libs"
  for b in "$BIN" "$KBIN" "$BUILD/tests/device_tests" "$BUILD/tests/gpu_models_tests"; do
    ldd "$b" | awk '$3 ~ /^\// {print $3}'
  done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' \
    | while read -r lib; do cp -L "$lib" "$BUILD/bench/gpu-libs/"; done
  # What the GPU machine needs: the binaries, their libraries, and the CUDA tests' libraries
  # and IR (device_tests reads the archives' PTX and the base model's IR).
  rm -rf "$BUILD/carry"
  mkdir -p "$BUILD/carry/bench" "$BUILD/carry/tests"
  cp -a "$BIN" "$KBIN" "$BUILD/bench/gpu-libs" "$BUILD/carry/bench/"
  cp -a "$BUILD/tests/device_tests" "$BUILD/tests/gpu_models_tests" "$BUILD/carry/tests/"
  for d in "$BUILD"/tests/cuda_*.kiln; do
    mkdir -p "$BUILD/carry/tests/$(basename "$d")"
    cp -a "$d"/*.a "$d"/*.kir "$BUILD/carry/tests/$(basename "$d")/" 2>/dev/null || true
  done
  log "built; carry $BUILD/carry ($(du -sh "$BUILD/carry" | cut -f1)) and copy it over $BUILD there"
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
OUT=$CACHE/results
mkdir -p "$CACHE" "$OUT"
rm -rf "$OUT"/round* "$OUT"/*.log "$OUT"/*.json "$OUT"/*.txt "$OUT"/report.md

# 3. The CUDA tests on the GPU: the device suite's CUDA cases and the whole models.
if [[ $TESTS != 0 ]]; then
  log "CUDA tests: device_tests (*CUDA*:*Cuda*), gpu_models_tests (GpuModels/CUDA.*)"
  timeout 150 "$BUILD/tests/device_tests" --gtest_filter='*CUDA*:*Cuda*' \
    > "$OUT/device_tests.log" 2>&1 || echo "device_tests failed (see device_tests.log)" >> "$OUT/status.log"
  timeout 150 "$BUILD/tests/gpu_models_tests" --gtest_filter='GpuModels/CUDA.*' \
    > "$OUT/gpu_models_tests.log" 2>&1 || echo "gpu_models_tests failed (see gpu_models_tests.log)" >> "$OUT/status.log"
  grep -h '^\[  PASSED\|^\[  FAILED\|^\[  SKIPPED\|^\[ cuda \]' "$OUT/device_tests.log" "$OUT/gpu_models_tests.log" >&2
fi

# 4. The kernels on their own: kiln's linear (each GEMM schedule variant) and attention, then
# PyTorch's on the same shapes.
if [[ $KERNELS != 0 ]]; then
  filter=()
  [[ $KERNELS != 1 ]] && filter=(--benchmark_filter="$KERNELS")
  log "kernels: gpu_kernel_bench ${filter[*]}"
  timeout 400 "$KBIN" "${filter[@]}" --benchmark_out="$OUT/kernels-kiln.json" \
    --benchmark_out_format=json > "$OUT/kernels-kiln.log" 2>&1 \
    || echo "gpu_kernel_bench failed (see kernels-kiln.log)" >> "$OUT/status.log"
  log "kernels: PyTorch (addmm, scaled_dot_product_attention)"
  timeout 200 "$PY" "$ROOT/bench/gpu_kernels_peer.py" --json-out "$OUT/kernels-pytorch.json" \
    2> "$OUT/kernels-pytorch.log" || echo "gpu_kernels_peer.py failed (see kernels-pytorch.log)" >> "$OUT/status.log"
fi
# 5. The checkpoint (the one bench/run.sh makes) and PyTorch's W1 reference logits.
{ echo "start $(date -Is)"; nvidia-smi -L 2>/dev/null; grep -m1 'model name' /proc/cpuinfo; } > "$OUT/machine.log"
if (( ROUNDS > 0 )); then
  log "weights / reference (cached in $CACHE)"
  "$PY" "$ROOT/bench/peers.py" --weights-out "$CACHE/base.safetensors" \
    --reference-out "$CACHE/reference.safetensors" 2> "$OUT/peers-prepare.log" \
    || die "peers.py (weights, reference) failed (see $OUT/peers-prepare.log)"
fi
export KILN_BENCH_WEIGHTS=$CACHE/base.safetensors
export KILN_BENCH_REFERENCE=$CACHE/reference.safetensors

# 6. Rounds of kiln and PyTorch (eager FP32, torch.compile), in reverse order in even rounds.
run_kiln() {
  log "round $r: kiln model_bench_cuda (W1, W2, W4, check; $REPS repetitions)"
  KILN_BENCH_PROFILE_OUT=$R/kiln-profile.txt \
  "$BIN" --benchmark_repetitions="$REPS" --benchmark_display_aggregates_only=true \
    --benchmark_enable_random_interleaving=true --benchmark_out="$R/kiln.json" \
    --benchmark_out_format=json > "$R/kiln.log" 2>&1 \
    || echo "round $r: model_bench_cuda failed (see $R/kiln.log)" >> "$OUT/status.log"
}
run_pytorch() {
  log "round $r: PyTorch eager FP32 and torch.compile on cuda"
  local compile=()
  [[ ${KILN_BENCH_TORCH_COMPILE:-1} == 0 ]] && compile=(--no-torch-compile)
  timeout 240 "$PY" "$ROOT/bench/peers.py" --weights "$CACHE/base.safetensors" --device cuda --runs "$REPS" \
    "${compile[@]}" \
    --json-out "$R/pytorch.json" 2> "$R/pytorch.log" \
    || echo "round $r: PyTorch run failed (see $R/pytorch.log)" >> "$OUT/status.log"
}
for r in $(seq 1 "$ROUNDS"); do
  R=$OUT/round$r
  mkdir -p "$R"
  if (( r % 2 )); then run_kiln; run_pytorch; else run_pytorch; run_kiln; fi
done

echo "end $(date -Is) elapsed $(( $(date +%s) - START ))s" >> "$OUT/machine.log"

# 7. The table.
"$PY" "$ROOT/bench/report.py" --gpu "$OUT" | tee "$OUT/report.md"
log "done in $(( $(date +%s) - START )) s; JSON and logs in $OUT"
