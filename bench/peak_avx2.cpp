// FP32 FMA peak, 8-lane ymm vectors (the fallback where the CPU lacks AVX-512).
// The only file compiled with -mavx2 -mfma.
#include <immintrin.h>

#include "peak.h"

namespace kiln_bench {

static_assert(kPeakAccumulators == 16, "the loop below spells out 16 accumulators");

float fma_loop_avx2(int64_t iters) {
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  __m256 c0 = _mm256_set1_ps(0.10f), c1 = _mm256_set1_ps(0.11f), c2 = _mm256_set1_ps(0.12f),
         c3 = _mm256_set1_ps(0.13f), c4 = _mm256_set1_ps(0.14f), c5 = _mm256_set1_ps(0.15f),
         c6 = _mm256_set1_ps(0.16f), c7 = _mm256_set1_ps(0.17f), c8 = _mm256_set1_ps(0.18f),
         c9 = _mm256_set1_ps(0.19f), c10 = _mm256_set1_ps(0.20f), c11 = _mm256_set1_ps(0.21f),
         c12 = _mm256_set1_ps(0.22f), c13 = _mm256_set1_ps(0.23f), c14 = _mm256_set1_ps(0.24f),
         c15 = _mm256_set1_ps(0.25f);
  for (int64_t i = 0; i < iters; ++i) {
    c0 = _mm256_fmadd_ps(c0, a, b);
    c1 = _mm256_fmadd_ps(c1, a, b);
    c2 = _mm256_fmadd_ps(c2, a, b);
    c3 = _mm256_fmadd_ps(c3, a, b);
    c4 = _mm256_fmadd_ps(c4, a, b);
    c5 = _mm256_fmadd_ps(c5, a, b);
    c6 = _mm256_fmadd_ps(c6, a, b);
    c7 = _mm256_fmadd_ps(c7, a, b);
    c8 = _mm256_fmadd_ps(c8, a, b);
    c9 = _mm256_fmadd_ps(c9, a, b);
    c10 = _mm256_fmadd_ps(c10, a, b);
    c11 = _mm256_fmadd_ps(c11, a, b);
    c12 = _mm256_fmadd_ps(c12, a, b);
    c13 = _mm256_fmadd_ps(c13, a, b);
    c14 = _mm256_fmadd_ps(c14, a, b);
    c15 = _mm256_fmadd_ps(c15, a, b);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                           _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
  s = _mm256_add_ps(s,
                    _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)),
                                  _mm256_add_ps(_mm256_add_ps(c12, c13), _mm256_add_ps(c14, c15))));
  alignas(32) float v[8];
  _mm256_store_ps(v, s);
  return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

}  // namespace kiln_bench
