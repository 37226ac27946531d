// Differential testing of passes: random weights and inputs (ids with padding), the
// interpreter run on a module before and after passes, outputs compared.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ir/interpreter.h"
#include "ir/ir.h"
#include "passes/pipeline.h"

namespace kiln::testing {

// Normal(0, 0.3) for every plain weight (derived ones are built from them).
inline ir::WeightMap random_weights(const ir::Module& m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  ir::WeightMap w;
  for (const ir::Weight& wt : m.weights) {
    if (wt.derivation) continue;
    std::vector<int64_t> shape;
    for (const ir::Dim& d : wt.type.shape) shape.push_back(d.value);
    std::vector<float> data(ir::static_numel(wt.type));
    for (float& x : data) x = normal(rng);
    w[wt.name] = ir::Tensor::from_f32(shape, std::move(data));
  }
  ir::materialize_weights(m, w);
  return w;
}

// The vocabulary of an integer parameter: the smallest table it indexes with gather.
inline int64_t vocab_of(const ir::Function& f, ir::ValueId param) {
  int64_t vocab = 1 << 30;
  for (const ir::Op& op : f.ops)
    if (op.kind == ir::OpKind::gather && op.operands[1] == param)
      vocab = std::min(vocab, f.type(op.operands[0]).shape[0].value);
  return vocab == (1 << 30) ? 16 : vocab;
}

// For an index parameter of decoding (a cache_write's position, a cache_attention's row
// table, a memory_attention's source rows): the size of the dim it indexes, or 0.
inline int64_t index_limit(const ir::Function& f, ir::ValueId param,
                           const std::map<std::string, int64_t>& sizes) {
  auto size = [&](const ir::Dim& d) {
    return d.is_symbolic() ? d.at(sizes.at(d.symbol)) : d.value;
  };
  int64_t limit = 0;
  auto take = [&](int64_t l) { limit = limit == 0 ? l : std::min(limit, l); };
  for (const ir::Op& op : f.ops) {
    if (op.kind == ir::OpKind::cache_write && op.operands[2] == param)
      take(size(f.type(op.operands[0]).shape[0]));
    if (op.kind == ir::OpKind::cache_attention && op.operands[3] == param)
      take(size(f.type(op.operands[1]).shape[1]));
    if (op.kind == ir::OpKind::memory_attention && op.operands[3] == param)
      take(size(f.type(op.operands[1]).shape[0]));
  }
  return limit;
}

// Inputs for `f` with each symbol bound as in `sizes`. Integer parameters get ids in
// the vocabulary other than pad_id; with `padding`, rows after the first end in pad_id
// at random lengths (>= 1). f32 parameters get Normal(0, 1).
inline std::vector<ir::Tensor> random_inputs(const ir::Module& m, const ir::Function& f,
                                             const std::map<std::string, int64_t>& sizes,
                                             uint32_t seed, bool padding) {
  std::mt19937 rng(seed);
  int64_t pad_id = m.config.count("pad_id") ? std::stoll(m.config.at("pad_id")) : 0;
  std::vector<ir::Tensor> inputs;
  for (ir::ValueId p : f.params) {
    const ir::TensorType& t = f.type(p);
    std::vector<int64_t> shape;
    for (const ir::Dim& d : t.shape)
      shape.push_back(d.is_symbolic() ? d.at(sizes.at(d.symbol)) : d.value);
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    if (t.dtype == ir::DType::f32) {
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> data(n);
      for (float& x : data) x = normal(rng);
      inputs.push_back(ir::Tensor::from_f32(shape, std::move(data)));
      continue;
    }
    // Indices of decoding: any value in range (no padding); token ids: not pad_id, then
    // padded at the end with `padding`.
    const int64_t index = index_limit(f, p, sizes);
    int64_t vocab = vocab_of(f, p);
    if (index > 0) vocab = std::min(vocab, index);
    std::uniform_int_distribution<int64_t> id(0, vocab - 1);
    std::vector<int64_t> data(n);
    for (int64_t& x : data) {
      do x = id(rng);
      while (index == 0 && x == pad_id && vocab > 1);
    }
    if (padding && shape.size() == 2 && index == 0) {
      for (int64_t b = 1; b < shape[0]; ++b) {
        int64_t len = std::uniform_int_distribution<int64_t>(1, shape[1])(rng);
        for (int64_t j = len; j < shape[1]; ++j) data[b * shape[1] + j] = pad_id;
      }
    }
    inputs.push_back(ir::Tensor::from_ints(t.dtype, shape, std::move(data)));
  }
  return inputs;
}

inline double max_abs_diff(const std::vector<ir::Tensor>& a, const std::vector<ir::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double err = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].shape, b[i].shape);
    EXPECT_EQ(a[i].dtype, b[i].dtype);
    if (a[i].dtype == ir::DType::f32) {
      for (size_t j = 0; j < a[i].f.size() && j < b[i].f.size(); ++j)
        err = std::max(err, std::abs(static_cast<double>(a[i].f[j]) - b[i].f[j]));
    } else {
      for (size_t j = 0; j < a[i].ints.size() && j < b[i].ints.size(); ++j)
        err = std::max(err, std::abs(static_cast<double>(a[i].ints[j] - b[i].ints[j])));
    }
  }
  return err;
}

