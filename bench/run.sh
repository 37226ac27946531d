#!/usr/bin/env bash
# kiln's model benchmarks next to its peers, in one run (see bench/README.md):
#   builds model_bench and generate_bench (+ peak and bandwidth, + gemm_bench where oneDNN
#   is installed), makes the shared checkpoint / ONNX files / PyTorch references (cached in
#   $KILN_BENCH_CACHE), times `kiln compile` of the base model, then runs kiln + peak,
#   PyTorch eager and ONNX Runtime one after the other on the forward workloads (W1, W2, W4)
#   and generation (W3, W5) (in rounds; each also reports its load time and memory), and
#   gemm_bench (kiln vs oneDNN: medians of 20 interleaved repetitions, and paired ratios;
#   f32, bf16 against oneDNN's bf16 matmul, int8 against oneDNN's int8 matmul) in every round,
#   and prints the table (bench/report.py; with python3-matplotlib also the tokens/s plot).
#   kiln's model benches run its f32, bf16 and int8 builds side by side.
#   Results: $KILN_BENCH_CACHE/results/ (round*/ per round).
#
#   bench/run.sh
#
# Environment:
#   KILN_BENCH_BUILD   build directory          (default /tmp/build-bench)
#   KILN_BENCH_CACHE   weights, ONNX, results   (default /tmp/kiln-bench; ~0.9 GB)
#   KILN_BENCH_JOBS    build parallelism        (default 1)
#   KILN_BENCH_THREADS threads of every engine  (default 2)
#   KILN_BENCH_REPS    kiln repetitions / peer runs per workload (default 5)
#   KILN_BENCH_ROUNDS  rounds of kiln + PyTorch + ORT (default 2; report takes each best)
#   KILN_BENCH_GEMM=0  skip gemm_bench;  KILN_BENCH_SKIP_BUILD=1  use the build as is
#   KILN_BENCH_GENERATION=0  skip W3/W5;  KILN_BENCH_GENERATION=only  W3/W5 (+ peak,
#                      bandwidth) only: no model_bench, no forward workloads, no gemm_bench
#   KILN_BENCH_BF16=0  no bf16 rows (issue 13: kiln's bf16 build, PyTorch bf16 autocast,
#                      gemm_bench's bf16 shapes); they are built only on a host with AVX512-BF16
#   KILN_BENCH_INT8=0  no int8 rows (issue 27: kiln's int8 build, gemm_bench's int8 shapes against
#                      oneDNN's int8 matmul); they are built only on a host with AVX512-VNNI
#   KILN_BENCH_PEERS=0 kiln alone: no PyTorch or ONNX Runtime runs (and no ONNX export); the
#                      checkpoint and PyTorch's references are still made (peers.py, once)
#   KILN_BENCH_PLOT    the tokens/s plot report.py writes (default bench/tokens_per_s.svg; 0: none)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${KILN_BENCH_BUILD:-/tmp/build-bench}
CACHE=${KILN_BENCH_CACHE:-/tmp/kiln-bench}
JOBS=${KILN_BENCH_JOBS:-1}
export KILN_BENCH_THREADS=${KILN_BENCH_THREADS:-2}
GEN=${KILN_BENCH_GENERATION:-1}
REPS=${KILN_BENCH_REPS:-5}
BF16=${KILN_BENCH_BF16:-1}
INT8=${KILN_BENCH_INT8:-1}
PEERS=${KILN_BENCH_PEERS:-1}
# Without bf16 or int8: Google Benchmark's negative filters leave those benchmarks out.
MODEL_FILTER=(); GEMM_FILTER=(); PEERS_BF16=(); off=()
[[ $BF16 == 0 ]] && { off+=(bf16); PEERS_BF16=(--no-bf16); }
[[ $INT8 == 0 ]] && off+=(int8)
if ((${#off[@]})); then
  alt=$(IFS='|'; echo "${off[*]}")
  MODEL_FILTER=("--benchmark_filter=-^($alt)/"); GEMM_FILTER=("--benchmark_filter=-_($alt)/")
fi
PY=/usr/bin/python3
OUT=$CACHE/results
mkdir -p "$CACHE" "$OUT"
rm -rf "$OUT"/*.json "$OUT"/*.log "$OUT"/report.md "$OUT"/round*
START=$(date +%s)
log() { echo "[run.sh +$(( $(date +%s) - START ))s] $*" >&2; }
status() { echo "$1" >> "$OUT/status.log"; log "$1"; }
: > "$OUT/status.log"
echo "start $(date -Is) load $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/machine.log"
{ grep -m1 'model name' /proc/cpuinfo; grep -m1 'cpu family' /proc/cpuinfo; grep -m1 '^model\s' /proc/cpuinfo
  echo "cpus $(nproc)"; } >> "$OUT/machine.log"

# 1. Build.
if [[ "${KILN_BENCH_SKIP_BUILD:-0}" != 1 ]]; then
  log "configure + build in $BUILD (-j$JOBS)"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_BENCH=ON \
    > "$OUT/build.log" 2>&1 || status "cmake configure failed (see $OUT/build.log)"
  for t in peak_bench model_bench generate_bench gemm_bench; do
    if [[ $t == gemm_bench ]] && { [[ "${KILN_BENCH_GEMM:-1}" == 0 || $GEN == only ]] || ! grep -q 'build bench/gemm_bench:' "$BUILD/build.ninja" 2>/dev/null; }; then
      continue
    fi
    [[ $t == model_bench && $GEN == only ]] && continue
    [[ $t == generate_bench && $GEN == 0 ]] && continue
    CCACHE_NOHASHDIR=1 cmake --build "$BUILD" -j"$JOBS" --target $t >> "$OUT/build.log" 2>&1 \
      || status "build of $t failed (see $OUT/build.log)"
  done
fi

# 2. OpenBLAS for PyTorch: Debian's torch calls libblas.so.3, which is the netlib reference
#    BLAS unless an optimized one is installed. Use an installed OpenBLAS, else extract
#    Debian's libopenblas0-pthread into the cache (apt-get download; nothing is installed).
OPENBLAS_DIR=
if [[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ]]; then
  OPENBLAS_DIR=/usr/lib/x86_64-linux-gnu/openblas-pthread
else
  OB=$CACHE/openblas-root/usr/lib/x86_64-linux-gnu/openblas-pthread
  if [[ ! -e $OB/libblas.so.3 ]]; then
    log "fetching Debian's libopenblas0-pthread (apt-get download) into $CACHE"
    mkdir -p "$CACHE/debs"
    (cd "$CACHE/debs" && apt-get download libopenblas0-pthread >/dev/null 2>&1 \
      && dpkg-deb -x libopenblas0-pthread_*.deb "$CACHE/openblas-root") \
      || status "could not fetch libopenblas0-pthread: PyTorch runs with the system BLAS only"
  fi
  [[ -e $OB/libblas.so.3 ]] && OPENBLAS_DIR=$OB
fi

# 3. The checkpoint every engine runs, PyTorch's reference logits and generated ids, the
#    ONNX exports (forward, encode; gen_encode, gen_step for generation).
log "weights / references / ONNX (cached in $CACHE)"
ONNX=(--onnx-dir "$CACHE")
[[ $PEERS == 0 ]] && ONNX=()
$PY "$ROOT/bench/peers.py" --weights-out "$CACHE/base.safetensors" \
  --reference-out "$CACHE/reference.safetensors" \
  --generation-reference-out "$CACHE/gen_reference.safetensors" "${ONNX[@]}" 2> "$OUT/peers-prepare.log" \
  || status "peers.py (weights/ONNX) failed (see $OUT/peers-prepare.log)"

# 3b. kiln's ahead-of-time step, timed: emit the model bench_base is built from and compile
#     it as kiln_add_model does (kiln compile; the library is written to the cache).
if [[ -x "$BUILD/tools/kiln" ]]; then
  log "kiln compile of the base model (timed)"
  mkdir -p "$CACHE/compile"
  if "$BUILD/tools/kiln" emit transformer --config base --set max_len=1024 -o "$CACHE/compile/base.kir" \
       > "$OUT/compile.log" 2>&1; then
    t0=$(date +%s.%N)
    if "$BUILD/tools/kiln" compile "$CACHE/compile/base.kir" --name transformer -o "$CACHE/compile/out" \
         >> "$OUT/compile.log" 2>&1; then
      t1=$(date +%s.%N)
      $PY -c 'import json, os, sys; print(json.dumps({"seconds": round(float(sys.argv[2]) - float(sys.argv[1]), 2),
               "library_bytes": os.path.getsize(sys.argv[3])}))' "$t0" "$t1" \
        "$CACHE/compile/out/libtransformer.a" > "$OUT/compile.json"
    else
      status "kiln compile of the base model failed (see $OUT/compile.log)"
    fi
  else
    status "kiln emit of the base model failed (see $OUT/compile.log)"
  fi
fi

# 4. ONNX Runtime's npm package.
if [[ $PEERS != 0 && ! -d "$ROOT/bench/ort/node_modules/onnxruntime-node" ]]; then
  log "npm ci in bench/ort"
  (cd "$ROOT/bench/ort" && npm ci --no-audit --no-fund > "$OUT/npm.log" 2>&1) \
    || status "npm ci for onnxruntime-node failed (see $OUT/npm.log): no ONNX Runtime numbers"
fi

# 5. The runs: KILN_BENCH_ROUNDS rounds (default 2) of kiln, PyTorch and ONNX Runtime, one
#    engine after the other, in reverse order in even rounds. The machine is shared, so
#    the load changes between engines: before each peer a short peak probe records how
#    fast the machine was then, and report.py takes each engine's best round. Round 1
#    tries every PyTorch BLAS setting; later rounds rerun only the best ones.
export KILN_BENCH_WEIGHTS=$CACHE/base.safetensors
export KILN_BENCH_REFERENCE=$CACHE/reference.safetensors
export KILN_BENCH_GEN_REFERENCE=$CACHE/gen_reference.safetensors
ROUNDS=${KILN_BENCH_ROUNDS:-2}
peak_probe() {
  [[ -x "$BUILD/bench/peak_bench" ]] && "$BUILD/bench/peak_bench" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_out="$1" --benchmark_out_format=json > /dev/null 2>&1
}
run_kiln() {
  if [[ $GEN == only ]]; then
    :
  elif [[ -x "$BUILD/bench/model_bench" ]]; then
    if [[ $r == 1 ]]; then
      # Load time and memory, one process per model (the timed run below holds both models and
      # the bandwidth probe's 512 MiB): W1, W2, W4 once each (~5 s per process).
      log "round $r: kiln model_bench memory runs (f32, bf16, int8: load, RSS; one call per workload)"
      KILN_BENCH_MEMORY_OUT="$R/kiln-memory.json" "$BUILD/bench/model_bench" \
        --benchmark_filter='^W[0-9]' --benchmark_min_time=1e-6 > "$R/kiln-memory.log" 2>&1 \
        || status "round $r: model_bench memory run failed (see $R/kiln-memory.log)"
      if [[ $BF16 != 0 ]] && grep -q 'bf16/W1' <("$BUILD/bench/model_bench" --benchmark_list_tests 2>/dev/null); then
        KILN_BENCH_MEMORY_OUT="$R/kiln-memory-bf16.json" "$BUILD/bench/model_bench" \
          --benchmark_filter='^bf16/W[0-9]' --benchmark_min_time=1e-6 > "$R/kiln-memory-bf16.log" 2>&1 \
          || status "round $r: model_bench bf16 memory run failed (see $R/kiln-memory-bf16.log)"
      fi
      if [[ $INT8 != 0 ]] && grep -q 'int8/W1' <("$BUILD/bench/model_bench" --benchmark_list_tests 2>/dev/null); then
        KILN_BENCH_MEMORY_OUT="$R/kiln-memory-int8.json" "$BUILD/bench/model_bench" \
          --benchmark_filter='^int8/W[0-9]' --benchmark_min_time=1e-6 > "$R/kiln-memory-int8.log" 2>&1 \
          || status "round $r: model_bench int8 memory run failed (see $R/kiln-memory-int8.log)"
      fi
    fi
    log "round $r: kiln model_bench (peak, bandwidth, W1, W2, W4, check; f32, bf16, int8; $REPS repetitions, interleaved)"
    # Random interleaving: the peak, the bandwidth and the workloads of both builds alternate,
    # so they see the same load. Console: aggregates only; JSON: every repetition too (report.py
    # shows the min).
    "$BUILD/bench/model_bench" --benchmark_repetitions="$REPS" --benchmark_display_aggregates_only=true \
      --benchmark_enable_random_interleaving=true "${MODEL_FILTER[@]}" \
      --benchmark_out="$R/kiln.json" --benchmark_out_format=json > "$R/kiln.log" 2>&1 \
      || status "round $r: model_bench failed (see $R/kiln.log)"
  else
    status "round $r: model_bench is not built: no kiln numbers"
    peak_probe "$R/peak-kiln.json"
  fi
  [[ $GEN == 0 ]] && return 0
  if [[ -x "$BUILD/bench/generate_bench" ]]; then
    log "round $r: kiln generate_bench (peak, bandwidth, W3, W5, check; $REPS repetitions, interleaved)"
    # Interleaved like model_bench: the bandwidth W3's floor divides by is measured between
    # W3's repetitions. Round 1 also writes kiln's per-kernel profile of W3 and W5 (after
    # the timed runs, with profiling on).
    local prof=()
    [[ $r == 1 ]] && prof=(env KILN_BENCH_PROFILE_OUT="$R/kiln-gen-profile.txt")
    "${prof[@]}" "$BUILD/bench/generate_bench" --benchmark_repetitions="$REPS" \
      --benchmark_display_aggregates_only=true --benchmark_enable_random_interleaving=true "${MODEL_FILTER[@]}" \
      --benchmark_out="$R/kiln-gen.json" --benchmark_out_format=json > "$R/kiln-gen.log" 2>&1 \
      || status "round $r: generate_bench failed (see $R/kiln-gen.log)"
  else
    status "round $r: generate_bench is not built: no kiln generation numbers"
  fi
}
run_pytorch() {
  [[ $PEERS == 0 ]] && return 0
  peak_probe "$R/peak-pytorch.json"
  local only=()
  [[ $r -gt 1 && -s "$OUT/round1/pytorch.json" ]] && only=(--only-settings-from "$OUT/round1/pytorch.json")
  local genflag=()
  [[ $GEN == 0 ]] && genflag=(--no-generation)
  [[ $GEN == only ]] && genflag=(--generation-only)
  local what="every BLAS setting"
  [[ ${#only[@]} -gt 0 ]] && what="the best settings of round 1"
  log "round $r: PyTorch eager ($what, one subprocess each)"
  $PY "$ROOT/bench/peers.py" --weights "$CACHE/base.safetensors" --onnx-dir "$CACHE" \
    ${OPENBLAS_DIR:+--openblas-dir "$OPENBLAS_DIR"} --threads "$KILN_BENCH_THREADS" --runs "$REPS" \
    "${only[@]}" "${genflag[@]}" "${PEERS_BF16[@]}" --json-out "$R/pytorch.json" 2> "$R/pytorch.log" \
    || status "round $r: PyTorch run failed (see $R/pytorch.log)"
}
run_ort() {
  [[ $PEERS == 0 ]] && return 0
  [[ -d "$ROOT/bench/ort/node_modules/onnxruntime-node" ]] || return 0
  peak_probe "$R/peak-ort.json"
  log "round $r: ONNX Runtime (onnxruntime-node)"
  local only=()
  [[ $GEN == 0 ]] && only=(--only forward)
  [[ $GEN == only ]] && only=(--only generation)
  # Generation: both thread-pool settings in round 1, then each workload's faster one.
  [[ $r -gt 1 && -s "$OUT/round1/ort.json" ]] && only+=(--generation-settings-from "$OUT/round1/ort.json")
  node "$ROOT/bench/ort/run.mjs" --onnx-dir "$CACHE" --reference "$CACHE/reference.safetensors" \
    --generation-reference "$CACHE/gen_reference.safetensors" "${only[@]}" \
    --threads "$KILN_BENCH_THREADS" --runs "$REPS" --json-out "$R/ort.json" 2> "$R/ort.log" \
    || status "round $r: ONNX Runtime run failed (see $R/ort.log)"
}
for r in $(seq 1 "$ROUNDS"); do
  R=$OUT/round$r
  rm -rf "$R" && mkdir -p "$R"
  echo "round $r start $(date -Is) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.log"
  if (( r % 2 )); then run_kiln; run_pytorch; run_ort; else run_ort; run_pytorch; run_kiln; fi
  if [[ "${KILN_BENCH_GEMM:-1}" != 0 && $GEN != only && -x "$BUILD/bench/gemm_bench" ]]; then
    log "round $r: gemm_bench (kiln linear kernels vs oneDNN: f32, bf16, int8)"
    # Many short repetitions in random order, medians reported: the shared machine's load
    # moves within seconds, and a single long run per shape lets one burst decide a ratio.
    # Once per round, like the model workloads: report.py takes each library's best round
    # of GFLOP/s, and the median of the paired ratios (paired/SHAPE) over every round.
    "$BUILD/bench/gemm_bench" --benchmark_min_time=0.05 --benchmark_repetitions=20 \
      --benchmark_enable_random_interleaving=true "${GEMM_FILTER[@]}" \
      --benchmark_out="$R/gemm.json" --benchmark_out_format=json \
      > "$R/gemm.log" 2>&1 || status "round $r: gemm_bench failed (see $R/gemm.log)"
  fi
done
echo "end $(date -Is) load $(cut -d' ' -f1-3 /proc/loadavg) elapsed $(( $(date +%s) - START ))s" >> "$OUT/machine.log"

# 6. The table.
$PY "$ROOT/bench/report.py" "$OUT" | tee "$OUT/report.md"
log "done in $(( $(date +%s) - START )) s; JSON and logs in $OUT"
