// Model benchmark: the paper's base Transformer (frontend/models.cpp "base", max_len
// raised to 1024 for W4, max_batch 16) compiled by kiln (kiln_add_model in
// bench/CMakeLists.txt) on the workloads, with KILN_BENCH_THREADS (default 2)
// threads, plus the machine's FMA peak (`peak`, bench/peak.cpp) in the same process.
//
//   KILN_BENCH_WEIGHTS=/tmp/kiln-bench/base.safetensors model_bench \
//       [--benchmark_repetitions=5 --benchmark_report_aggregates_only=true]
//
// Workloads (random token ids in [1, vocab) from a fixed seed: no padding):
//   W1  forward, batch 1,  src 32,   tgt 32    (latency)
//   W2  forward, batch 16, src 128,  tgt 128   (throughput)
//   W4  encode,  batch 1,  src 1024            (long sequence)
// Weights: any checkpoint of the base config by state_dict name, e.g. the one
// bench/peers.py writes (the same file PyTorch and ONNX Runtime run), path in
// KILN_BENCH_WEIGHTS; without it every model benchmark is skipped with a message.
// With KILN_BENCH_REFERENCE (peers.py --reference-out: W1-shaped ids and PyTorch's logits)
// `check_vs_pytorch` reports kiln's largest difference from PyTorch on those ids.
//
// Setup and memory: with KILN_BENCH_MEMORY_OUT=FILE, the process writes at exit a JSON
// object with the model's load time (kiln_models::bench_base's constructor: read and check
// the safetensors, lay out the weights, allocate the arena), the resident set size right
// after it, and the process's peak resident set size (getrusage; over every workload run).
//
// bf16 (issue 13): where the host has AVX512-BF16 (bench/CMakeLists.txt, KILN_BENCH_BF16), the
// same model compiled with `WEIGHTS bf16` (bench_base_bf16: linear weights converted from
// the same f32 checkpoint and packed as bf16 at load) runs the same workloads, registered
// as bf16/W1_forward_b1_s32_t32 etc. and interleaved with the f32 ones; the bf16 model is
// loaded at its first workload, so a run filtered to the f32 workloads never loads it
// (bench/run.sh's memory runs: one process per model).
//
// int8 (issue 27): where the host has AVX512-VNNI (KILN_BENCH_INT8), the same model compiled
// with `WEIGHTS int8` (bench_base_int8: linear weights quantized per output row at load from
// the same f32 checkpoint, s8 with an f32 scale and an i32 row sum per row; activations
// quantized per row as each int8 linear reads them) as int8/W1_forward_b1_s32_t32 etc. and
// int8/check_vs_pytorch, interleaved with the others; loaded at its first workload too.
//
// W1's floor (issue 13): W1 reads every weight once per call (but for the two embedding
// tables, of which it reads one row per token), so its time is bounded below by those
// bytes over the memory bandwidth. `bandwidth` (bench/bandwidth.cpp) runs in this process,
// interleaved with the workloads; W1's rows carry the bytes (floor_weight_MB: f32, or
// bf16 linear weights with f32 biases, norms and embedding rows, or int8 linear weights at
// 1 byte plus 8 bytes per output row, its scale and row sum) and report.py divides.
//
// GPU (issues 14 and 30): built as model_bench_cuda (bench/CMakeLists.txt, KILN_BENCH_GPU=ON) the
// same workloads run the model compiled for host-cuda-cuda_capability_86 (bench_base_cuda; no
// bf16, no peak or bandwidth): W1_... with host ids in and host logits out, as an application
// calls it; device/W1_... with device tensors (ids uploaded once, the output left on the
// device, each call ended by a device sync: BM_device_workload), as PyTorch's GPU times are
// taken; legacy/W1_... the same with the model compiled with the GPU GEMM schedule before
// issue 30 (bench_base_cuda_legacy, KILN_GPU_LINEAR=legacy). KILN_BENCH_PROFILE_OUT=FILE
// appends kiln's per-kernel profile of each device workload to FILE.
// Without a CUDA driver every workload is skipped with the runtime's message (bench/run_gpu.sh
// stops before that with "no CUDA driver/device").
//
// Timing: one call per iteration through the C ABI (kiln_model_run) into output buffers
// allocated before the timed loop: the model's time, not the C++ wrapper's allocation
// and zero-fill of a fresh result (forward() allocates 16·128·32000 floats = 262 MB for
// W2). One untimed warm-up call per workload first. Wall-clock time (UseRealTime): the kernels run
// on several threads.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#ifdef KILN_BENCH_CUDA
#include "bench_base_cuda.h"
#include "bench_base_cuda_legacy.h"
#include "device_tensor.h"
#else
#include "bench_base.h"
#endif
#ifdef KILN_BENCH_BF16
#include "bench_base_bf16.h"
#endif
#ifdef KILN_BENCH_INT8
#include "bench_base_int8.h"
#endif
#include "peak.h"

