// Checking a safetensors checkpoint against the weights a model expects: every
// missing, unexpected or mis-shaped tensor is reported by name, all at once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/safetensors.h"

namespace kiln::rt {

struct WeightSpec {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  bool or_bf16 = false;  // bf16 accepted too (for an f32 weight: converted when loaded)
};

// Returns one line per problem (empty when the file matches `expected` exactly):
//   missing tensor 'generator.bias' (expected F32 [41])
//   tensor 'generator.weight' has shape [7,24], expected [41,24]
//   tensor 'generator.weight' has dtype F64, expected F32
//   unexpected tensor 'extra.weight' F32 [3]
std::vector<std::string> check_weights(const SafeTensors& file,
                                       const std::vector<WeightSpec>& expected);

// check_weights, throwing kiln::Error with every problem (one per line) when there are any.
void check_weights_or_throw(const SafeTensors& file, const std::vector<WeightSpec>& expected);

std::string shape_string(const std::vector<int64_t>& shape);  // "[41,24]"

}  // namespace kiln::rt
