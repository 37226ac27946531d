#!/usr/bin/env bash
# W6 (issue 26): kiln's LLaMA-style decoder (bench/llama_bench.cpp) next to PyTorch with a KV
# cache (bench/llama_peer.py) in one run, on this machine, and the table: prefill ms, decode
# tokens/s and decode against its bandwidth floor, at batch 1 and 16, f32 (and bf16 weights
# where the host has AVX512-BF16). Checkpoint and results in /tmp/kiln-bench/.
#   bench/run_w6.sh            (KILN_BENCH_THREADS, default 2; KILN_BENCH_BUILD: the build
#                               folder, default /tmp/build-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
out=/tmp/kiln-bench
mkdir -p "$out"
threads="${KILN_BENCH_THREADS:-2}"
export KILN_BENCH_THREADS="$threads"
build="${KILN_BENCH_BUILD:-/tmp/build-bench}"
if [[ -f "$build/CMakeCache.txt" ]]; then  # an existing build keeps its build type
  cmake -S . -B "$build" -DKILN_BUILD_BENCH=ON >/dev/null
else
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_BENCH=ON >/dev/null
fi
cmake --build "$build" -j "${KILN_JOBS:-2}" --target llama_bench
bf16=""  # bf16 autocast on CPU: see bench/README.md (W6): not timed by default
# PyTorch over OpenBLAS, as bench/run.sh runs it (Debian's torch links libblas.so.3, the
# reference BLAS unless OpenBLAS is the alternative): the installed one, or Debian's package
# unpacked into the cache (apt-get download; nothing is installed).
ob=/usr/lib/x86_64-linux-gnu/openblas-pthread
if [[ ! -e $ob/libblas.so.3 ]]; then
  ob="$out/openblas-root/usr/lib/x86_64-linux-gnu/openblas-pthread"
  if [[ ! -e $ob/libblas.so.3 ]]; then
    (cd "$out" && apt-get download libopenblas0-pthread >/dev/null &&
      dpkg -x libopenblas0-pthread_*.deb openblas-root)
  fi
fi
LD_LIBRARY_PATH="$ob" /usr/bin/python3 bench/llama_peer.py --weights-out "$out/llama_w6.safetensors" \
  --json-out "$out/w6_torch.json" $bf16
KILN_BENCH_LLAMA_WEIGHTS="$out/llama_w6.safetensors" "$build/bench/llama_bench" \
  --benchmark_format=json --benchmark_out="$out/w6_kiln.json" --benchmark_out_format=json \
  --benchmark_filter='W6|bandwidth' >/dev/null
/usr/bin/python3 - "$out/w6_kiln.json" "$out/w6_torch.json" <<'PY'
import json, sys
kiln = {b["name"]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
torch = json.load(open(sys.argv[2]))
gbs = max(b["GB/s"] for n, b in kiln.items() if n.startswith("bandwidth"))
d, kv, ff, L, V = 768, 256, 2048, 12, 32000
linear = L * (2 * d * d + 2 * d * kv + 3 * d * ff) + d * V
other = L * 2 * d + d + d  # norms, final norm, one embedding row
cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
print(f"W6 on {cpu}, {torch['threads']} threads, bandwidth {gbs:.1f} GB/s (PyTorch {torch['torch']})")
print("| dtype | batch | prefill ms kiln | PyTorch | ratio | decode tok/s kiln | PyTorch | ratio | kiln step ms | floor ms | step/floor |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for dtype, prefix in (("f32", ""), ("bf16", "bf16/")):
    for b in (1, 16):
        p = kiln.get(f"{prefix}W6/prefill_p128/{b}/real_time")
        g = kiln.get(f"{prefix}W6/generate_p128_n64/{b}/iterations:3/real_time")
        t = torch.get(f"{dtype}_b{b}")
        if not p or not g or not t:
            continue
        step = (g["real_time"] - p["real_time"]) / 63
        tok = b * 63 / ((g["real_time"] - p["real_time"]) / 1e3)
        bytes_ = 4 * (linear + other) if dtype == "f32" else 2 * linear + 4 * other
        floor = bytes_ / (gbs * 1e9) * 1e3
        print(f"| {dtype} | {b} | {p['real_time']:.1f} | {t['prefill_ms']:.1f} | "
              f"{t['prefill_ms'] / p['real_time']:.2f}x | {tok:.1f} | {t['decode_tok_s']:.1f} | "
              f"{tok / t['decode_tok_s']:.2f}x | {step:.1f} | {floor:.1f} | {step / floor:.2f} |")
PY
