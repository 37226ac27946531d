// The reference interpreter: runs any function of any module on host tensors with
// plain loops. It is the oracle for every differential test, so it follows each op's
// definition literally and favours clarity over speed.
//
// Numerics: f32 tensors are stored as float; every reduction (matmul, softmax,
// layernorm, reduce_*, attention) accumulates in double and rounds the result to
// float once. Integer and bool tensors are stored as int64 (bool as 0/1).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/ir.h"

namespace kiln::ir {

struct Tensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<float> f;       // data when dtype == f32
  std::vector<int64_t> ints;  // data for i32, i64, bool (0/1)

  int64_t numel() const;
  static Tensor zeros(DType dtype, std::vector<int64_t> shape);
  static Tensor from_f32(std::vector<int64_t> shape, std::vector<float> data);
  static Tensor from_ints(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> data);
  std::string type_string() const;  // e.g. "f32[2,7,24]"
};

// Weights by name. Underived module weights must be present; derived ones are
// built by `materialize_weights`.
using WeightMap = std::map<std::string, Tensor>;

// Adds every derived weight of `module` (e.g. concatenated projections) to `weights`,
// computed from its inputs. Throws kiln::Error if an input is missing.
void materialize_weights(const Module& module, WeightMap& weights);

// The largest tensor the interpreter makes, in bytes of its storage (4 per f32 element, 8
// per integer or bool element): an op whose result would be larger throws kiln::Error
// naming the op before anything is allocated.
inline constexpr int64_t kMaxInterpreterTensorBytes = int64_t{1} << 32;

// Runs `function` on `inputs` (one per parameter, in order). Binds each symbol from the
// inputs' shapes and checks them against the parameter types and the declared maxima,
// and checks gather indices against the table size; every such problem throws
// kiln::Error naming the input, e.g.
//   input 'src' has shape [2,50]: dim 1 (S) is 50, above its maximum 40
//   token id 45 at 'src'[0,3] is out of range [0, 37)
// Returns the results in order.
std::vector<Tensor> interpret(const Module& module, const Function& function,
                              const WeightMap& weights, const std::vector<Tensor>& inputs);

// The default limit of the interpreter's memory: the storage of the values live at once
// (inputs, weights read by the function, op results; each freed after its last reader).
inline constexpr int64_t kDefaultInterpreterMemoryBytes = int64_t{8} << 30;  // 8 GiB

// Work the interpreter counts when asked (InterpretOptions::counters): added to by each run.
struct InterpretCounters {
  // moe_ffn: the experts evaluated (those with at least one routed row, per op and run) and
  // the (row, slot) pairs they computed: Σ over experts of the rows routed to each.
  int64_t moe_experts_run = 0;
  int64_t moe_expert_rows = 0;
};

struct InterpretOptions {
  // A run that would need more than this many bytes at once throws kiln::Error naming the
  // op and the total before any op runs (kiln run --max-memory).
  int64_t max_bytes = kDefaultInterpreterMemoryBytes;
  // `linear` rounds its input and weight to bf16 (to nearest, ties to even; zero and f32
  // subnormals to a zero of their sign, NaN kept) before the products, as the kernels of
  // `kiln compile --weights bf16` do (AVX512-BF16 flushes subnormals): the reference for them.
  // So does `linear_rows`.
  bool bf16_linear = false;
  // `attention` rounds q and k to bf16 before QKᵀ, and its unnormalized probabilities and v
  // before the V product (normalizing by the sum of the rounded ones), as the attention kernels
  // of `kiln compile --weights bf16` do (AttentionKernel::bf16: dk even).
  bool bf16_attention = false;
  // `linear` quantizes its weight (symmetric s8 per output row) and each row of its input
  // (asymmetric u8 with a zero point) as the kernels of `kiln compile --weights int8` do
  // (support/int8.h), sums the products exactly and scales the sum back in f32 in the
  // kernels' order: the reference for them. So does `linear_rows` (its rows quantized alike).
  bool int8_linear = false;
  // Where to count work (InterpretCounters), or null.
  InterpretCounters* counters = nullptr;
};
std::vector<Tensor> interpret(const Module& module, const Function& function,
                              const WeightMap& weights, const std::vector<Tensor>& inputs,
                              const InterpretOptions& options);

}  // namespace kiln::ir
