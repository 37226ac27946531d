// Compiled golden models against PyTorch's outputs (tests/golden): forward and encode on a
// golden batch, and greedy and beam search against the reference search. Shared by the CPU
// build's tests (compiled_model_test.cpp, decode_test.cpp) and the GPU build's
// (gpu_models_test.cpp), so both are held to the same checks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/runtime.h"
#include "runtime/safetensors.h"

namespace kiln::testing {

// Kernels accumulate in f32 in another order than PyTorch; the golden f32-vs-f64 noise
// is ~2e-6, so 1e-4 is the bound with a wide margin.
constexpr double kGoldenTolerance = 1e-4;
// Scores of the reference search (float64 there, f32 logits here).
constexpr double kScoreTolerance = 1e-4;

inline std::string golden_file(const std::string& f) {
  return std::string(KILN_TEST_DATA_DIR) + "/golden/" + f;
}

// The largest absolute difference; the shapes must be equal.
inline double max_abs_diff(const kiln::Tensor<float>& got, const kiln::Tensor<float>& want) {
  EXPECT_EQ(got.shape, want.shape);
  if (got.data.size() != want.data.size()) return INFINITY;
  double err = 0;
  for (size_t i = 0; i < got.data.size(); ++i)
    err = std::max(err, std::abs(static_cast<double>(got.data[i]) - want.data[i]));
  return err;
}

// forward and encode of `model` on tests/golden/<batch>.inputs.safetensors against
// <batch>.expected.safetensors, within kGoldenTolerance; prints the errors after `label`.
template <typename Model>
void expect_golden(Model& model, const std::string& batch, const char* label) {
  const std::string inputs = golden_file(batch + ".inputs.safetensors");
  const std::string expected = golden_file(batch + ".expected.safetensors");
  auto src = kiln::read_tensor<int64_t>(inputs, "src");
  auto tgt = kiln::read_tensor<int64_t>(inputs, "tgt");
  const double e_fwd =
      max_abs_diff(model.forward(src, tgt), kiln::read_tensor<float>(expected, "logits"));
  const double e_enc =
      max_abs_diff(model.encode(src), kiln::read_tensor<float>(expected, "memory"));
  EXPECT_LE(e_fwd, kGoldenTolerance) << batch;
  EXPECT_LE(e_enc, kGoldenTolerance) << batch;
  std::printf("[ %s ] %s: forward max abs error %.3g, encode max abs error %.3g\n", label,
              batch.c_str(), e_fwd, e_enc);
}

// Greedy and beam search of `model`: the ids and scores of the PyTorch reference search of
// tests/golden/<name>_decode.safetensors (make_decode_golden.py), all four of its cases.
inline void expect_reference_search(kiln::Model& model, const std::string& name) {
  rt::SafeTensors file = rt::SafeTensors::load(golden_file(name + "_decode.safetensors"));
  const auto& meta = file.metadata();
  auto src_info = file.at("src");
  kiln::Tensor<int64_t> src{src_info.shape, file.to_i64(src_info)};
  std::stringstream cases(meta.at("cases"));
  std::string c;
  int checked = 0;
  while (std::getline(cases, c, ',')) {
    kiln::SearchOptions o;
    o.beam_size = std::stoi(meta.at(c + ".beam_size"));
    o.num_hypotheses = std::stoi(meta.at(c + ".num_hypotheses"));
    o.max_decoding_length = std::stoi(meta.at(c + ".max_decoding_length"));
    o.min_decoding_length = std::stoi(meta.at(c + ".min_decoding_length"));
    o.length_penalty = std::stof(meta.at(c + ".length_penalty"));
    o.start_id = std::stoll(meta.at("start_id"));
    o.end_id = std::stoll(meta.at("end_id"));
    const std::vector<int64_t> want_ids = file.to_i64(file.at(c + ".ids"));
    const std::vector<int64_t> want_len = file.to_i64(file.at(c + ".lengths"));
    const std::vector<float> want_scores = file.to_f32(file.at(c + ".scores"));
    const auto got = model.generate(src, o);
    ASSERT_EQ(static_cast<int64_t>(got.size()), src.shape[0]) << c;
    const int64_t H = o.num_hypotheses, L = o.max_decoding_length;
    for (int64_t b = 0; b < src.shape[0]; ++b) {
      ASSERT_EQ(static_cast<int64_t>(got[b].size()), H) << c;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t at = b * H + h;
        std::vector<int64_t> want(want_ids.begin() + at * L,
                                  want_ids.begin() + at * L + want_len[at]);
        EXPECT_EQ(got[b][h].ids, want) << name << " " << c << " sentence " << b << " hyp " << h;
        EXPECT_NEAR(got[b][h].score, want_scores[at], kScoreTolerance)
            << name << " " << c << " sentence " << b << " hyp " << h;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 4) << "cases in " << name << "_decode.safetensors";
}

}  // namespace kiln::testing
