// Benchmarks of the fused attention kernel (codegen/attention_kernel.cpp) and of the
// single-query step attention of decoding (codegen/step_attention_kernel.cpp), JIT-compiled
// for the host, on the shapes of the `base` model (8 heads of 64) and of an earlier
// measurement of a fused Halide attention pipeline (below). q, k and v are slices of one merged QKV
// tensor [B, L, 3·512], as the compiled models pass them. Counters: dense-equivalent
// GFLOP/s (4·B·H·L²·64 flops, causal included, so causal runs show the gain from skipping
// blocks). Threads: Halide's pool (HL_NUM_THREADS).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <benchmark/benchmark.h>

#include "codegen/halide_kernels.h"

namespace kiln::codegen {
namespace {

constexpr int kHeads = 8, kHeadDim = 64, kModel = kHeads * kHeadDim;

// A kernel JIT-compiled for the host, called through Halide's argv entry point.
Halide::Target jit_target() { return host_target().with_feature(Halide::Target::JIT); }

class JitKernel {
 public:
  explicit JitKernel(const AttentionKernel& spec)
      : JitKernel(build_attention(spec, jit_target())) {}
  explicit JitKernel(const StepAttentionKernel& spec)
      : JitKernel(build_step_attention(spec, jit_target())) {}
  explicit JitKernel(KernelPipeline kp) {
    const Halide::Target t = jit_target();
    Halide::Module m = kp.pipeline.compile_to_module(kp.args, "attention_bench", t);
    module_ = Halide::Internal::JITModule(m, m.functions().back());
    fn_ = module_.argv_function();
  }
  int operator()(const std::vector<halide_buffer_t*>& buffers) const {
    std::vector<const void*> argv(buffers.begin(), buffers.end());
    return fn_(argv.data());
  }

 private:
  Halide::Internal::JITModule module_;
  Halide::Internal::JITModule::argv_wrapper fn_ = nullptr;
};

// One compiled kernel per (causal, key_padding), shared by all benchmarks.
const JitKernel& kernel_for(bool causal, bool key_padding) {
  static std::map<std::pair<bool, bool>, std::unique_ptr<JitKernel>> kernels;
  auto& k = kernels[{causal, key_padding}];
  if (!k)
    k = std::make_unique<JitKernel>(
        AttentionKernel{kHeads, kHeadDim, kHeadDim, causal, key_padding, 0.125});
  return *k;
}

// Args: batch, length, causal, key_padding.
void BM_Attention(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0)), len = static_cast<int>(state.range(1));
  const bool causal = state.range(2) != 0, padded = state.range(3) != 0;
  const JitKernel& kernel = kernel_for(causal, padded);

  std::vector<float> qkv(static_cast<size_t>(batch) * len * 3 * kModel);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>((i * 7919) % 1000) / 500 - 1;
  auto slice = [&](int part) {
    halide_dimension_t dims[3] = {
        {0, kModel, 1}, {0, len, 3 * kModel}, {0, batch, len * 3 * kModel}};
    return Halide::Buffer<float>(qkv.data() + part * kModel, 3, dims);
  };
  Halide::Buffer<float> q = slice(0), k = slice(1), v = slice(2), out(kModel, len, batch);
  Halide::Buffer<uint8_t> mask(len, batch);
  for (int b = 0; b < batch; ++b)  // the last eighth of each row's keys padded
    for (int j = 0; j < len; ++j) mask(j, b) = j >= len - len / 8;
  std::vector<halide_buffer_t*> args = {q.raw_buffer(), k.raw_buffer(), v.raw_buffer()};
  if (padded) args.push_back(mask.raw_buffer());
  args.push_back(out.raw_buffer());

