// The machine's FP32 FMA peak (bench/peak*.cpp): chains of independent vector FMAs that
// never touch memory, so the FMA ports are the only limit.
#ifndef KILN_BENCH_PEAK_H_
#define KILN_BENCH_PEAK_H_

#include <cstdint>
#include <cstdlib>

namespace kiln_bench {

// `iters` rounds of kPeakAccumulators independent FMAs on 16 (AVX-512) or 8 (AVX2) floats.
// Each returns a value that depends on every FMA (so none is optimized away).
float fma_loop_avx512(int64_t iters);
float fma_loop_avx2(int64_t iters);

constexpr int kPeakAccumulators = 16;

// Floating-point operations one round performs: accumulators x lanes x 2 (mul + add).
constexpr double kFlopsPerRoundAvx512 = kPeakAccumulators * 16 * 2.0;
constexpr double kFlopsPerRoundAvx2 = kPeakAccumulators * 8 * 2.0;

// Threads every benchmark here uses: KILN_BENCH_THREADS, default 2 (the setting).
inline int bench_threads() {
  const char* s = std::getenv("KILN_BENCH_THREADS");
  int n = s ? std::atoi(s) : 2;
  return n > 0 ? n : 2;
}

}  // namespace kiln_bench

#endif  // KILN_BENCH_PEAK_H_
