// The `bandwidth` benchmark: the machine's memory read bandwidth with the benchmark thread
// count (KILN_BENCH_THREADS, default 2). Each thread sums its share of a 512 MiB buffer (16×
// a 32 MiB L3; 2 MiB aligned with transparent huge pages advised, as kiln's runtime
// allocates its weights) with independent accumulators, so the loads stream from DRAM and
// nothing else limits them; the counter GB/s is the buffer's bytes over wall-clock time.
// generate_bench measures it next to W3, whose floor is the decoder's weight bytes over
// it (see generate_bench.cpp); peak_bench also runs it before each peer.
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "peak.h"

namespace kiln_bench {
namespace {

constexpr size_t kBufferBytes = size_t{512} << 20;
constexpr size_t kAlign = size_t{2} << 20;

// Sums n 64-bit words with 8 independent accumulators (vectorized by the compiler).
uint64_t sum_words(const uint64_t* p, size_t n) {
  uint64_t a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  uint64_t s = 0;
  for (uint64_t v : a) s += v;
  return s;
}

struct Buffer {
  uint64_t* data = nullptr;
  size_t words = 0;
  Buffer() {
    void* p = std::aligned_alloc(kAlign, kBufferBytes);
    if (!p) return;
    madvise(p, kBufferBytes, MADV_HUGEPAGE);
    std::memset(p, 1, kBufferBytes);  // touch every page before timing
    data = static_cast<uint64_t*>(p);
    words = kBufferBytes / sizeof(uint64_t);
  }
  ~Buffer() { std::free(data); }
};

void BM_bandwidth(benchmark::State& state) {
  Buffer buf;  // allocated per run, freed after: the process keeps no 512 MiB
  if (!buf.data) {
    state.SkipWithError("cannot allocate the 512 MiB buffer");
    return;
  }
  const int threads = bench_threads();
  std::vector<uint64_t> sink(static_cast<size_t>(threads));
  const size_t per = buf.words / static_cast<size_t>(threads);
  for (auto _ : state) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { sink[t] = sum_words(buf.data + per * t, per); });
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(sink.data());
  }
  const double bytes = static_cast<double>(per) * threads * sizeof(uint64_t);
  state.counters["GB/s"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
  state.SetLabel(std::to_string(threads) + " threads streaming a 512 MiB buffer");
}
BENCHMARK(BM_bandwidth)
    ->Name("bandwidth")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.3);

}  // namespace
}  // namespace kiln_bench
