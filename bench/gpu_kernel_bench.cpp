// GPU kernels on their own (issue 30), beside PyTorch's (bench/gpu_kernels_peer.py, same
// shapes, same GPU; bench/report.py --gpu prints the ratios):
//   gemm/<variant>/<shape>/M<m>  kiln's `linear` on the model's GEMM shapes
//                                (bench/gemm_shapes.kir: K 512 or 2048, N 512 to 32000, bias,
//                                one with ReLU) at M = 32 (W1), 128 and 256 (a decoding
//                                step's hypotheses, the split-K limit), 1024 (W4) and 2048 (W2),
//                                each compiled for CUDA once per GEMM schedule of the experiment
//                                (bench/CMakeLists.txt: bench_gemm_cuda_<variant>, compiled
//                                with KILN_GPU_LINEAR; "default" is what kiln compiles today);
//                                PyTorch: torch.addmm (cuBLAS SGEMM, TF32 off).
//   attention/<variant>/<entry>/B<b>_L<l>
//                                kiln's fused attention (bench/gpu_attention.kir: 8 heads
//                                of 64, self, causal and cross) at W1's, W2's and W4's
//                                lengths, once per tile size of the experiment
//                                (bench_attention_cuda_<variant>, KILN_GPU_ATTENTION);
//                                PyTorch: scaled_dot_product_attention in FP32.
// Each call runs one entry point of one library through kiln_model_run_device: inputs and
// outputs are device tensors allocated once (no host copy), so the time is the kernel's plus
// the runtime's per-call work. An iteration is 10 calls and a device sync; the counters are
// per call (s_per_call) and GFLOP/s (2·M·N·K; attention 4·B·H·Lq·Lk·64, causal counted in
// full). One untimed warm-up of 3 calls per benchmark (the driver's JIT of the PTX for the
// GPU, first touch).
// Without a CUDA driver or device every benchmark is skipped with the runtime's message.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device_tensor.h"
#include "gpu_gemm_variants.h"  // generated: KILN_GEMM_VARIANTS, KILN_ATTENTION_VARIANTS
#include "runtime/safetensors.h"

