// Tests of schedule and plan-memory: check_memory_plan proves the plans sound on the
// reference Transformer (tiny, small; as emitted and after the default pipeline) and on
// randomly generated graphs, and catches deliberately corrupted plans; schedule keeps the
// outputs bit for bit, never raises the peak of live bytes and is deterministic; the
// memory report; the base model's arena against the sum of its intermediates.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/ir.h"
#include "ir/op_types.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/plan_memory.h"
#include "passes/schedule.h"
#include "tests/pass_harness.h"

namespace kiln {
namespace {

using ir::Dim;
using ir::DType;
using ir::OpKind;
using ir::TensorType;

const std::vector<std::string> kScheduleAndPlan = {"schedule", "plan-memory"};

ir::Module tiny() { return models::build_model("transformer", "tiny"); }
ir::Module small() { return models::build_model("transformer", "small"); }

// All violations of every function, prefixed with the function's name.
std::vector<std::string> violations(const ir::Module& m) {
  std::vector<std::string> all;
  for (const ir::Function& f : m.functions)
    for (const std::string& v : passes::check_memory_plan(m, f)) all.push_back(f.name + ": " + v);
  return all;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

bool any_contains(const std::vector<std::string>& lines, const std::string& needle) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(needle) != std::string::npos; });
}

// --- A random graph generator ----------------------------------------------------------

// Builds a random verified module with one function `f` over symbols B and S: a DAG of
// elementwise ops (with broadcasting), comparisons and selects, matmuls (by weights and
// batched score-like ones), reshapes, transposes, softmaxes, reductions, add_layernorm and
// linear ops. Operands favour recent values but reach back anywhere (random fan-out);
// the function returns one to three values, and some values stay unused.
class RandomGraph {
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

ir::Module random_module(uint32_t seed) {
  ir::Module m = RandomGraph(seed).build();
  std::vector<ir::Diagnostic> diags = ir::verify(m);
  EXPECT_TRUE(diags.empty()) << "seed " << seed << ": " << ir::format_diagnostic(diags[0]) << "\n"
                             << ir::print_module(m);
  return m;
}

constexpr uint32_t kRandomGraphs = 250;

// --- Liveness as the tests see it (for corrupting plans) ---------------------------------

struct Interval {
  int op;    // defining op
  int last;  // last use (op when unused)
};

// The arena values of `f` (op results other than weights, views and results) with the
// intervals from their definition to their last use as an operand, in op order (the
// planner's liveness also counts reads through views and fused kernels, so it is longer).
std::vector<Interval> arena_intervals(const ir::Function& f) {
  std::vector<int> last(f.values.size(), -1);
  for (size_t i = 0; i < f.ops.size(); ++i) {
    last[f.ops[i].result] = static_cast<int>(i);
    for (ir::ValueId v : f.ops[i].operands) last[v] = static_cast<int>(i);
  }
  std::vector<Interval> out;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    if (op.kind == OpKind::weight || op.kind == OpKind::reshape || op.kind == OpKind::slice ||
        std::find(f.results.begin(), f.results.end(), op.result) != f.results.end())
      continue;
    out.push_back(Interval{static_cast<int>(i), last[op.result]});
  }
  return out;
}

// Moves one arena value onto another that is live strictly across its definition (so the
// pair can never be an in-place one); returns false when the function has no such pair.
bool corrupt_with_overlap(ir::Function& f, std::string* moved) {
  const std::vector<Interval> values = arena_intervals(f);
  for (const Interval& a : values)
    for (const Interval& b : values)
      if (a.op < b.op && b.op < a.last) {
        f.ops[b.op].arena_offset = f.ops[a.op].arena_offset;
        *moved = "(op " + std::to_string(b.op) + ",";
        return true;
      }
  return false;
}

// --- check_memory_plan -----------------------------------------------------------------