// Runs every function of `before` and `after` on the same random weights and inputs,
// for each length in `lengths` (every symbol other than B bound to it, B to `batch`, each
// at most its maximum),
// with and without padding; returns the largest difference seen.
inline double max_difference(const ir::Module& before, const ir::Module& after,
                             const std::vector<int64_t>& lengths, int64_t batch = 2,
                             uint32_t seed = 7) {
  ir::WeightMap wb = random_weights(before, seed);
  ir::WeightMap wa = wb;
  ir::materialize_weights(after, wa);
  double worst = 0;
  for (const ir::Function& fb : before.functions) {
    const ir::Function* fa = after.find_function(fb.name);
    EXPECT_NE(fa, nullptr) << fb.name;
    if (!fa) continue;
    for (int64_t len : lengths) {
      for (bool padding : {false, true}) {
        std::map<std::string, int64_t> sizes;
        for (const ir::Symbol& s : before.symbols)  // within the maxima (the hypotheses N)
          sizes[s.name] = std::min(s.max, s.name == "B" ? batch : len);
        auto inputs = random_inputs(before, fb, sizes, seed + static_cast<uint32_t>(len), padding);
        double d = max_abs_diff(ir::interpret(before, fb, wb, inputs),
                                ir::interpret(after, *fa, wa, inputs));
        worst = std::max(worst, d);
      }
    }
  }
  return worst;
}

// `module` after the named passes.
inline ir::Module after_passes(ir::Module module, const std::vector<std::string>& names) {
  passes::PipelineOptions options;
  options.verify_each = true;
  passes::run_passes(module, names, options);
  return module;
}

// How many ops of `kind` function `f` has.
inline int count_ops(const ir::Function& f, ir::OpKind kind) {
  int n = 0;
  for (const ir::Op& op : f.ops) n += op.kind == kind;
  return n;
}

// Function `name` of `m`; a test failure when there is none.
inline const ir::Function& function(const ir::Module& m, const std::string& name) {
  const ir::Function* f = m.find_function(name);
  EXPECT_NE(f, nullptr) << name;
  return *f;
}

// The fusion tests' tolerance on every output (logits, memory). The interpreter's fused ops round
// where their unfused forms do (linear: the dot in double rounded to float, then the bias added in
// float, then relu; add_layernorm: the sum rounded to float, then layernorm; a merged linear
// computes each output column with the same dot as the original), so the expected difference is 0.
// 1e-5 (about 100 float ulps of these O(1) outputs) only leaves room for a reordered accumulation,
// while a wiring mistake (a wrong slice offset, a dropped bias or relu, a swapped weight) changes
// outputs by far more.
constexpr double kFusionTolerance = 1e-5;
// The lengths they run at.
inline const std::vector<int64_t> kFusionLengths = {1, 7, 33};

// Shorthands for building small modules in C++.
inline ir::TensorType f32(std::vector<ir::Dim> shape) {
  return ir::TensorType{ir::DType::f32, std::move(shape)};
}
inline ir::Dim sym(const char* s) { return ir::Dim::sym(s); }
inline ir::Dim c(int64_t v) { return ir::Dim::constant(v); }

// A module with one function `forward(x: f32[B,S,24])`: x · transpose(w) with w
// f32[out,24]; the matmul's declared type is `declared`.
inline ir::Module projection_module(const ir::TensorType& declared) {
  ir::Module m;
  m.name = "m";
  m.symbols = {{"B", 4}, {"S", 16}};
  m.declare_weight("w", f32({c(24), c(24)}));
  ir::Function& f = m.functions.emplace_back();
  f.name = "forward";
  ir::ValueId x = f.add_param("x", f32({sym("B"), sym("S"), c(24)}));
  ir::ValueId w =
      f.add_op(ir::OpKind::weight, {}, f32({c(24), c(24)}), {{"name", std::string("w")}});
  ir::ValueId wt = f.add_op(ir::OpKind::transpose, {w}, f32({c(24), c(24)}),
                            {{"perm", std::vector<int64_t>{1, 0}}});
  ir::ValueId y = f.add_op(ir::OpKind::matmul, {x, wt}, declared);
  f.values[y].name = "y";
  f.results = {y};
  return m;
}

}  // namespace kiln::testing