namespace kiln_bench {
namespace {

constexpr int kCallsPerIteration = 10;

using CreateFn = kiln_model* (*)(const char*, char**);

// bench/gemm_shapes.kir's entry points: K, N.
struct GemmShape {
  const char* entry;
  int64_t K, N;
};
const GemmShape kGemmShapes[] = {{"k512_n1536", 512, 1536}, {"k512_n512", 512, 512},
                                 {"k512_n1024", 512, 1024}, {"k512_n2048_relu", 512, 2048},
                                 {"k2048_n512", 2048, 512}, {"k512_n32000", 512, 32000}};
const int64_t kGemmRows[] = {32, 128, 256, 1024, 2048};

// Random weights for gemm_shapes.kir (w_<entry> [N, K], b_<entry> [N]), written once.
const std::string& gemm_weights() {
  static const std::string path = [] {
    std::vector<kiln::rt::TensorData> tensors;
    std::mt19937 rng(30);
    std::uniform_real_distribution<float> u(-0.05f, 0.05f);
    for (const GemmShape& s : kGemmShapes) {
      std::vector<float> w(static_cast<size_t>(s.N * s.K)), b(static_cast<size_t>(s.N));
      for (float& v : w) v = u(rng);
      for (float& v : b) v = u(rng);
      tensors.push_back(kiln::rt::make_f32(std::string("w_") + s.entry, {s.N, s.K}, w));
      tensors.push_back(kiln::rt::make_f32(std::string("b_") + s.entry, {s.N}, b));
    }
    const char* dir = std::getenv("TMPDIR");
    std::string p = std::string(dir && *dir ? dir : "/tmp") + "/kiln_gpu_gemm_weights.safetensors";
    kiln::rt::write_safetensors(p, tensors);
    return p;
  }();
  return path;
}

// One model per library, created on first use (its error kept for the benchmarks to report).
struct Library {
  kiln_model* model = nullptr;
  std::string error;
};
Library& library(const std::string& name, CreateFn create, const char* weights) {
  static std::map<std::string, Library> libraries;
  auto [it, fresh] = libraries.try_emplace(name);
  if (fresh) {
    char* error = nullptr;
    it->second.model = create(weights, &error);
    if (!it->second.model) it->second.error = error ? error : "model creation failed";
    kiln_free_error(error);
  }
  return it->second;
}

// Times `function` of `lib` on `inputs` into outputs of the shapes the model gives.
void run_bench(benchmark::State& state, Library& lib, const char* function,
               const std::vector<std::vector<int64_t>>& input_shapes, double flops) {
  if (!lib.model) {
    state.SkipWithError(lib.error.c_str());
    return;
  }
  kiln_model* m = lib.model;
  DeviceCall call(m, function);
  std::mt19937 rng(30);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const std::vector<int64_t>& shape : input_shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    for (float& v : values) v = u(rng);
    if (std::string e = call.add_input(KILN_F32, shape, values.data()); !e.empty()) {
      state.SkipWithError(e.c_str());
      return;
    }
  }
  if (std::string e = call.prepare_output(); !e.empty()) {
    state.SkipWithError(e.c_str());
    return;
  }
  for (int i = 0; i < 3; ++i)
    if (call.run() != 0) {
      state.SkipWithError(kiln_model_error(m));
      return;
    }
  call.sync();
  for (auto _ : state) {
    for (int i = 0; i < kCallsPerIteration; ++i)
      if (call.run() != 0) {
        state.SkipWithError(kiln_model_error(m));
        return;
      }
    if (call.sync() != 0) {
      state.SkipWithError("device sync failed");
      return;
    }
  }
  state.counters["s_per_call"] =
      benchmark::Counter(kCallsPerIteration, benchmark::Counter::kIsIterationInvariantRate |
                                                 benchmark::Counter::kInvert);
  state.counters["GFLOP/s"] = benchmark::Counter(kCallsPerIteration * flops / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

struct Variant {
  const char* name;
  const char* schedule;  // KILN_GPU_LINEAR's value ("" for the default)
  CreateFn create;
};
const Variant kVariants[] = {
#define X(name, schedule) {#name, schedule, bench_gemm_cuda_##name##_create},
    KILN_GEMM_VARIANTS
#undef X
};
const Variant kAttentionVariants[] = {
#define X(name, schedule) {#name, schedule, bench_attention_cuda_##name##_create},
    KILN_ATTENTION_VARIANTS
#undef X
};

// Attention cases: entry, B, Lq, Lk.
struct AttentionCase {
  const char* entry;
  int64_t B, Lq, Lk;
};
const AttentionCase kAttention[] = {
    {"self", 1, 32, 32},     {"causal", 1, 32, 32},    {"cross", 1, 32, 32},     // W1
    {"self", 16, 128, 128},  {"causal", 16, 128, 128}, {"cross", 16, 128, 128},  // W2
    {"self", 1, 1024, 1024},                                                     // W4
};

const bool registered = [] {
  for (const Variant& v : kVariants)
    for (const GemmShape& s : kGemmShapes)
      for (int64_t M : kGemmRows) {
        const std::string name =
            std::string("gemm/") + v.name + "/" + s.entry + "/M" + std::to_string(M);
        benchmark::RegisterBenchmark(
            name.c_str(),
            [&v, &s, M](benchmark::State& state) {
              Library& lib = library(v.name, v.create, gemm_weights().c_str());
              run_bench(state, lib, s.entry, {{M, s.K}}, 2.0 * static_cast<double>(M * s.N * s.K));
            })
            ->UseRealTime()
            ->MinTime(0.2)
            ->Unit(benchmark::kMicrosecond);
      }
  for (const Variant& v : kAttentionVariants)
    for (const AttentionCase& a : kAttention) {
      const std::string name = std::string("attention/") + v.name + "/" + a.entry + "/B" +
                               std::to_string(a.B) + "_L" + std::to_string(a.Lq);
      benchmark::RegisterBenchmark(
          name.c_str(),
          [&v, &a](benchmark::State& state) {
            Library& lib = library(std::string("attention_") + v.name, v.create, nullptr);
            const double flops = 4.0 * static_cast<double>(a.B * 8 * a.Lq * a.Lk * 64);
            run_bench(state, lib, a.entry, {{a.B, a.Lq, 512}, {a.B, a.Lk, 512}, {a.B, a.Lk, 512}},
                      flops);
          })
          ->UseRealTime()
          ->MinTime(0.2)
          ->Unit(benchmark::kMicrosecond);
    }
  return true;
}();

}  // namespace
}  // namespace kiln_bench