  for (auto _ : state) {
    if (kernel(args) != 0) {
      state.SkipWithError("attention kernel failed");
      break;
    }
    benchmark::ClobberMemory();
  }
  const double flops = 4.0 * batch * kHeads * len * len * kHeadDim;
  state.counters["GFLOPS"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// The `base` model: encoder (padding), decoder self-attention (causal), and long sequences;
// B=8, L=128 is the reference point of a fused Halide 14 attention pipeline measured on these
// 2-core machines: 1.3 ms with 2 threads (≈210 GFLOP/s dense-equivalent), against 7.7 ms
// for oneDNN GEMMs plus a separate softmax.
BENCHMARK(BM_Attention)
    ->ArgNames({"B", "L", "causal", "pad"})
    ->Args({8, 128, 0, 0})
    ->Args({16, 128, 0, 1})
    ->Args({16, 128, 1, 0})
    ->Args({1, 1024, 0, 0})
    ->Args({1, 1024, 1, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The step attention of W5's decoding steps: N hypotheses (S sentences × beam 4, a
// sentence's beams consecutive) with one query each, against the encoder memory (`memory`:
// keys [S, L, 512], each hypothesis reading its sentence's L keys, none masked) or against the
// self-attention cache (keys [L, N, 512]: times × slots; hypothesis n's key of time j in slot
// rows(j, n), here the slot of the beam it descends from, 4 beams' slots shuffled). Args:
// sentences, keys, memory. Counter: GFLOP/s of the two products (4·N·H·L·64 flops).
void BM_StepAttention(benchmark::State& state) {
  const int sentences = static_cast<int>(state.range(0)), keys = static_cast<int>(state.range(1));
  const bool memory = state.range(2) != 0;
  const int n_hyp = sentences * 4;
  static std::map<bool, std::unique_ptr<JitKernel>> kernels;
  auto& kernel = kernels[memory];
  if (!kernel) {
    StepAttentionKernel spec;
    spec.heads = kHeads;
    spec.dk = spec.dv = kHeadDim;
    spec.memory = memory;
    spec.scale = 0.125;
    kernel = std::make_unique<JitKernel>(spec);
  }
  auto fill = [](Halide::Buffer<float>& b, int seed) {
    float* d = b.data();
    for (size_t i = 0; i < b.number_of_elements(); ++i)
      d[i] = static_cast<float>((i * 7919 + seed) % 1000) / 500 - 1;
  };
  Halide::Buffer<float> q(kModel, n_hyp), out(kModel, n_hyp);
  Halide::Buffer<float> k = memory ? Halide::Buffer<float>(kModel, keys, sentences)
                                   : Halide::Buffer<float>(kModel, n_hyp, keys);
  Halide::Buffer<float> v = memory ? Halide::Buffer<float>(kModel, keys, sentences)
                                   : Halide::Buffer<float>(kModel, n_hyp, keys);
  fill(q, 1);
  fill(k, 2);
  fill(v, 3);
  Halide::Buffer<int64_t> index =
      memory ? Halide::Buffer<int64_t>(n_hyp) : Halide::Buffer<int64_t>(keys, n_hyp);
  if (memory) {
    for (int n = 0; n < n_hyp; ++n) index(n) = n / 4;
  } else {
    for (int n = 0; n < n_hyp; ++n)
      for (int j = 0; j < keys; ++j) index(j, n) = n / 4 * 4 + (n + j) % 4;
  }
  Halide::Buffer<uint8_t> mask(keys, sentences);
  mask.fill(0);
  std::vector<halide_buffer_t*> args = {q.raw_buffer(), k.raw_buffer(), v.raw_buffer(),
                                        index.raw_buffer()};
  if (memory) args.push_back(mask.raw_buffer());
  args.push_back(out.raw_buffer());
  for (auto _ : state) {
    if ((*kernel)(args) != 0) {
      state.SkipWithError("step attention kernel failed");
      break;
    }
    benchmark::ClobberMemory();
  }
  const double flops = 4.0 * n_hyp * kHeads * keys * kHeadDim;
  state.counters["GFLOPS"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// W5: 32 sentences × beam 4; the memory of 32 source tokens, the cache at 16 and 32 times.
BENCHMARK(BM_StepAttention)
    ->ArgNames({"S", "L", "memory"})
    ->Args({32, 32, 1})
    ->Args({32, 16, 0})
    ->Args({32, 32, 0})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace kiln::codegen

BENCHMARK_MAIN();