TEST(MemoryPlan, SoundOnTinyAndSmall) {
  for (ir::Module m : {tiny(), small()}) {
    ir::Module planned = testing::after_passes(m, kScheduleAndPlan);
    EXPECT_EQ(joined(violations(planned)), "") << m.name;
    for (const ir::Function& f : planned.functions) {
      EXPECT_GT(f.arena_bytes, 0) << f.name;
      EXPECT_LT(f.arena_bytes, passes::sum_of_intermediates(planned, f)) << f.name;
    }
  }
}

TEST(MemoryPlan, SoundAfterDefaultPipeline) {
  // Fused ops (attention, linear, add_layernorm, which may run in place) included.
  for (ir::Module m : {tiny(), small()}) {
    ir::Module planned = testing::after_passes(m, passes::default_pipeline());
    EXPECT_EQ(joined(violations(planned)), "") << m.name;
    for (const ir::Function& f : planned.functions) EXPECT_GT(f.arena_bytes, 0) << f.name;
  }
}

TEST(MemoryPlan, SoundOnRandomGraphs) {
  int in_place = 0;
  for (uint32_t seed = 0; seed < kRandomGraphs; ++seed) {
    ir::Module m = testing::after_passes(random_module(seed), kScheduleAndPlan);
    ASSERT_EQ(joined(violations(m)), "") << "seed " << seed << "\n" << ir::print_module(m);
    const ir::Function& f = m.functions[0];
    int64_t aligned_sum = 0;  // what a plan without any reuse would need
    for (const Interval& v : arena_intervals(f)) {
      const TensorType& t = f.type(f.ops[v.op].result);
      aligned_sum += (ir::max_numel(m, t) * ir::dtype_size(t.dtype) + 63) / 64 * 64;
    }
    EXPECT_LE(f.arena_bytes, aligned_sum) << "seed " << seed;
    // Count in-place ops, to show the generator exercises them.
    for (size_t i = 0; i < f.ops.size(); ++i)
      for (ir::ValueId v : f.ops[i].operands) {
        int d = f.defining_op(v);
        if (d >= 0 && f.ops[i].arena_offset >= 0 &&
            f.ops[d].arena_offset == f.ops[i].arena_offset) {
          ++in_place;
          break;
        }
      }
  }
  EXPECT_GT(in_place, 100);
}

TEST(MemoryPlan, CheckerCatchesCorruptedTinyPlans) {
  const ir::Module planned = testing::after_passes(tiny(), kScheduleAndPlan);
  ASSERT_TRUE(violations(planned).empty());
  auto corrupted = [&](auto corrupt) {
    ir::Module m = planned;
    ir::Function& f = *m.find_function("forward");
    corrupt(f);
    return passes::check_memory_plan(m, f);
  };
  // The first arena value (a constant, 64 bytes at offset 0) and the op of the result.
  const ir::Function& fwd = *planned.find_function("forward");
  const int first = arena_intervals(fwd).front().op;
  const int result_op = fwd.defining_op(fwd.results[0]);
  int weight_op = -1;
  for (size_t i = 0; i < fwd.ops.size() && weight_op < 0; ++i)
    if (fwd.ops[i].kind == OpKind::weight) weight_op = static_cast<int>(i);

  std::string moved;
  std::vector<std::string> v = corrupted([&](ir::Function& f) { corrupt_with_overlap(f, &moved); });
  EXPECT_TRUE(any_contains(v, "while both are live")) << joined(v);
  EXPECT_TRUE(any_contains(v, moved)) << moved << "\n" << joined(v);

  v = corrupted([&](ir::Function& f) { f.ops[first].arena_offset += 8; });
  EXPECT_TRUE(any_contains(v, "is not 64-byte aligned")) << joined(v);

  v = corrupted([&](ir::Function& f) { f.arena_bytes -= 64; });
  EXPECT_TRUE(any_contains(v, "is outside the arena")) << joined(v);

  v = corrupted([&](ir::Function& f) { f.ops[first].arena_offset = -1; });
  EXPECT_TRUE(any_contains(v, "has no arena offset")) << joined(v);

  v = corrupted([&](ir::Function& f) { f.ops[weight_op].arena_offset = 0; });
  EXPECT_TRUE(any_contains(v, "is a weight but has arena offset 0")) << joined(v);

  v = corrupted([&](ir::Function& f) { f.ops[result_op].arena_offset = 0; });
  EXPECT_TRUE(any_contains(v, "is a function result but has arena offset 0")) << joined(v);

  v = corrupted([&](ir::Function& f) { f.arena_bytes = -1; });
  EXPECT_TRUE(any_contains(v, "outside the arena of -1 bytes")) << joined(v);
}

