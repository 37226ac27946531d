// The golden data of the examples that generate (examples/models/golden, written by
// make_generate_golden.py), as causal_lm_test.cpp and seq2seq_test.cpp read it. KILN_EXAMPLE_GOLDEN
// is the golden directory.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ir/interpreter.h"
#include "runtime/safetensors.h"

namespace kiln::testing {

inline std::string golden(const std::string& file) {
  return std::string(KILN_EXAMPLE_GOLDEN) + "/" + file;
}

// Tensor `name` of golden file `file`: f32 or i64.
inline ir::Tensor read(const std::string& file, const std::string& name) {
  rt::SafeTensors st = rt::SafeTensors::load(golden(file));
  const rt::TensorInfo* t = st.find(name);
  if (!t) throw std::runtime_error("no tensor " + name + " in " + file);
  if (t->dtype == rt::DType::f32) return ir::Tensor::from_f32(t->shape, st.to_f32(*t));
  return ir::Tensor::from_ints(ir::DType::i64, t->shape, st.to_i64(*t));
}

inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

// Row `row` of a -1-padded id tensor (a golden search's hypotheses), the padding left out.
inline std::vector<int64_t> golden_row(const ir::Tensor& t, int64_t row) {
  const int64_t width = t.shape.back();
  std::vector<int64_t> out;
  for (int64_t j = 0; j < width; ++j)
    if (t.ints[row * width + j] >= 0) out.push_back(t.ints[row * width + j]);
  return out;
}

}  // namespace kiln::testing
