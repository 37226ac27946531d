// W6 (issue 26): a LLaMA-style decoder — examples/models/llama.cpp at d 768, 12 heads / 4 KV
// heads, SwiGLU 2048, 12 layers, vocab 32000, RoPE (kiln_add_model(bench_llama ... SET ...) in
// bench/CMakeLists.txt) — generating through nn::add_causal_lm's prefill and decode_step, with
// KILN_BENCH_THREADS (default 2) threads, and the memory read bandwidth (bench/bandwidth.cpp)
// in the same process. bench/llama_peer.py writes the checkpoint and times PyTorch with a KV
// cache on the same shapes; bench/run_w6.sh runs both and prints the table.
//
//   KILN_BENCH_LLAMA_WEIGHTS=/tmp/kiln-bench/llama_w6.safetensors llama_bench
//
// Rows, at batch 1 and 16, a 128-token prompt (random ids, fixed seed):
//   W6/prefill_b{B}_p128          prefill alone: counter ms per call
//   W6/generate_b{B}_p128_n64     kiln_generate greedy, 64 new tokens (min_decoding_length 64:
//                                 never ends early): the prefill and 63 decode steps
// The decode rate is (generate - prefill) / 63 per step; bench/run_w6.sh computes tokens/s and
// the bandwidth floor: the weight bytes one step reads (every layer's weights, the final norm
// and the 32000 × 768 head, one embedding row per token) over the measured bandwidth.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_llama.h"
#include "peak.h"
#ifdef KILN_BENCH_BF16
#include "bench_llama_bf16.h"
#endif

namespace kiln_bench {
namespace {

constexpr int64_t kVocab = 32000, kPrompt = 128, kNew = 64, kLayers = 12, kKvWidth = 4 * 64;

template <typename M>
M& model() {
  static std::unique_ptr<M> m = [] {
    const char* w = std::getenv("KILN_BENCH_LLAMA_WEIGHTS");
    if (!w)
      throw std::runtime_error("set KILN_BENCH_LLAMA_WEIGHTS (bench/llama_peer.py writes it)");
    auto made = std::make_unique<M>(w);
    made->set_num_threads(bench_threads());
    return made;
  }();
  return *m;
}

kiln::Tensor<int64_t> prompts(int64_t batch) {
  std::mt19937_64 rng(6);
  std::uniform_int_distribution<int64_t> id(3, kVocab - 1);
  kiln::Tensor<int64_t> t{{batch, kPrompt}, {}};
  for (int64_t i = 0; i < batch * kPrompt; ++i) t.data.push_back(id(rng));
  return t;
}

template <typename M>
void BM_prefill(benchmark::State& state) {
  const int64_t batch = state.range(0);
  M& m = model<M>();
  const kiln::Tensor<int64_t> ids = prompts(batch);
  kiln::Tensor<int64_t> start{{batch}, std::vector<int64_t>(static_cast<size_t>(batch), 0)};
  std::vector<kiln::Tensor<float>> caches(2 * kLayers);
  for (auto& c : caches) {
    c.shape = {kPrompt + kNew, batch, kKvWidth};
    c.data.assign(static_cast<size_t>(c.numel()), 0.0f);
  }
  kiln::Tensor<float> logits;
  std::vector<kiln::Input> in = {ids, start};
  std::vector<kiln::Output> out = {logits};
  for (auto& c : caches) {
    in.push_back(c);
    out.push_back(c);
  }
  for (auto _ : state) m.run("prefill", in, out);
  state.counters["ms"] = benchmark::Counter(
      1e3, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

template <typename M>
void BM_generate(benchmark::State& state) {
  const int64_t batch = state.range(0);
  M& m = model<M>();
  const kiln::Tensor<int64_t> ids = prompts(batch);
  kiln::SearchOptions o;
  o.max_decoding_length = kNew;
  o.min_decoding_length = kNew;
  for (const auto& h : m.generate(ids, o))  // warm-up, and the check that nothing ends early
    if (h.at(0).ids.size() != static_cast<size_t>(kNew))
      state.SkipWithError("a prompt ended before 64 tokens");
  for (auto _ : state) benchmark::DoNotOptimize(m.generate(ids, o));
  state.counters["ms"] = benchmark::Counter(
      1e3, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

BENCHMARK(BM_prefill<kiln_models::bench_llama>)
    ->Name("W6/prefill_p128")
    ->Arg(1)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_generate<kiln_models::bench_llama>)
    ->Name("W6/generate_p128_n64")
    ->Arg(1)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
#ifdef KILN_BENCH_BF16
BENCHMARK(BM_prefill<kiln_models::bench_llama_bf16>)
    ->Name("bf16/W6/prefill_p128")
    ->Arg(1)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_generate<kiln_models::bench_llama_bf16>)
    ->Name("bf16/W6/generate_p128_n64")
    ->Arg(1)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
#endif

}  // namespace
}  // namespace kiln_bench

BENCHMARK_MAIN();
