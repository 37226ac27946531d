// A checkpoint as published (one safetensors file, or shards named by a
// model.safetensors.index.json) and checking it against the weights a model expects: every
// missing, unexpected or mis-shaped tensor is reported by name, all at once.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/safetensors.h"

namespace kiln::rt {

struct WeightSpec {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  bool or_half = false;  // BF16 and F16 accepted too (for an f32 weight: converted when loaded)
};

// The tensors of a checkpoint by name, from one safetensors file or from the shards a
// Hugging Face-style index names ({"weight_map": {tensor: shard file}, "metadata": ...}; the
// shards are plain file names in the index's folder). load() takes a .safetensors file, an
// index (*.index.json), or a folder holding model.safetensors.index.json or exactly one
// .safetensors file. Refused, naming the file: an index that is not JSON or has no
// weight_map object, a shard name with a '/' or "..", a missing or bad shard, a tensor the
// index names that its shard lacks, a shard tensor the index does not name, and a tensor in
// two shards.
class Checkpoint {
 public:
  static Checkpoint load(const std::string& path);

  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  std::span<const uint8_t> bytes(const TensorInfo& tensor) const;
  // The file (the shard) that holds `tensor`, one of shards().
  const SafeTensors& file_of(const TensorInfo& tensor) const;
  const std::vector<SafeTensors>& shards() const { return shards_; }
  // Every tensor, shard by shard in the index's order (one file: header order).
  std::vector<const TensorInfo*> tensors() const;
  // The path given (the file, or the index).
  const std::string& label() const { return label_; }

 private:
  std::string label_;
  std::vector<SafeTensors> shards_;
  std::map<std::string, std::pair<size_t, const TensorInfo*>, std::less<>> where_;
};

// IEEE 754 half precision (F16) to f32, exactly (subnormals, infinities and NaN included).
float f16_to_f32(uint16_t bits);

// Returns one line per problem (empty when the file matches `expected` exactly):
//   missing tensor 'generator.bias' (expected F32 [41])
//   tensor 'generator.weight' has shape [7,24], expected [41,24]
//   tensor 'generator.weight' has dtype F64, expected F32
//   unexpected tensor 'extra.weight' F32 [3]
std::vector<std::string> check_weights(const Checkpoint& file,
                                       const std::vector<WeightSpec>& expected);
std::vector<std::string> check_weights(const SafeTensors& file,
                                       const std::vector<WeightSpec>& expected);

// check_weights, throwing kiln::Error with every problem (one per line) when there are any.
void check_weights_or_throw(const Checkpoint& file, const std::vector<WeightSpec>& expected);
void check_weights_or_throw(const SafeTensors& file, const std::vector<WeightSpec>& expected);

std::string shape_string(const std::vector<int64_t>& shape);  // "[41,24]"

}  // namespace kiln::rt