TEST(MemoryPlan, CheckerCatchesCorruptedRandomPlans) {
  int caught = 0;
  for (uint32_t seed = 0; seed < kRandomGraphs; ++seed) {
    ir::Module m = testing::after_passes(random_module(seed), kScheduleAndPlan);
    std::string moved;
    if (!corrupt_with_overlap(m.functions[0], &moved)) continue;
    std::vector<std::string> v = passes::check_memory_plan(m, m.functions[0]);
    EXPECT_TRUE(any_contains(v, moved)) << "seed " << seed << ": " << moved << "\n" << joined(v);
    caught += !v.empty();
  }
  EXPECT_GT(caught, 200);
}

TEST(MemoryPlan, CheckerAcceptsOnlyRealInPlacePairs) {
  // Each function puts %b at its operand %a's offset; only @ok is a legal in-place pair.
  const ir::Module m = ir::parse_module(R"(module @m {
  func @ok(%x: f32[16]) -> (f32[16]) arena 64 {
    %a = exp(%x) : f32[16] at 0
    %b = neg(%a) : f32[16] at 0
    %y = softmax(%b) {axis = 0} : f32[16]
    return %y
  }
  func @not_elementwise(%x: f32[4,4]) -> (f32[4,4]) arena 64 {
    %a = exp(%x) : f32[4,4] at 0
    %b = matmul(%a, %a) : f32[4,4] at 0
    %y = relu(%b) : f32[4,4]
    return %y
  }
  func @operand_lives_on(%x: f32[16]) -> (f32[16]) arena 64 {
    %a = exp(%x) : f32[16] at 0
    %b = neg(%a) : f32[16] at 0
    %y = add(%a, %b) : f32[16]
    return %y
  }
  func @smaller_operand(%x: f32[4,1], %z: f32[4,4]) -> (f32[4,4]) arena 64 {
    %a = exp(%x) : f32[4,1] at 0
    %b = add(%a, %z) : f32[4,4] at 0
    %y = relu(%b) : f32[4,4]
    return %y
  }
  func @not_an_operand(%x: f32[16]) -> (f32[16]) arena 64 {
    %a = exp(%x) : f32[16] at 0
    %c = neg(%x) : f32[16] at 0
    %y = add(%a, %c) : f32[16]
    return %y
  }
})");
  for (const ir::Function& f : m.functions) {
    std::vector<std::string> v = passes::check_memory_plan(m, f);
    if (f.name == "ok") {
      EXPECT_EQ(joined(v), "");
    } else {
      ASSERT_EQ(v.size(), 1u) << f.name << "\n" << joined(v);
      const std::string moved = f.name == "not_an_operand" ? "%c (op 1, neg)" : "%b (op 1, ";
      EXPECT_EQ(v[0].rfind(moved, 0), 0u) << f.name << ": " << v[0];
      EXPECT_TRUE(any_contains(v, "overlaps %a (op 0, exp) at [0, ")) << f.name << ": " << v[0];
    }
  }
}

