// The per-row work of generation's search over a vocabulary of logits: the log-sum-exp
// (log_softmax(v) = logits[v] - lse) and the few best tokens. At beam 4 and batch 32 this is
// 128 rows of 32000 logits per step, so both have an AVX-512 path (chosen at run time from
// CPUID) beside the portable one; the two return the same tokens, and log-sum-exps within a
// few float ulps of each other.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::rt {

// What log_sum_exp's first pass over a row finds besides its maximum (the bits of `flags`):
// some logit is NaN or +inf; some logit is above -inf. The search refuses a row with the first
// or without the second, which it would otherwise search with a meaningless log-sum-exp.
inline constexpr uint8_t kLogitNanOrPlusInf = 1, kLogitAboveMinusInf = 2;
inline uint8_t logit_flags(bool nan_or_plus_inf, bool above_minus_inf) {
  return (nan_or_plus_inf ? kLogitNanOrPlusInf : 0) | (above_minus_inf ? kLogitAboveMinusInf : 0);
}

// log(sum_v exp(logits[v])) over a row of V >= 1 finite logits (f32 exps summed in double:
// error about 2e-7 relative to the sum). `flags` (may be null) gets the row's flags above, found
// in the same pass as the maximum: one read of the row instead of a pass of its own.
double log_sum_exp(const float* logits, int64_t V, uint8_t* flags = nullptr);

// The `keep` best tokens of a row into `out`: highest logit first, the lower id first on
// ties, `banned` (e.g. the end token before min_decoding_length; -1: none) left out.
void best_tokens(const float* logits, int64_t V, int64_t keep, int64_t banned,
                 std::vector<int64_t>& out);

// The portable versions (what the dispatching ones run without AVX-512), for tests.
double log_sum_exp_portable(const float* logits, int64_t V, uint8_t* flags = nullptr);
void best_tokens_portable(const float* logits, int64_t V, int64_t keep, int64_t banned,
                          std::vector<int64_t>& out);
// Whether the dispatching versions take the AVX-512 path on this CPU.
bool search_kernels_use_avx512();

}  // namespace kiln::rt
