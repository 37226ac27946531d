// The `peak` benchmark: the machine's FP32 FMA peak with the benchmark thread count
// (KILN_BENCH_THREADS, default 2), AVX-512 when the CPU has it, else AVX2. Each thread
// runs kPeakAccumulators independent FMA chains in registers; the counter GFLOP/s is all
// threads' FLOPs over wall-clock time. Linked into peak_bench and model_bench, so the
// model's GFLOP/s can be read against the peak measured in the same process.
#include <benchmark/benchmark.h>

#include <string>
#include <thread>
#include <vector>

#include "peak.h"

namespace kiln_bench {
namespace {

// Rounds per thread per benchmark iteration: ~10 GFLOP per thread with AVX-512.
constexpr int64_t kRounds = 20'000'000;

void BM_peak(benchmark::State& state) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!avx512 && !avx2) {
    state.SkipWithError("the CPU has neither AVX-512F nor AVX2+FMA");
    return;
  }
  const int threads = bench_threads();
  const double flops_per_round = avx512 ? kFlopsPerRoundAvx512 : kFlopsPerRoundAvx2;
  std::vector<float> sink(static_cast<size_t>(threads));
  for (auto _ : state) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back(
          [&, t] { sink[t] = avx512 ? fma_loop_avx512(kRounds) : fma_loop_avx2(kRounds); });
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(sink.data());
  }
  const double gflop = flops_per_round * static_cast<double>(kRounds) * threads / 1e9;
  state.counters["GFLOP/s"] =
      benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
  state.SetLabel(std::string(avx512 ? "avx512 zmm" : "avx2 ymm") + ", " + std::to_string(threads) +
                 " threads, " + std::to_string(kPeakAccumulators) + " accumulators");
}
BENCHMARK(BM_peak)->Name("peak")->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);

}  // namespace
}  // namespace kiln_bench