namespace kiln_bench {
namespace {

// The base config (frontend/models.cpp); the compiled library checks weights against it.
constexpr double kDModel = 512, kHeads = 8, kDk = kDModel / kHeads, kDff = 2048;
constexpr double kEncLayers = 6, kDecLayers = 6, kTgtVocab = 32000;
constexpr int64_t kSrcVocab = 32000, kTgtVocabI = 32000, kPadId = 0;

// FLOPs counted analytically: 2·M·N·K for every linear (M = rows = batch·length), and for
// attention 2·B·H·Lq·Lk·dk for QKᵀ plus the same for P·V. Causal self-attention is counted
// in full (as if no score were masked). LayerNorm, softmax, embeddings, residual adds and
// other elementwise work are not counted.
//   encoder layer (S source tokens, n = B·S):
//     2·n·d·3d (QKV) + 2·n·d·d (out) + 2·n·d·dff + 2·n·dff·d (FFN) + 2·2·B·H·S·S·dk
//   decoder layer (T target tokens, m = B·T):
//     self:  2·m·d·3d + 2·m·d·d + 2·2·B·H·T·T·dk
//     cross: 2·m·d·d (Q) + 2·n·d·2d (K,V of the memory) + 2·m·d·d (out) + 2·2·B·H·T·S·dk
//     FFN:   2·m·d·dff + 2·m·dff·d
//   generator: 2·m·d·tgt_vocab
//   forward = 6 encoder layers + 6 decoder layers + generator; encode = 6 encoder layers.
// W1 ≈ 3.905 GFLOP, W2 ≈ 257.16 GFLOP, W4 ≈ 51.54 GFLOP.
double encoder_flops(double B, double S) {
  const double n = B * S;
  const double linear = 2 * n * kDModel * 3 * kDModel + 2 * n * kDModel * kDModel +
                        2 * n * kDModel * kDff + 2 * n * kDff * kDModel;
  const double attention = 2 * 2 * B * kHeads * S * S * kDk;
  return kEncLayers * (linear + attention);
}

double decoder_flops(double B, double S, double T) {
  const double n = B * S, m = B * T;
  const double self =
      2 * m * kDModel * 3 * kDModel + 2 * m * kDModel * kDModel + 2 * 2 * B * kHeads * T * T * kDk;
  const double cross = 2 * m * kDModel * kDModel + 2 * n * kDModel * 2 * kDModel +
                       2 * m * kDModel * kDModel + 2 * 2 * B * kHeads * T * S * kDk;
  const double ffn = 2 * m * kDModel * kDff + 2 * m * kDff * kDModel;
  return kDecLayers * (self + cross + ffn);
}

double generator_flops(double B, double T) { return 2 * B * T * kDModel * kTgtVocab; }

// The bytes of weights a forward call reads at least once: every linear's weight (`linear`
// bytes per element: 4 in f32, 2 in bf16, 1 in int8) and bias, every LayerNorm, the
// generator, and one row of an embedding table per token (B·S source, B·T target); f32
// except the linear weights; `per_row` more bytes per output row of every linear (int8: its
// f32 scale and i32 row sum, 8; every N here is a multiple of 64, so no padding). Per encoder
// layer: q, k, v, o and the FFN, two LayerNorms; per decoder layer: self q, k, v, o, cross
// q, k, v, o, the FFN, three LayerNorms; the two final LayerNorms.
// W1, f32: 242.36 MB; bf16: 121.51 MB; int8: 61.88 MB.
double forward_weight_bytes(double B, double S, double T, double linear, double per_row = 0) {
  const double d = kDModel, ff = kDff;
  const double enc_w = 4 * d * d + d * ff + ff * d, enc_f32 = 4 * d + ff + d + 2 * 2 * d;
  const double dec_w = 8 * d * d + d * ff + ff * d, dec_f32 = 8 * d + ff + d + 3 * 2 * d;
  const double weights = kEncLayers * enc_w + kDecLayers * dec_w + kTgtVocab * d;
  const double rows = kEncLayers * (4 * d + ff + d) + kDecLayers * (8 * d + ff + d) + kTgtVocab;
  const double f32s =
      kEncLayers * enc_f32 + kDecLayers * dec_f32 + 2 * 2 * d + kTgtVocab + (B * S + B * T) * d;
  return linear * weights + per_row * rows + 4 * f32s;
}

// The weights' element type of a model library; also g_load's index.
// kLegacy: the CUDA build's model with the GPU GEMM schedule before issue 30 (f32).
enum Dtype { kF32 = 0, kBf16 = 1, kInt8 = 2, kLegacy = 3 };
const char* const kDtypePrefix[] = {"", "bf16_", "int8_", "legacy_"};

struct Workload {
  const char* name;
  const char* function;  // "forward" or "encode"
  int64_t batch, src_len, tgt_len;
  uint64_t seed;
  double flops() const {
    const double B = static_cast<double>(batch), S = static_cast<double>(src_len),
                 T = static_cast<double>(tgt_len);
    if (std::string(function) == "encode") return encoder_flops(B, S);
    return encoder_flops(B, S) + decoder_flops(B, S, T) + generator_flops(B, T);
  }
};

const Workload kWorkloads[] = {
    {"W1_forward_b1_s32_t32", "forward", 1, 32, 32, 101},
    {"W2_forward_b16_s128_t128", "forward", 16, 128, 128, 102},
    {"W4_encode_b1_s1024", "encode", 1, 1024, 0, 104},
};

// Ids uniform in [1, vocab): never the pad id 0, so no padding.
std::vector<int64_t> random_ids(std::mt19937_64& rng, int64_t count, int64_t vocab) {
  std::uniform_int_distribution<int64_t> dist(kPadId + 1, vocab - 1);
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (auto& id : ids) id = dist(rng);
  return ids;
}

// A model, loaded once (375 MB of weights; 244 MB in bf16, converted from the f32
// checkpoint) on first use, outside any timing.
template <typename Model>
struct Loaded {
  std::unique_ptr<Model> model;
  std::string error;
  double load_ms = 0;
  double rss_after_load_mib = 0;
};

// The resident set size now (VmRSS of /proc/self/status), in MiB; 0 if unreadable.
double rss_mib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmRSS: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib / 1024.0;
}

// Writes the setup and memory figures to KILN_BENCH_MEMORY_OUT at exit (see the header).
void write_memory_report();

// The load figures of the models this process loaded, for write_memory_report: f32, bf16,
// int8 (Dtype).
struct LoadFigures {
  bool loaded = false;
  double load_ms = 0, rss_after_load_mib = 0;
};
LoadFigures g_load[4];

template <typename Model>
Loaded<Model>& loaded(int which) {  // which: a Dtype (g_load's index)
  static Loaded<Model> l = [which] {
    Loaded<Model> r;
    const char* path = std::getenv("KILN_BENCH_WEIGHTS");
    if (!path || !*path) {
      r.error =
          "KILN_BENCH_WEIGHTS is not set: point it at a base-config safetensors checkpoint "
          "(bench/peers.py --weights-out writes one; bench/run.sh does it all)";
      return r;
    }
    try {
      const auto start = std::chrono::steady_clock::now();
      r.model = std::make_unique<Model>(path);
      r.load_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      r.rss_after_load_mib = rss_mib();
      r.model->set_num_threads(bench_threads());
      g_load[which] = {true, r.load_ms, r.rss_after_load_mib};
      static const bool registered = std::atexit(write_memory_report) == 0;
      (void)registered;
    } catch (const std::exception& e) {
      r.error = std::string("cannot create the compiled model: ") + e.what();
    }
    return r;
  }();
  return l;
}

#ifdef KILN_BENCH_CUDA
using BaseModel = kiln_models::bench_base_cuda;
#else
using BaseModel = kiln_models::bench_base;
#endif
Loaded<BaseModel>& loaded_f32() { return loaded<BaseModel>(kF32); }

// Model figures in the JSON: load_ms and rss_after_load_mib of the f32 model, bf16_load_ms and
// bf16_rss_after_load_mib of the bf16 one, int8_load_ms and int8_rss_after_load_mib of the int8
// one (those that were loaded), and the process's peak.
void write_memory_report() {
  const char* out = std::getenv("KILN_BENCH_MEMORY_OUT");
  if (!out || !*out) return;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  if (std::FILE* f = std::fopen(out, "w")) {
    std::fprintf(f, "{");
    for (int i = 0; i < 4; ++i) {
      if (!g_load[i].loaded) continue;
      const char* prefix = kDtypePrefix[i];
      std::fprintf(f, "\"%sload_ms\": %.1f, \"%srss_after_load_mib\": %.1f, ", prefix,
                   g_load[i].load_ms, prefix, g_load[i].rss_after_load_mib);
    }
    std::fprintf(f, "\"peak_rss_mib\": %.1f}\n", static_cast<double>(usage.ru_maxrss) / 1024.0);
    std::fclose(f);
  }
}

kiln_tensor make_input(const std::vector<int64_t>& ids, int64_t rows, int64_t cols) {
  kiln_tensor t{};
  t.name = nullptr;  // by position
  t.dtype = KILN_I64;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.data = const_cast<int64_t*>(ids.data());
  t.capacity = ids.size() * sizeof(int64_t);
  return t;
}

// Inputs and preallocated outputs of one entry point call.
struct Call {
  std::vector<std::vector<int64_t>> ids;
  std::vector<kiln_tensor> inputs, outputs;
  std::vector<std::vector<float>> buffers;

