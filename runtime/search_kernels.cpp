#include "runtime/search_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KILN_SEARCH_AVX512 1
#include <immintrin.h>
#endif

namespace kiln::rt {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// exp(x) for x <= 0 in f32 without a library call: 2^(x·log2 e) split into an integer power
// (built in the exponent bits) and a degree-6 polynomial for the fraction (relative error
// about 2e-7); 0 below -87.
inline float exp_nonpositive(float x) {
  const float t = std::max(x, -87.0f) * 1.44269504088896341f;
  const float fl = static_cast<float>(static_cast<int32_t>(t - 1.0f) + 1);  // floor for t <= 0
  const float n = fl > t ? fl - 1.0f : fl;
  const float f = (t - n) * 0.69314718055994531f;  // in [0, ln 2)
  float p = 1.0f / 720;
  p = p * f + 1.0f / 120;
  p = p * f + 1.0f / 24;
  p = p * f + 1.0f / 6;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Offers token v to `out`, the sorted best-so-far list of at most `keep` tokens.
inline void offer(const float* logits, int64_t v, int64_t keep, std::vector<int64_t>& out) {
  const float x = logits[v];
  const bool full = static_cast<int64_t>(out.size()) == keep;
  if (full && !(x > logits[out.back()])) return;
  if (full) out.pop_back();
  size_t at = out.size();
  while (at > 0 && x > logits[out[at - 1]]) --at;
  out.insert(out.begin() + static_cast<int64_t>(at), v);
}

#ifdef KILN_SEARCH_AVX512

// exp(x) for x <= 0, 16 lanes: 2^n · p(f) with n = round(x·log2 e), f = x·log2 e - n in
// [-1/2, 1/2] and p a degree-6 Taylor polynomial of 2^f (relative error about 1.2e-7);
// scalef builds 2^n, 0 far below.
__attribute__((target("avx512f"))) inline __m512 exp_nonpositive16(__m512 x) {
  const __m512 t =
      _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.69314718055994531f));
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// exp(x - max) of the 16 logits at `at`.
__attribute__((target("avx512f"))) inline __m512 exp_shifted16(const float* at, __m512 max) {
  return exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(at), max));
}

