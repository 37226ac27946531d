// A generator of random verified modules (a DAG of the ops schedule and plan-memory must
// handle) for the tests of schedule and plan-memory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ir/ir.h"
#include "ir/op_types.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace kiln::testing {

// Builds a random verified module with one function `f` over symbols B and S: a DAG of
// elementwise ops (with broadcasting), comparisons and selects, matmuls (by weights and
// batched score-like ones), reshapes, transposes, softmaxes, reductions, add_layernorm and
// linear ops. Operands favour recent values but reach back anywhere (random fan-out);
// the function returns one to three values, and some values stay unused.
class RandomGraph {
  using Dim = ir::Dim;
  using DType = ir::DType;
  using OpKind = ir::OpKind;
  using TensorType = ir::TensorType;

 public:
  explicit RandomGraph(uint32_t seed) : rng_(seed) {}

  ir::Module build() {
    m_.name = "random";
    m_.symbols = {{"B", 2 + pick(3)}, {"S", 3 + pick(12)}};
    f_ = &m_.functions.emplace_back();
    f_->name = "f";
    const int64_t d = pick(2) ? 4 : 8;
    pool_.push_back(f_->add_param("x", f32({sym("B"), sym("S"), con(d)})));
    if (pick(2)) pool_.push_back(f_->add_param("y", f32({sym("S"), con(d)})));
    if (pick(2)) pool_.push_back(f_->add_param("z", f32({sym("B"), sym("S"), con(d)})));
    const int ops = 8 + pick(50);
    for (int tries = 0; tries < 20 * ops && static_cast<int>(f_->ops.size()) < ops; ++tries)
      add_random_op();
    // Results: the last value made, and up to two other op results, each named.
    if (f_->defining_op(pool_.back()) < 0) emit(OpKind::relu, {pool_.back()});
    std::vector<ir::ValueId> results = {pool_.back()};
    for (int k = pick(3); k > 0; --k) {
      ir::ValueId v = pool_[pick(static_cast<int>(pool_.size()))];
      if (f_->defining_op(v) >= 0 && std::find(results.begin(), results.end(), v) == results.end())
        results.push_back(v);
    }
    for (size_t i = 0; i < results.size(); ++i)
      f_->values[results[i]].name = "out" + std::to_string(i);
    f_->results = results;
    return std::move(m_);
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  static Dim sym(const char* s) { return Dim::sym(s); }
  static Dim con(int64_t v) { return Dim::constant(v); }
  static TensorType f32(std::vector<Dim> shape) { return TensorType{DType::f32, std::move(shape)}; }

  // A value from the pool: half the time one of the last four, else any.
  ir::ValueId any_value() {
    const int n = static_cast<int>(pool_.size());
    return pick(2) ? pool_[n - 1 - pick(std::min(n, 4))] : pool_[pick(n)];
  }

  ir::ValueId weight(std::vector<int64_t> shape) {
    std::vector<Dim> dims;
    for (int64_t s : shape) dims.push_back(con(s));
    const std::string name = "w" + std::to_string(weights_++);
    m_.declare_weight(name, f32(dims));
    return f_->add_op(OpKind::weight, {}, f32(dims), {{"name", name}});
  }

  ir::ValueId constant() {
    return f_->add_op(OpKind::constant, {}, f32({}), {{"value", 0.5 + pick(4) * 0.25}});
  }

  // Adds the op when its type rule accepts it; returns its value, or -1.
  ir::ValueId emit(OpKind kind, std::vector<ir::ValueId> operands, ir::Attrs attrs = {},
                   const TensorType* declared = nullptr, bool to_pool = true) {
    std::vector<TensorType> types;
    for (ir::ValueId v : operands) types.push_back(f_->type(v));
    ir::TypeResult r = ir::infer_type(m_, kind, types, attrs, declared);
    if (!r.ok()) return -1;
    ir::ValueId v = f_->add_op(kind, std::move(operands), r.type, std::move(attrs));
    if (to_pool) pool_.push_back(v);
    return v;
  }

  // A second operand for an elementwise op with `a`: a value of a's type, one that
  // broadcasts with it, or a new rank-0 constant.
  ir::ValueId partner(ir::ValueId a) {
    ir::ValueId b = any_value();
    std::vector<TensorType> types = {f_->type(a), f_->type(b)};
    if (pick(4) && ir::broadcast_types(types[0], types[1], DType::f32).ok()) return b;
    for (size_t k = pool_.size(); k-- > 0;)
      if (pool_[k] != a && f_->type(pool_[k]) == f_->type(a) && pick(2)) return pool_[k];
    return constant();
  }

  void add_random_op() {
    const ir::ValueId a = any_value();
    const TensorType& t = f_->type(a);
    const int64_t rank = t.rank();
    const Dim last = t.shape.empty() ? con(1) : t.shape.back();
    static const OpKind kUnary[] = {OpKind::relu, OpKind::neg};
    static const OpKind kBinary[] = {OpKind::add, OpKind::sub, OpKind::mul, OpKind::maximum};
    switch (pick(12)) {
      case 0:
        emit(kUnary[pick(2)], {a});
        break;
      case 1:
      case 2: {
        const ir::ValueId b = partner(a);
        emit(kBinary[pick(4)], pick(2) ? std::vector{a, b} : std::vector{b, a});
        break;
      }
      case 3: {  // select(a > b, a, b)
        const ir::ValueId b = partner(a);
        const ir::ValueId c = emit(OpKind::gt, {a, b}, {}, nullptr, /*to_pool=*/false);
        if (c >= 0) emit(OpKind::select, {c, a, b});
        break;
      }
      case 4:  // by a weight
        if (rank >= 2 && !last.is_symbolic())
          emit(OpKind::matmul, {a, weight({last.value, 4 + 4 * pick(2)})});
        break;
      case 5: {  // a · aᵀ, score-like: [.., M, K] x [.., K, M]
        if (rank < 2) break;
        std::vector<int64_t> perm;
        for (int64_t i = 0; i < rank; ++i) perm.push_back(i);
        std::swap(perm[rank - 1], perm[rank - 2]);
        const ir::ValueId at = emit(OpKind::transpose, {a}, {{"perm", perm}});
        if (at >= 0) emit(OpKind::matmul, {a, at});
        break;
      }
      case 6: {  // split the last dim in two, or merge the last two constant dims
        TensorType r = t;
        if (!last.is_symbolic() && last.value % 2 == 0 && last.value > 2 && pick(2)) {
          r.shape.back() = con(2);
          r.shape.push_back(con(last.value / 2));
        } else if (rank >= 2 && !last.is_symbolic() && !t.shape[rank - 2].is_symbolic()) {
          r.shape.pop_back();
          r.shape.back() = con(last.value * t.shape[rank - 2].value);
        } else {
          break;
        }
        emit(OpKind::reshape, {a}, {}, &r);
        break;
      }
      case 7: {
        std::vector<int64_t> perm;
        for (int64_t i = 0; i < rank; ++i) perm.push_back(i);
        std::shuffle(perm.begin(), perm.end(), rng_);
        if (rank >= 1) emit(OpKind::transpose, {a}, {{"perm", perm}});
        break;
      }
      case 8:
        if (rank >= 1) emit(OpKind::softmax, {a}, {{"axis", int64_t{-1}}});
        break;
      case 9:
        if (rank >= 1)
          emit(OpKind::reduce_sum, {a},
               {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t{1}}});
        break;
      case 10: {  // add_layernorm(a, b, gamma, beta) with b of a's type
        if (rank < 1 || last.is_symbolic()) break;
        ir::ValueId b = -1;
        for (size_t k = pool_.size(); k-- > 0 && b < 0;)
          if (pool_[k] != a && f_->type(pool_[k]) == t) b = pool_[k];
        if (b < 0) b = a;
        const ir::ValueId gamma = weight({last.value});
        const ir::ValueId beta = weight({last.value});
        emit(OpKind::add_layernorm, {a, b, gamma, beta}, {{"eps", 1e-5}});
        break;
      }
      default: {  // linear(a, W[N,K], b[N])
        if (rank < 1 || last.is_symbolic()) break;
        const int64_t n = 4 + 4 * pick(2);
        const ir::ValueId w = weight({n, last.value});
        const ir::ValueId bias = weight({n});
        emit(OpKind::linear, {a, w, bias}, {{"act", std::string(pick(2) ? "relu" : "none")}});
        break;
      }
    }
  }

  std::mt19937 rng_;
  ir::Module m_;
  ir::Function* f_ = nullptr;
  std::vector<ir::ValueId> pool_;  // parameters and op results other than sources
  int weights_ = 0;
};

inline ir::Module random_module(uint32_t seed) {
  ir::Module m = RandomGraph(seed).build();
  std::vector<ir::Diagnostic> diags = ir::verify(m);
  EXPECT_TRUE(diags.empty()) << "seed " << seed << ": " << ir::format_diagnostic(diags[0]) << "\n"
                             << ir::print_module(m);
  return m;
}

inline constexpr uint32_t kRandomGraphs = 250;

}  // namespace kiln::testing