  // Returns "" or the runtime's message.
  std::string prepare(kiln_model* m, const char* function) {
    const int n = kiln_model_num_outputs(m, function);
    if (n < 0) return std::string("the model has no entry point '") + function + "'";
    outputs.assign(static_cast<size_t>(n), kiln_tensor{});
    if (kiln_model_output_shapes(m, function, inputs.data(), inputs.size(), outputs.data(),
                                 outputs.size()) != 0)
      return kiln_model_error(m);
    buffers.resize(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      int64_t numel = 1;
      for (int d = 0; d < outputs[i].rank; ++d) numel *= outputs[i].shape[d];
      buffers[i].assign(static_cast<size_t>(numel), 0.0f);
      outputs[i].data = buffers[i].data();
      outputs[i].capacity = buffers[i].size() * sizeof(float);
    }
    return "";
  }
  int run(kiln_model* m, const char* function) {
    return kiln_model_run(m, function, inputs.data(), inputs.size(), outputs.data(),
                          outputs.size());
  }
  bool finite() const {
    for (const auto& b : buffers)
      for (float v : b)
        if (!std::isfinite(v)) return false;
    return true;
  }
};

template <typename Model>
void BM_workload(benchmark::State& state, const Workload& w, Loaded<Model>& (*get_loaded)(),
                 Dtype dtype) {
  Loaded<Model>& l = get_loaded();
  if (!l.model) {
    state.SkipWithError(l.error.c_str());
    return;
  }
  kiln_model* m = l.model->get();
  std::mt19937_64 rng(w.seed);
  Call call;
  call.ids.push_back(random_ids(rng, w.batch * w.src_len, kSrcVocab));
  if (std::string(w.function) == "forward")
    call.ids.push_back(random_ids(rng, w.batch * w.tgt_len, kTgtVocabI));
  call.inputs.push_back(make_input(call.ids[0], w.batch, w.src_len));
  if (call.ids.size() > 1) call.inputs.push_back(make_input(call.ids[1], w.batch, w.tgt_len));
  if (std::string err = call.prepare(m, w.function); !err.empty()) {
    state.SkipWithError(err.c_str());
    return;
  }
  // Warm-up (untimed), once per workload (not per repetition): first touch of the arena,
  // thread pool start; the outputs must be finite.
  static std::set<std::pair<const Workload*, Dtype>> warmed;
  if (warmed.insert({&w, dtype}).second) {
    if (call.run(m, w.function) != 0) {
      state.SkipWithError(kiln_model_error(m));
      return;
    }
    if (!call.finite()) {
      state.SkipWithError("kiln's output has NaN or Inf");
      return;
    }
  }
  for (auto _ : state) {
    if (call.run(m, w.function) != 0) {
      state.SkipWithError(kiln_model_error(m));
      break;
    }
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(w.flops() / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP"] = w.flops() / 1e9;
  state.counters["threads"] = bench_threads();
  if (w.batch == 1 && std::string(w.function) == "forward")  // W1: its bandwidth floor
    state.counters["floor_weight_MB"] =
        forward_weight_bytes(static_cast<double>(w.batch), static_cast<double>(w.src_len),
                             static_cast<double>(w.tgt_len),
                             dtype == kBf16   ? 2
                             : dtype == kInt8 ? 1
                                              : 4,
                             dtype == kInt8 ? 8 : 0) /
        1e6;
}

// kiln against PyTorch on the same ids (W1 shape): max |kiln - PyTorch f32| and max |kiln -
// PyTorch f64| over the logits, and the largest |logit| for scale (peers.py writes the
// file and, in its metadata, PyTorch f32's own distance from f64). Not a timing.
template <typename Model>
void BM_check(benchmark::State& state, Loaded<Model>& (*get_loaded)()) {
  const char* ref = std::getenv("KILN_BENCH_REFERENCE");
  Loaded<Model>& l = get_loaded();
  if (!ref || !*ref) {
    state.SkipWithError(
        "KILN_BENCH_REFERENCE is not set (bench/peers.py --reference-out writes it)");
    return;
  }
  if (!l.model) {
    state.SkipWithError(l.error.c_str());
    return;
  }
  double err = 0, err64 = 0, scale = 0;
  try {
    auto src = kiln::read_tensor<int64_t>(ref, "src");
    auto tgt = kiln::read_tensor<int64_t>(ref, "tgt");
    auto want = kiln::read_tensor<float>(ref, "logits");
    auto want64 = kiln::read_tensor<float>(ref, "logits_f64");
    for (auto _ : state) {
      kiln::Tensor<float> got = l.model->forward(src, tgt);
      if (got.shape != want.shape)
        throw std::runtime_error("kiln's logits have another shape than PyTorch's");
      err = err64 = 0;
      for (size_t i = 0; i < got.data.size(); ++i) {
        err = std::max(err, std::abs(static_cast<double>(got.data[i]) - want.data[i]));
        err64 = std::max(err64, std::abs(static_cast<double>(got.data[i]) - want64.data[i]));
      }
    }
    for (float v : want64.data) scale = std::max(scale, std::abs(static_cast<double>(v)));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  state.counters["max_abs_err"] = err;
  state.counters["max_abs_err_f64"] = err64;
  state.counters["max_abs_logit"] = scale;
}

#ifdef KILN_BENCH_CUDA
Loaded<kiln_models::bench_base_cuda_legacy>& loaded_legacy() {
  return loaded<kiln_models::bench_base_cuda_legacy>(kLegacy);
}

// The workload with device tensors (kiln_model_run_device): the ids uploaded once, the
// logits (or memory) written to a device buffer allocated once; each iteration is a call and
// a device sync on the output, so the time is the kernels' and the runtime's per-call work,
// without the host copies (W2's logits are 262 MB), as PyTorch's times are device tensors in
// and out. With KILN_BENCH_PROFILE_OUT=FILE, after the first timed loop of each workload and
// model the process runs it 3 more times with kiln's profiling on (each kernel synced:
// runtime/model.cpp) and appends the profile to FILE under a "== name" line.
template <typename Model>
void BM_device_workload(benchmark::State& state, const Workload& w, Loaded<Model>& (*get_loaded)(),
                        const std::string& name) {
  Loaded<Model>& l = get_loaded();
  if (!l.model) {
    state.SkipWithError(l.error.c_str());
    return;
  }
  kiln_model* m = l.model->get();
  std::mt19937_64 rng(w.seed);
  DeviceCall device_call(m, w.function);
  const std::vector<int64_t> src = random_ids(rng, w.batch * w.src_len, kSrcVocab);
  std::string error = device_call.add_input(KILN_I64, {w.batch, w.src_len}, src.data());
  if (error.empty() && std::string(w.function) == "forward") {
    const std::vector<int64_t> tgt = random_ids(rng, w.batch * w.tgt_len, kTgtVocabI);
    error = device_call.add_input(KILN_I64, {w.batch, w.tgt_len}, tgt.data());
  }
  if (error.empty()) error = device_call.prepare_output();
  if (!error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  auto call = [&] { return device_call.run() == 0 && device_call.sync() == 0; };
  static std::set<std::string> warmed, profiled;
  if (warmed.insert(name).second && !call()) {
    state.SkipWithError(kiln_model_error(m));
    return;
  }
  for (auto _ : state)
    if (!call()) {
      state.SkipWithError(kiln_model_error(m));
      return;
    }
  state.counters["GFLOP/s"] =
      benchmark::Counter(w.flops() / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP"] = w.flops() / 1e9;
  const char* profile_out = std::getenv("KILN_BENCH_PROFILE_OUT");
  if (profile_out && *profile_out && profiled.insert(name).second) {
    kiln_model_set_profiling(m, 1);
    bool ok = true;
    for (int i = 0; i < 3 && ok; ++i) ok = call();
    if (std::FILE* f = std::fopen(profile_out, "a")) {
      std::fprintf(f, "== %s\n%s\n", name.c_str(),
                   ok ? kiln_model_profile(m) : kiln_model_error(m));
      std::fclose(f);
    }
    kiln_model_set_profiling(m, 0);
  }
}
#endif

#ifdef KILN_BENCH_BF16
Loaded<kiln_models::bench_base_bf16>& loaded_bf16() {
  return loaded<kiln_models::bench_base_bf16>(kBf16);
}
#endif
#ifdef KILN_BENCH_INT8
Loaded<kiln_models::bench_base_int8>& loaded_int8() {
  return loaded<kiln_models::bench_base_int8>(kInt8);
}
#endif

const bool registered = [] {
  for (const Workload& w : kWorkloads)
    benchmark::RegisterBenchmark(w.name,
                                 [&w](benchmark::State& s) { BM_workload(s, w, loaded_f32, kF32); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("check_vs_pytorch",
                               [](benchmark::State& s) { BM_check(s, loaded_f32); })
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
#ifdef KILN_BENCH_CUDA
  // Device tensors in and out (BM_device_workload): "device/W1_..." for kiln's GPU schedules,
  // "legacy/W1_..." for the same model with the GEMM schedule before issue 30.
  auto device_bench = [](const Workload& w, const std::string& name, auto get) {
    benchmark::RegisterBenchmark(
        name.c_str(), [&w, name, get](benchmark::State& s) { BM_device_workload(s, w, get, name); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  for (const Workload& w : kWorkloads) {
    device_bench(w, std::string("device/") + w.name, loaded_f32);
    device_bench(w, std::string("legacy/") + w.name, loaded_legacy);
  }
  benchmark::RegisterBenchmark("legacy/check_vs_pytorch",
                               [](benchmark::State& s) { BM_check(s, loaded_legacy); })
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
#endif
#ifdef KILN_BENCH_BF16
  // The bf16 library: the same workloads (and ids), "bf16/" before the name.
  for (const Workload& w : kWorkloads)
    benchmark::RegisterBenchmark(
        (std::string("bf16/") + w.name).c_str(),
        [&w](benchmark::State& s) { BM_workload(s, w, loaded_bf16, kBf16); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("bf16/check_vs_pytorch",
                               [](benchmark::State& s) { BM_check(s, loaded_bf16); })
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
#endif
#ifdef KILN_BENCH_INT8
  // The int8 library: the same workloads (and ids), "int8/" before the name.
  for (const Workload& w : kWorkloads)
    benchmark::RegisterBenchmark(
        (std::string("int8/") + w.name).c_str(),
        [&w](benchmark::State& s) { BM_workload(s, w, loaded_int8, kInt8); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("int8/check_vs_pytorch",
                               [](benchmark::State& s) { BM_check(s, loaded_int8); })
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
#endif
  return true;
}();

}  // namespace
}  // namespace kiln_bench