// Adds the 16 lanes of e, widened to double, to the 8 + 8 lanes of s0 and s1.
__attribute__((target("avx512f"))) inline void add_to_double16(__m512 e, __m512d& s0, __m512d& s1) {
  s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
  s1 = _mm512_add_pd(
      s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
}

__attribute__((target("avx512f"))) double log_sum_exp_avx512(const float* logits, int64_t V,
                                                             uint8_t* flags) {
  __m512 m0 = _mm512_set1_ps(-kInf), m1 = m0;
  const __m512 inf = _mm512_set1_ps(kInf), minus_inf = _mm512_set1_ps(-kInf);
  __mmask16 bad = 0, above = 0;  // lanes that saw NaN or +inf; lanes that saw more than -inf
  int64_t v = 0;
  for (; v + 32 <= V; v += 32) {
    const __m512 x0 = _mm512_loadu_ps(logits + v), x1 = _mm512_loadu_ps(logits + v + 16);
    m0 = _mm512_max_ps(m0, x0);
    m1 = _mm512_max_ps(m1, x1);
    bad |= _mm512_cmp_ps_mask(x0, inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(x1, inf, _CMP_NLT_UQ);
    above |= _mm512_cmp_ps_mask(x0, minus_inf, _CMP_GT_OQ) |
             _mm512_cmp_ps_mask(x1, minus_inf, _CMP_GT_OQ);
  }
  float mx = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
  bool any_bad = bad != 0, any_above = above != 0;
  for (; v < V; ++v) {
    mx = std::max(mx, logits[v]);
    any_bad |= !(logits[v] < kInf);
    any_above |= logits[v] > -kInf;
  }
  if (flags) *flags = logit_flags(any_bad, any_above);
  // The exps summed in double lanes: a float sum of 32000 terms drifts by 1e-4 relative. Each
  // block of 128 is summed in float first (two chains of 4 exps a lane, each term at most 1:
  // 3 roundings of at most 2^-24 of the block's sum), then added in double: W5's 128 rows
  // of 32000 on one thread took 775–796 µs against 1020–1095 with every vector converted and
  // added in double (a microbenchmark on AMD Zen 5; the lse 8.7e-8 apart at most).
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512d s0 = _mm512_setzero_pd(), s1 = s0;
  v = 0;
  for (; v + 128 <= V; v += 128) {
    __m512 a0 = exp_shifted16(logits + v, vmx), a1 = exp_shifted16(logits + v + 16, vmx);
    for (int64_t c = 32; c < 128; c += 32) {
      a0 = _mm512_add_ps(a0, exp_shifted16(logits + v + c, vmx));
      a1 = _mm512_add_ps(a1, exp_shifted16(logits + v + c + 16, vmx));
    }
    add_to_double16(_mm512_add_ps(a0, a1), s0, s1);
  }
  for (; v + 16 <= V; v += 16) add_to_double16(exp_shifted16(logits + v, vmx), s0, s1);
  double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  for (; v < V; ++v) sum += exp_nonpositive(logits[v] - mx);
  return static_cast<double>(mx) + std::log(sum);
}

// The portable loop until `out` is full, then 16 lanes at a time: a block goes through
// `offer` only where a lane beats the current last of `out`, which after the first blocks
// is almost never. Lanes are offered in index order, so ties resolve as in the portable loop.
__attribute__((target("avx512f"))) void best_tokens_avx512(const float* logits, int64_t V,
                                                           int64_t keep, int64_t banned,
                                                           std::vector<int64_t>& out) {
  out.clear();
  int64_t v = 0;
  for (; v < V && static_cast<int64_t>(out.size()) < keep; ++v)
    if (v != banned) offer(logits, v, keep, out);
  for (; v + 16 <= V; v += 16) {
    const __m512 last = _mm512_set1_ps(logits[out.back()]);
    __mmask16 beats = _mm512_cmp_ps_mask(_mm512_loadu_ps(logits + v), last, _CMP_GT_OQ);
    while (beats) {
      const int64_t u = v + __builtin_ctz(beats);
      beats &= beats - 1;
      if (u != banned) offer(logits, u, keep, out);
    }
  }
  for (; v < V; ++v)
    if (v != banned) offer(logits, v, keep, out);
}

bool cpu_has_avx512f() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return has;
}

#endif

}  // namespace

double log_sum_exp_portable(const float* logits, int64_t V, uint8_t* flags) {
  float mx = -kInf;
  bool any_bad = false, any_above = false;
  for (int64_t v = 0; v < V; ++v) {
    mx = std::max(mx, logits[v]);
    any_bad |= !(logits[v] < kInf);  // NaN or +inf
    any_above |= logits[v] > -kInf;
  }
  if (flags) *flags = logit_flags(any_bad, any_above);
  double sum = 0;  // a float sum of 32000 terms drifts by 1e-4 relative
  for (int64_t v = 0; v < V; ++v) sum += exp_nonpositive(logits[v] - mx);
  return static_cast<double>(mx) + std::log(sum);
}

void best_tokens_portable(const float* logits, int64_t V, int64_t keep, int64_t banned,
                          std::vector<int64_t>& out) {
  out.clear();
  if (keep < 1) return;
  for (int64_t v = 0; v < V; ++v)
    if (v != banned) offer(logits, v, keep, out);
}

bool search_kernels_use_avx512() {
#ifdef KILN_SEARCH_AVX512
  return cpu_has_avx512f();
#else
  return false;
#endif
}

double log_sum_exp(const float* logits, int64_t V, uint8_t* flags) {
#ifdef KILN_SEARCH_AVX512
  if (cpu_has_avx512f()) return log_sum_exp_avx512(logits, V, flags);
#endif
  return log_sum_exp_portable(logits, V, flags);
}

void best_tokens(const float* logits, int64_t V, int64_t keep, int64_t banned,
                 std::vector<int64_t>& out) {
#ifdef KILN_SEARCH_AVX512
  if (keep >= 1 && cpu_has_avx512f()) return best_tokens_avx512(logits, V, keep, banned, out);
#endif
  best_tokens_portable(logits, V, keep, banned, out);
}

}  // namespace kiln::rt