TEST(MemoryPlan, CheckerSeesReadsThroughViewsAndFusedKernels) {
  // Plans that would be sound if every value were read only by the ops naming it: in @view
  // the slice %s reads %a's memory at %y; in @fused %t may be computed inside %y's kernel,
  // which then reads %a. Both plans are reported, and a view with an offset too.
  const ir::Module m = ir::parse_module(R"(module @m {
  func @view(%x: f32[4,16]) -> (f32[4,8]) arena 512 {
    %a = exp(%x) : f32[4,16] at 0
    %s = slice(%a) {axis = 1, start = 8} : f32[4,8] at 256
    %b = neg(%x) : f32[4,16] at 0
    %m = reduce_max(%b) {axes = [1], keepdims = 1} : f32[4,1] at 256
    %y = sub(%s, %m) : f32[4,8]
    return %y
  }
  func @fused(%x: f32[64], %z: f32[64]) -> (f32[64]) arena 512 {
    %a = exp(%x) : f32[64] at 0
    %t = mul(%a, %z) : f32[64] at 0
    %b = neg(%z) : f32[64] at 256
    %y = add(%t, %b) : f32[64]
    return %y
  }
})");
  std::vector<std::string> v = passes::check_memory_plan(m, *m.find_function("view"));
  EXPECT_TRUE(any_contains(v, "%s (op 1, slice) is a view of its operand but has arena offset 256"))
      << joined(v);
  EXPECT_TRUE(any_contains(v,
                           "%b (op 2, neg) at [0, 256) overlaps %a (op 0, exp) at [0, 256) "
                           "while both are live (ops 2..4)"))
      << joined(v);
  v = passes::check_memory_plan(m, *m.find_function("fused"));
  EXPECT_EQ(joined(v),
            "%t (op 1, mul) at [0, 256) overlaps %a (op 0, exp) at [0, 256) while both are live "
            "(ops 1..3)\n");
}

// --- plan-memory -----------------------------------------------------------------------

TEST(MemoryPlan, IsIdempotentAndDeterministic) {
  std::vector<ir::Module> modules = {tiny(), small()};
  for (uint32_t seed = 0; seed < 40; ++seed) modules.push_back(random_module(seed));
  for (const ir::Module& m : modules) {
    ir::Module a = testing::after_passes(m, kScheduleAndPlan);
    ir::Module b = testing::after_passes(m, kScheduleAndPlan);
    const std::string text = ir::print_module(a);
    EXPECT_EQ(text, ir::print_module(b));
    EXPECT_FALSE(passes::plan_memory(a)) << "a second plan-memory changed the plan";
    EXPECT_EQ(ir::print_module(a), text);
    // The plan round-trips through the text form.
    EXPECT_EQ(ir::print_module(ir::parse_module(text)), text);
  }
}

TEST(MemoryPlan, ReportListsValuesAndSummary) {
  ir::Module m = ir::parse_module(R"(module @m {
  symbol B max 4
  weight @g : f32[64]
  func @f(%x: f32[B,64]) -> (f32[B,64]) {
    %g = weight() {name = "g"} : f32[64]
    %a = exp(%x) : f32[B,64]
    %b = neg(%a) : f32[B,64]
    %c = add(%a, %b) : f32[B,64]
    %r = reshape(%c) : f32[B,8,8]
    %s = softmax(%r) {axis = -1} : f32[B,8,8]
    %t = reshape(%s) : f32[B,64]
    %y = mul(%t, %g) : f32[B,64]
    return %y
  }
})");
  const std::string unplanned = passes::memory_report(m, m.functions[0]);
  EXPECT_NE(unplanned.find("no memory plan (run plan-memory); sum of intermediates: 4096 bytes"),
            std::string::npos)
      << unplanned;
  ASSERT_TRUE(passes::plan_memory(m));
  // %c runs in place over %a; the views %r and %t keep %c and %s live until read.
  EXPECT_EQ(passes::memory_report(m, m.functions[0]),
            "memory plan of @f\n"
            "  value  op       type        offset  bytes  live\n"
            "  %a     exp      f32[B,64]        0   1024  [1,3]\n"
            "  %b     neg      f32[B,64]     1024   1024  [2,3]\n"
            "  %c     add      f32[B,64]        0   1024  [3,5]\n"
            "  %r     reshape  f32[B,8,8]    view   1024  [4,5]\n"
            "  %s     softmax  f32[B,8,8]    1024   1024  [5,7]\n"
            "  %t     reshape  f32[B,64]     view   1024  [6,7]\n"
            "  %y     mul      f32[B,64]   result   1024  [7,7]\n"
            "  (1 weight op, not in the arena)\n"
            "arena peak: 2048 bytes (0.00 MiB); sum of intermediates: 4096 bytes (0.00 MiB); "
            "reuse factor 2.00\n");
}

