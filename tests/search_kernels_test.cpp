// The search's per-row kernels (runtime/search_kernels.h): the AVX-512 path picks exactly
// the tokens of the portable one, and both log-sum-exps match a double-precision one.
#include "runtime/search_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace kiln::rt {
namespace {

// A row of V logits: uniform noise, or (tied) a few levels so that ties are everywhere.
std::vector<float> make_row(std::mt19937& rng, int64_t V, bool tied) {
  std::vector<float> row(static_cast<size_t>(V));
  std::normal_distribution<float> noise(0.0f, 4.0f);
  std::uniform_int_distribution<int> level(0, 3);
  for (float& x : row) x = tied ? static_cast<float>(level(rng)) : noise(rng);
  return row;
}

// The K best by sorting every token: the definition best_tokens implements in one pass.
std::vector<int64_t> best_by_sorting(const std::vector<float>& row, int64_t keep, int64_t banned) {
  std::vector<int64_t> ids;
  for (int64_t v = 0; v < static_cast<int64_t>(row.size()); ++v)
    if (v != banned) ids.push_back(v);
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
  if (static_cast<int64_t>(ids.size()) > keep) ids.resize(static_cast<size_t>(keep));
  return ids;
}

double exact_lse(const std::vector<float>& row) {
  double mx = -std::numeric_limits<double>::infinity(), sum = 0;
  for (float x : row) mx = std::max(mx, static_cast<double>(x));
  for (float x : row) sum += std::exp(static_cast<double>(x) - mx);
  return mx + std::log(sum);
}

TEST(SearchKernels, BestTokensAreTheSortedBest) {
  std::mt19937 rng(7);
  int rows = 0;
  for (int64_t V : {1, 2, 5, 15, 16, 17, 31, 32, 33, 100, 1000, 32000}) {
    for (bool tied : {false, true}) {
      for (int64_t keep = 1; keep <= 5; ++keep) {
        std::vector<float> row = make_row(rng, V, tied);
        if (V > 40 && !tied) row[static_cast<size_t>(V - 1)] = 100.0f;  // the best at the end
        for (int64_t banned : {int64_t{-1}, int64_t{0}, V / 2, V - 1}) {
          const std::vector<int64_t> want = best_by_sorting(row, keep, banned);
          std::vector<int64_t> fast, portable;
          best_tokens(row.data(), V, keep, banned, fast);
          best_tokens_portable(row.data(), V, keep, banned, portable);
          EXPECT_EQ(fast, want) << "V " << V << " keep " << keep << " banned " << banned;
          EXPECT_EQ(portable, want) << "V " << V << " keep " << keep << " banned " << banned;
          ++rows;
        }
      }
    }
  }
  std::printf("%d rows checked; AVX-512 path %s\n", rows,
              search_kernels_use_avx512() ? "taken" : "not available on this CPU");
}

TEST(SearchKernels, LogSumExpMatchesDoublePrecision) {
  std::mt19937 rng(11);
  double worst = 0;
  for (int64_t V : {1, 3, 16, 17, 33, 511, 32000}) {
    for (bool tied : {false, true}) {
      std::vector<float> row = make_row(rng, V, tied);
      if (V > 2) row[1] = -80.0f;  // far below the max: exp underflows towards 0
      const double want = exact_lse(row);
      const double fast = log_sum_exp(row.data(), V);
      const double portable = log_sum_exp_portable(row.data(), V);
      // f32 exps (relative error 2e-7) summed in double; the max and lse are in f32 input units.
      const double tol = 1e-6 * (1 + std::abs(want));
      EXPECT_NEAR(fast, want, tol) << "V " << V;
      EXPECT_NEAR(portable, want, tol) << "V " << V;
      worst = std::max({worst, std::abs(fast - want), std::abs(portable - want)});
    }
  }
  std::printf("worst |lse - exact| %.3g\n", worst);
}

// log_sum_exp's flags, which the search's check of every row comes from: NaN or +inf anywhere
// (in the vector body or the scalar tail of a row), nothing above -inf; the same from the
// AVX-512 path and the portable one.
TEST(SearchKernels, LogSumExpFlagsNonFiniteRows) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(12);
  int checked = 0;
  for (int64_t V : {1, 17, 33, 32000}) {
    for (int64_t at : {int64_t{0}, V / 2, V - 1}) {
      for (float value : {std::nanf(""), inf, -inf, 1.0f}) {
        std::vector<float> row = make_row(rng, V, false);
        row[static_cast<size_t>(at)] = value;
        const bool bad = std::isnan(value) || value == inf;
        const uint8_t want =
            (bad ? kLogitNanOrPlusInf : 0) | (V > 1 || value > -inf ? kLogitAboveMinusInf : 0);
        uint8_t fast = 0xff, portable = 0xff;
        log_sum_exp(row.data(), V, &fast);
        log_sum_exp_portable(row.data(), V, &portable);
        EXPECT_EQ(fast, want) << "V " << V << " at " << at << " value " << value;
        EXPECT_EQ(portable, want) << "V " << V << " at " << at << " value " << value;
        ++checked;
      }
    }
    // Every logit -inf: nothing can be chosen.
    std::vector<float> none(static_cast<size_t>(V), -inf);
    uint8_t fast = 0xff, portable = 0xff;
    log_sum_exp(none.data(), V, &fast);
    log_sum_exp_portable(none.data(), V, &portable);
    EXPECT_EQ(fast, 0) << "V " << V;
    EXPECT_EQ(portable, 0) << "V " << V;
  }
  std::printf("%d rows with one NaN, +inf, -inf or finite value checked\n", checked);
}

}  // namespace
}  // namespace kiln::rt
