// Generation over a compiled model (see kiln/runtime.h, kiln_generate): the runtime's
// search code, in C++ for the C entry point in c_api.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/runtime.h"

namespace kiln::rt {

struct Generation {
  int64_t batch = 0, hypotheses = 0, max_length = 0;
  std::vector<int64_t> ids;      // [batch, hypotheses, max_length], -1 padded
  std::vector<int64_t> lengths;  // [batch, hypotheses]
  std::vector<float> scores;     // [batch, hypotheses]
};

// Throws kiln::Error naming the problem with the options or the input.
Generation generate(kiln_model* model, const kiln_tensor& src, const kiln_search_options& options);

}  // namespace kiln::rt