// (f): the base model at max_batch 16, max_len 128.
TEST(MemoryPlan, BaseArenaIsFarBelowTheSumOfIntermediates) {
  const ir::Module base = models::build_model("transformer", "base");
  ASSERT_EQ(base.find_symbol("B")->max, 16);
  ASSERT_EQ(base.find_symbol("S")->max, 128);
  const struct {
    const char* label;
    std::vector<std::string> passes;
  } runs[] = {{"as emitted", kScheduleAndPlan}, {"default pipeline", passes::default_pipeline()}};
  for (const auto& run : runs) {
    const ir::Module m = testing::after_passes(base, run.passes);
    EXPECT_EQ(joined(violations(m)), "") << run.label;
    for (const char* name : {"forward", "encode"}) {
      const ir::Function& f = *m.find_function(name);
      const int64_t sum = passes::sum_of_intermediates(m, f);
      std::printf(
          "base %-16s @%-7s arena peak %11lld bytes (%7.2f MiB), sum of intermediates "
          "%11lld bytes (%8.2f MiB), reuse factor %.2f\n",
          run.label, name, static_cast<long long>(f.arena_bytes),
          static_cast<double>(f.arena_bytes) / (1 << 20), static_cast<long long>(sum),
          static_cast<double>(sum) / (1 << 20),
          static_cast<double>(sum) / static_cast<double>(f.arena_bytes));
      EXPECT_GT(f.arena_bytes, 0) << run.label << " " << name;
      EXPECT_LT(f.arena_bytes, sum) << run.label << " " << name;
    }
  }
}

// --- schedule --------------------------------------------------------------------------

TEST(Schedule, TinyComputesExactlyTheSame) {
  const ir::Module before = tiny();
  const ir::Module after = testing::after_passes(before, {"schedule"});
  EXPECT_NE(ir::print_module(before), ir::print_module(after));  // it did reorder
  EXPECT_EQ(testing::max_difference(before, after, {1, 7, 33}), 0.0);
}

TEST(Schedule, RandomGraphsComputeExactlyTheSame) {
  for (uint32_t seed = 0; seed < kRandomGraphs; seed += 5) {
    const ir::Module before = random_module(seed);
    const ir::Module after = testing::after_passes(before, {"schedule"});
    EXPECT_EQ(testing::max_difference(before, after, {1, 3}), 0.0) << "seed " << seed;
  }
}

TEST(Schedule, NeverRaisesThePeak) {
  std::vector<ir::Module> modules = {tiny(), small(), models::build_model("transformer", "base")};
  for (uint32_t seed = 0; seed < kRandomGraphs; ++seed) modules.push_back(random_module(seed));
  int lowered = 0;
  for (const ir::Module& before : modules) {
    const ir::Module after = testing::after_passes(before, {"schedule"});
    for (const ir::Function& f : before.functions) {
      const int64_t old_peak = passes::peak_live_bytes(before, f);
      const int64_t new_peak = passes::peak_live_bytes(after, *after.find_function(f.name));
      EXPECT_LE(new_peak, old_peak) << before.name << " @" << f.name;
      lowered += new_peak < old_peak;
    }
  }
  EXPECT_GT(lowered, 20);
  // The tiny model's value projections leave the attention peaks.
  const ir::Module t = tiny();
  const ir::Module scheduled = testing::after_passes(t, {"schedule"});
  for (const ir::Function& f : t.functions)
    EXPECT_LT(passes::peak_live_bytes(scheduled, *scheduled.find_function(f.name)),
              passes::peak_live_bytes(t, f))
        << f.name;
}

