#include "runtime/bf16_products.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "runtime/cpu_features.h"
#include "support/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kiln::rt {

#if defined(__x86_64__)
namespace {

using Clock = std::chrono::steady_clock;

// 12 independent accumulators (more than either unit's latency × issue rate), each starting
// from its own value (equal chains would be merged into one by the compiler), `rounds` × 12
// instructions; the result is kept so that the loop is not removed.
#define KILN_TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx512f,avx512bf16"))) double time_dot(long rounds, float* sink) {
#define KILN_DECL(i) __m512 a##i = _mm512_set1_ps(static_cast<float>(i));
  KILN_TWELVE(KILN_DECL)
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3c003c00), y = x;  // bf16 pairs of 2^-7
  const auto start = Clock::now();
  for (long n = 0; n < rounds; ++n) {
#define KILN_DOT(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
    KILN_TWELVE(KILN_DOT)
    __asm__ volatile("" : "+v"(x));
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
#define KILN_SUM(i) +_mm512_reduce_add_ps(a##i)
  *sink += 0 KILN_TWELVE(KILN_SUM);
  return s;
}

__attribute__((target("avx512f"))) double time_fma(long rounds, float* sink) {
  KILN_TWELVE(KILN_DECL)
  __m512 x = _mm512_set1_ps(1.0f / 128), y = x;
  const auto start = Clock::now();
  for (long n = 0; n < rounds; ++n) {
#define KILN_FMA(i) a##i = _mm512_fmadd_ps(x, y, a##i);
    KILN_TWELVE(KILN_FMA)
    __asm__ volatile("" : "+v"(x));
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  *sink += 0 KILN_TWELVE(KILN_SUM);
  return s;
}
#undef KILN_DECL
#undef KILN_DOT
#undef KILN_FMA
#undef KILN_SUM
#undef KILN_TWELVE

}  // namespace

Bf16ProductRates measure_bf16_product_rates() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) return {};
  constexpr long kRounds = 20000;  // 240,000 instructions: about 0.1 ms at the slower rate
  float sink = 0;
  double dot = 1e30, fma = 1e30;
  // Fastest of 5 alternating runs each, after one of each to bring the units up to speed.
  time_dot(kRounds, &sink);
  time_fma(kRounds, &sink);
  for (int i = 0; i < 5; ++i) {
    dot = std::min(dot, time_dot(kRounds, &sink));
    fma = std::min(fma, time_fma(kRounds, &sink));
  }
  const double instructions = 12.0 * kRounds;
  // vdpbf16ps: 32 products (16 lanes × a pair); an FMA: 16.
  volatile float keep = sink;  // the sums are used: the accumulator chains stay
  (void)keep;
  return {32 * instructions / dot * 1e-9, 16 * instructions / fma * 1e-9};
}
#else
Bf16ProductRates measure_bf16_product_rates() { return {}; }
#endif

std::string bf16_products_for_this_cpu() {
  // KILN_CPU_LACKS=AVX512-BF16 (cpu_features.h) hides it here too.
  const bool has_bf16 = missing_cpu_features("x86-64-linux-avx512_bf16").empty();
  if (const char* env = std::getenv("KILN_BF16_PRODUCTS"); env && *env) {
    const std::string choice = env;
    if (choice != "dot" && choice != "fma")
      fail("KILN_BF16_PRODUCTS is '{}': use dot or fma (or leave it unset to measure the CPU)",
           choice);
    if (choice == "dot" && !has_bf16)
      fail(
          "KILN_BF16_PRODUCTS is 'dot', but this CPU has no AVX512-BF16 (use fma, or leave it "
          "unset)");
    return choice;
  }
  // Measured once per process, and only where no variable chooses.
  static const Bf16ProductRates rates =
      has_bf16 ? measure_bf16_product_rates() : Bf16ProductRates{};
  return choose_bf16_products(rates);
}

}  // namespace kiln::rt
