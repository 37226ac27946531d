// FP32 FMA peak, 16-lane zmm vectors. The only file compiled with -mavx512f -mfma.
#include <immintrin.h>

#include "peak.h"

namespace kiln_bench {

static_assert(kPeakAccumulators == 16, "the loop below spells out 16 accumulators");

float fma_loop_avx512(int64_t iters) {
  // acc = acc * a + b converges to b / (1 - a) = 1: no overflow, no denormals.
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  __m512 c0 = _mm512_set1_ps(0.10f), c1 = _mm512_set1_ps(0.11f), c2 = _mm512_set1_ps(0.12f),
         c3 = _mm512_set1_ps(0.13f), c4 = _mm512_set1_ps(0.14f), c5 = _mm512_set1_ps(0.15f),
         c6 = _mm512_set1_ps(0.16f), c7 = _mm512_set1_ps(0.17f), c8 = _mm512_set1_ps(0.18f),
         c9 = _mm512_set1_ps(0.19f), c10 = _mm512_set1_ps(0.20f), c11 = _mm512_set1_ps(0.21f),
         c12 = _mm512_set1_ps(0.22f), c13 = _mm512_set1_ps(0.23f), c14 = _mm512_set1_ps(0.24f),
         c15 = _mm512_set1_ps(0.25f);
  for (int64_t i = 0; i < iters; ++i) {
    c0 = _mm512_fmadd_ps(c0, a, b);
    c1 = _mm512_fmadd_ps(c1, a, b);
    c2 = _mm512_fmadd_ps(c2, a, b);
    c3 = _mm512_fmadd_ps(c3, a, b);
    c4 = _mm512_fmadd_ps(c4, a, b);
    c5 = _mm512_fmadd_ps(c5, a, b);
    c6 = _mm512_fmadd_ps(c6, a, b);
    c7 = _mm512_fmadd_ps(c7, a, b);
    c8 = _mm512_fmadd_ps(c8, a, b);
    c9 = _mm512_fmadd_ps(c9, a, b);
    c10 = _mm512_fmadd_ps(c10, a, b);
    c11 = _mm512_fmadd_ps(c11, a, b);
    c12 = _mm512_fmadd_ps(c12, a, b);
    c13 = _mm512_fmadd_ps(c13, a, b);
    c14 = _mm512_fmadd_ps(c14, a, b);
    c15 = _mm512_fmadd_ps(c15, a, b);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                           _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
  s = _mm512_add_ps(s,
                    _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)),
                                  _mm512_add_ps(_mm512_add_ps(c12, c13), _mm512_add_ps(c14, c15))));
  return _mm512_reduce_add_ps(s);
}

}  // namespace kiln_bench