TEST(Schedule, PlacesSourcesRightBeforeTheirFirstUser) {
  std::vector<ir::Module> modules = {tiny()};
  for (uint32_t seed = 0; seed < 50; ++seed) modules.push_back(random_module(seed));
  for (const ir::Module& m : modules) {
    const ir::Module after = testing::after_passes(m, {"schedule"});
    for (const ir::Function& f : after.functions) {
      for (size_t i = 0; i < f.ops.size(); ++i) {
        if (!f.ops[i].operands.empty()) continue;
        // Between a source and its first user come only other operand-free ops or ops on
        // them (e.g. a weight's transpose), never an op that reads a parameter.
        std::vector<bool> from_sources(f.values.size(), false);
        for (size_t j = i; j < f.ops.size(); ++j) {
          const ir::Op& op = f.ops[j];
          bool uses = std::find(op.operands.begin(), op.operands.end(), f.ops[i].result) !=
                      op.operands.end();
          if (uses && j > i) break;
          bool lazy = true;
          for (ir::ValueId v : op.operands) lazy = lazy && from_sources[v];
          EXPECT_TRUE(lazy) << m.name << " @" << f.name << ": op " << j << " ("
                            << ir::op_name(op.kind) << ") between source " << i
                            << " and its first user";
          from_sources[op.result] = lazy;
        }
      }
    }
  }
}

TEST(Schedule, IsDeterministic) {
  std::vector<ir::Module> modules = {tiny(), small()};
  for (uint32_t seed = 0; seed < 40; ++seed) modules.push_back(random_module(seed));
  for (const ir::Module& m : modules) {
    ir::Module a = m, b = m;
    EXPECT_EQ(passes::schedule(a), passes::schedule(b));
    EXPECT_EQ(ir::print_module(a), ir::print_module(b));
  }
}

const char* kInterleaved = R"(module @m {
  symbol N max 1024
  func @f(%x: f32[N], %y: f32[N]) -> (f32[]) arena 8256 {
    %a = exp(%x) : f32[N] at 0
    %b = exp(%y) : f32[N] at 4096
    %sa = reduce_sum(%a) {axes = [0], keepdims = 0} : f32[] at 8192
    %sb = reduce_sum(%b) {axes = [0], keepdims = 0} : f32[] at 0
    %s = add(%sa, %sb) : f32[]
    return %s
  }
}
)";

TEST(Schedule, KeepsOpLocationsWithTheirOps) {
  const std::string text = kInterleaved;
  ir::Module m = ir::parse_module(text);
  ASSERT_TRUE(passes::schedule(m));
  const ir::Function& f = m.functions[0];
  std::vector<std::string> lines = {""};
  for (char c : text) {
    if (c == '\n')
      lines.emplace_back();
    else
      lines.back().push_back(c);
  }
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const std::string def = "%" + f.values[f.ops[i].result].name + " = ";
    ASSERT_GT(f.ops[i].loc.line, 0);
    ASSERT_LT(static_cast<size_t>(f.ops[i].loc.line), lines.size());
    EXPECT_NE(lines[f.ops[i].loc.line - 1].find(def), std::string::npos)
        << def << " has the location of: " << lines[f.ops[i].loc.line - 1];
  }
}

TEST(Schedule, DropsAStalePlanOnlyWhenTheOrderChanges) {
  ir::Module m = ir::parse_module(kInterleaved);
  ASSERT_TRUE(passes::schedule(m));
  const ir::Function& f = m.functions[0];
  EXPECT_EQ(f.ops[1].kind, OpKind::reduce_sum);  // %sa moved up to %a
  EXPECT_EQ(f.arena_bytes, -1);
  for (const ir::Op& op : f.ops) EXPECT_EQ(op.arena_offset, -1);
  ASSERT_TRUE(passes::plan_memory(m));
  const std::string planned = ir::print_module(m);
  EXPECT_FALSE(passes::schedule(m));
  EXPECT_EQ(ir::print_module(m), planned);
}

}  // namespace
}  // namespace kiln
