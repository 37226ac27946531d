// A generator of random verified modules (a DAG of the ops schedule and plan-memory must
// handle) for the tests of schedule and plan-memory, and (with `general`) of every op kind
// codegen's general path compiles, for the tests that compile random graphs.
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
//
// With `general` (the seeds of the other mode give the same graphs as before), also: ids
// gathered from an embedding table; reductions (sum, mean, max) over random axes with and
// without keepdims; softmax and argmax over a random axis (argmax of values computed
// exactly, parameters and their views and copies, so that near-ties cannot flip an index);
// slices of any axis (strided views), reshapes that insert or drop dims of extent 1, concats,
// layernorm, linears whose weight is computed (with an activation), smooth unary functions
// (tanh, sigmoid, erf, gelu, silu), casts of indices; results that are a
// parameter, a weight, a view or one value twice. Values stay of moderate magnitude.
class RandomGraph {
  using Dim = ir::Dim;
  using DType = ir::DType;
  using OpKind = ir::OpKind;
  using TensorType = ir::TensorType;

 public:
  explicit RandomGraph(uint32_t seed, bool general = false) : rng_(seed), general_(general) {}

  ir::Module build() {
    m_.name = "random";
    m_.symbols = {{"B", 2 + pick(3)}, {"S", 3 + pick(12)}};
    f_ = &m_.functions.emplace_back();
    f_->name = "f";
    const int64_t d = pick(2) ? 4 : 8;
    pool_.push_back(f_->add_param("x", f32({sym("B"), sym("S"), con(d)})));
    if (pick(2)) pool_.push_back(f_->add_param("y", f32({sym("S"), con(d)})));
    if (pick(2)) pool_.push_back(f_->add_param("z", f32({sym("B"), sym("S"), con(d)})));
    for (ir::ValueId p : pool_) exact_.push_back(p);
    if (general_ && pick(2)) {
      const ir::ValueId ids = f_->add_param("ids", TensorType{DType::i64, {sym("B"), sym("S")}});
      exact_.push_back(ids);
      const ir::ValueId table = weight({7, d});
      emit(OpKind::gather, {table, ids});
    }
    const int ops = general_ ? 4 + pick(16) : 8 + pick(50);
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
    if (general_) {
      // Any value, a parameter or a weight included, and sometimes one twice.
      if (pick(3) == 0) results.push_back(pool_[pick(static_cast<int>(pool_.size()))]);
      if (pick(6) == 0) results.push_back(f_->params[0]);
      if (pick(8) == 0) results.push_back(weight({3}));
      if (pick(6) == 0) results.push_back(results[0]);
    }
    for (size_t i = 0; i < results.size(); ++i)
      if (f_->defining_op(results[i]) >= 0 && f_->values[results[i]].name.empty())
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

  bool is_exact(ir::ValueId v) const {
    return std::find(exact_.begin(), exact_.end(), v) != exact_.end();
  }
  // Marks `v` (if made) as computed exactly from exact values (data movement only).
  void exact_if(ir::ValueId v, ir::ValueId from) {
    if (v >= 0 && is_exact(from)) exact_.push_back(v);
  }

  // The ops of the general mode; returns false to fall through to the common ones.
  bool add_general_op(ir::ValueId a) {
    const TensorType& t = f_->type(a);
    const int64_t rank = t.rank();
    auto random_axis = [&] { return static_cast<int64_t>(pick(static_cast<int>(rank))); };
    switch (pick(16)) {
      case 0:
      case 1: {  // a reduction over a random nonempty set of axes
        if (rank < 1) return false;
        std::vector<int64_t> axes;
        for (int64_t i = 0; i < rank; ++i)
          if (pick(2)) axes.push_back(pick(2) ? i : i - rank);
        if (axes.empty()) axes.push_back(random_axis());
        static const OpKind kReduce[] = {OpKind::reduce_mean, OpKind::reduce_max,
                                         OpKind::reduce_sum};
        // Sums only of small extents, so values stay of moderate size.
        const OpKind kind = kReduce[pick(3)];
        exact_if(emit(kind, {a}, {{"axes", axes}, {"keepdims", int64_t{pick(2)}}}),
                 kind == OpKind::reduce_max ? a : -1);
        return true;
      }
      case 2:
        if (rank < 1) return false;
        emit(OpKind::softmax, {a}, {{"axis", random_axis() - (pick(2) ? rank : 0)}});
        return true;
      case 3: {  // argmax of an exact value, used as an index or cast back to f32
        std::vector<ir::ValueId> exact;
        for (ir::ValueId v : exact_)
          if (f_->type(v).rank() >= 1 && f_->type(v).dtype == DType::f32) exact.push_back(v);
        if (exact.empty()) return false;
        const ir::ValueId e = exact[pick(static_cast<int>(exact.size()))];
        const ir::ValueId i = emit(OpKind::argmax, {e},
                                   {{"axis", int64_t{pick(static_cast<int>(f_->type(e).rank()))}}});
        if (i >= 0 && pick(2)) {
          TensorType ft = f_->type(i);
          ft.dtype = DType::f32;
          emit(OpKind::cast, {i}, {}, &ft);
        }
        return true;
      }
      case 4:
      case 5: {  // a slice of any axis
        if (rank < 1) return false;
        const int64_t axis = random_axis();
        const Dim& d = t.shape[axis];
        TensorType r = t;
        int64_t start = 0;
        if (d.is_symbolic()) {
          // Every size the tests run is at least 2.
          start = pick(2);
          r.shape[axis] = con(1);
        } else {
          if (d.value < 2) return false;
          start = pick(static_cast<int>(d.value - 1));
          r.shape[axis] = con(1 + pick(static_cast<int>(d.value - start)));
        }
        exact_if(
            emit(OpKind::slice, {a}, {{"axis", axis - (pick(2) ? rank : 0)}, {"start", start}}, &r),
            a);
        return true;
      }
      case 6: {  // insert or drop a dim of extent 1
        TensorType r = t;
        std::vector<int64_t> ones;
        for (int64_t i = 0; i < rank; ++i)
          if (t.shape[i].is_const(1)) ones.push_back(i);
        if (!ones.empty() && pick(2))
          r.shape.erase(r.shape.begin() + ones[pick(static_cast<int>(ones.size()))]);
        else if (rank < 5)
          r.shape.insert(r.shape.begin() + pick(static_cast<int>(rank + 1)), con(1));
        else
          return false;
        exact_if(emit(OpKind::reshape, {a}, {}, &r), a);
        return true;
      }
      case 7: {  // concat with a value of the same type, or alone, along a constant axis
        if (rank < 1) return false;
        std::vector<int64_t> axes;
        for (int64_t i = 0; i < rank; ++i)
          if (!t.shape[i].is_symbolic()) axes.push_back(i);
        if (axes.empty()) {
          exact_if(emit(OpKind::concat, {a}, {{"axis", int64_t{0}}}), a);
          return true;
        }
        ir::ValueId b = a;
        for (size_t k = pool_.size(); k-- > 0;)
          if (f_->type(pool_[k]) == t && pick(2)) {
            b = pool_[k];
            break;
          }
        const ir::ValueId c =
            emit(OpKind::concat, {a, b}, {{"axis", axes[pick(static_cast<int>(axes.size()))]}});
        if (is_exact(b)) exact_if(c, a);
        return true;
      }
      case 8: {  // layernorm
        if (rank < 1 || t.shape.back().is_symbolic() || t.dtype != DType::f32) return false;
        const ir::ValueId gamma = weight({t.shape.back().value});
        const ir::ValueId beta = weight({t.shape.back().value});
        emit(OpKind::layernorm, {a, gamma, beta}, {{"eps", 1e-5}});
        return true;
      }
      case 9: {  // a linear whose weight is computed at run time
        if (rank < 1 || t.shape.back().is_symbolic()) return false;
        const ir::ValueId w = weight({4, t.shape.back().value});
        const ir::ValueId half = f_->add_op(OpKind::constant, {}, f32({}), {{"value", 0.5}});
        const ir::ValueId wc = emit(OpKind::mul, {w, half}, {}, nullptr, /*to_pool=*/false);
        static const char* const kActs[] = {"none", "relu", "gelu", "silu", "tanh"};
        if (wc >= 0) emit(OpKind::linear, {a, wc}, {{"act", std::string(kActs[pick(5)])}});
        return true;
      }
      case 11: {  // a smooth unary function
        static const OpKind kSmooth[] = {OpKind::tanh,      OpKind::sigmoid, OpKind::gelu,
                                         OpKind::gelu_tanh, OpKind::silu,    OpKind::erf};
        emit(kSmooth[pick(6)], {a});
        return true;
      }
      case 10: {  // a transpose of an exact value stays exact
        if (rank < 1) return false;
        std::vector<int64_t> perm;
        for (int64_t i = 0; i < rank; ++i) perm.push_back(i);
        std::shuffle(perm.begin(), perm.end(), rng_);
        exact_if(emit(OpKind::transpose, {a}, {{"perm", perm}}), a);
        return true;
      }
      default:
        return false;
    }
  }

  void add_random_op() {
    const ir::ValueId a = any_value();
    if (general_ && add_general_op(a)) return;
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
        if (at >= 0) {
          const ir::ValueId s = emit(OpKind::matmul, {a, at});
          // Scaled like attention's scores in the general mode, to keep values moderate.
          if (s >= 0 && general_) {
            const ir::ValueId c = f_->add_op(OpKind::constant, {}, f32({}), {{"value", 0.25}});
            emit(OpKind::mul, {s, c});
          }
        }
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
  bool general_ = false;
  std::vector<ir::ValueId> exact_;  // values computed exactly (parameters and their views)
  ir::Module m_;
  ir::Function* f_ = nullptr;
  std::vector<ir::ValueId> pool_;  // parameters and op results other than sources
  int weights_ = 0;
};

inline ir::Module random_module(uint32_t seed, bool general = false) {
  ir::Module m = RandomGraph(seed, general).build();
  std::vector<ir::Diagnostic> diags = ir::verify(m);
  EXPECT_TRUE(diags.empty()) << "seed " << seed << ": " << ir::format_diagnostic(diags[0]) << "\n"
                             << ir::print_module(m);
  return m;
}

inline constexpr uint32_t kRandomGraphs = 250;

}  // namespace kiln::testing
