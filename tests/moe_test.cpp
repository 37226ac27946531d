// Issue 26's sparse mixture of experts and the indexing ops under it. topk, take_along_axis
// and scatter_add compiled (tests/jit_model.h: the default pipeline, lowering, Halide JIT, the
// runtime) against the interpreter at odd sizes, with ties, NaN and repeated indices; and
// nn::SparseMoE (router linear -> softmax -> topk -> renormalized gates -> moe_ffn) through
// the interpreter and compiled code against a dense reference that runs every expert on
// every row, with the expert work counted on both sides: exactly the rows the routing sent to
// each expert, fewer than rows · experts.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "frontend/dsl.h"
#include "frontend/nn.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "jit_model.h"
#include "passes/pipeline.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

const ir::Function& function_of(const ir::Module& m, const std::string& name) {
  for (const ir::Function& f : m.functions)
    if (f.name == name) return f;
  throw std::runtime_error("no function " + name);
}

ir::Tensor normal(std::vector<int64_t> shape, std::mt19937& rng, float scale = 1.0f) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> data(static_cast<size_t>(n));
  for (float& x : data) x = d(rng);
  return ir::Tensor::from_f32(std::move(shape), std::move(data));
}

// Values from {-2, ..., 2} (many ties), some NaN where `nans`.
ir::Tensor ties(std::vector<int64_t> shape, std::mt19937& rng, bool nans) {
  ir::Tensor t = normal(shape, rng);
  std::uniform_int_distribution<int> v(-2, 2), p(0, 9);
  for (float& x : t.f) x = nans && p(rng) == 0 ? std::numeric_limits<float>::quiet_NaN() : v(rng);
  return t;
}

ir::Tensor ids(std::vector<int64_t> shape, int64_t below, std::mt19937& rng) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::uniform_int_distribution<int64_t> d(0, below - 1);
  std::vector<int64_t> data(static_cast<size_t>(n));
  for (int64_t& x : data) x = d(rng);
  return ir::Tensor::from_ints(ir::DType::i64, std::move(shape), std::move(data));
}

// Equal values (NaN equal to NaN), or f32 within `tol`.
void expect_close(const ir::Tensor& got, const ir::Tensor& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.shape, want.shape) << what;
  ASSERT_EQ(got.dtype, want.dtype) << what;
  if (got.dtype != ir::DType::f32) {
    EXPECT_EQ(got.ints, want.ints) << what;
    return;
  }
  for (size_t i = 0; i < got.f.size(); ++i) {
    if (std::isnan(want.f[i])) {
      EXPECT_TRUE(std::isnan(got.f[i])) << what << " at " << i;
      continue;
    }
    ASSERT_NEAR(got.f[i], want.f[i], tol) << what << " at " << i;
  }
}

constexpr char kIndexing[] = R"(
module @indexing {
  symbol R max 40
  symbol N max 40
  func @topk3(%x: f32[R,N]) -> (i64[R,3], f32[R,3]) {
    %i = topk(%x) {k = 3} : i64[R,3]
    %v = take_along_axis(%x, %i) {axis = -1} : f32[R,3]
    return %i, %v
  }
  func @topk1(%x: f32[R,N]) -> (i64[R,1]) {
    %i = topk(%x) {k = 1} : i64[R,1]
    return %i
  }
  func @topk_i64(%x: i64[R,N]) -> (i64[R,1]) {
    %i = topk(%x) {k = 1} : i64[R,1]
    return %i
  }
  func @take_fused(%x: f32[R,N], %i: i64[R,5]) -> (f32[R,5]) {
    %t = take_along_axis(%x, %i) {axis = 1} : f32[R,5]
    %y = mul(%t, %t) : f32[R,5]
    return %y
  }
  func @take0(%x: f32[N,5], %i: i64[R,5]) -> (f32[R,5]) {
    %t = take_along_axis(%x, %i) {axis = 0} : f32[R,5]
    return %t
  }
  func @scatter1(%b: f32[R,N], %i: i64[R,3], %s: f32[R,3]) -> (f32[R,N]) {
    %y = scatter_add(%b, %i, %s) {axis = 1} : f32[R,N]
    return %y
  }
  func @scatter0(%b: f32[N,4], %i: i64[R,4], %s: f32[R,4]) -> (f32[N,4]) {
    %y = scatter_add(%b, %i, %s) {axis = 0} : f32[N,4]
    return %y
  }
  func @scatter_i64(%b: i64[N,2], %i: i64[R,2], %s: i64[R,2]) -> (i64[N,2]) {
    %y = scatter_add(%b, %i, %s) {axis = -2} : i64[N,2]
    return %y
  }
}
)";

// Runs `name` interpreted and compiled on `inputs` and compares every result.
void check_function(const ir::Module& m, jit::JitModel& jit, const std::string& name,
                    const std::vector<ir::Tensor>& inputs, const std::string& what) {
  const std::vector<ir::Tensor> want = ir::interpret(m, function_of(m, name), {}, inputs);
  const std::vector<ir::Tensor> got = jit.run(name, inputs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r)
    expect_close(got[r], want[r], 1e-6, fmt::format("{} {} result {}", name, what, r));
}

TEST(IndexingKernels, CompiledMatchesTheInterpreterAtOddSizes) {
  const ir::Module m = ir::parse_and_verify(kIndexing);
  jit::JitModel jit(m, {}, ::testing::TempDir() + "/indexing.safetensors");
  std::mt19937 rng(26);
  for (int64_t r : {1, 7, 33})
    for (int64_t n : {1, 3, 7, 33}) {
      const std::string what = fmt::format("R={} N={}", r, n);
      if (n >= 3) check_function(m, jit, "topk3", {ties({r, n}, rng, true)}, what);
      check_function(m, jit, "topk1", {ties({r, n}, rng, true)}, what);
      check_function(m, jit, "topk1", {normal({r, n}, rng)}, what);
      ir::Tensor xi = ids({r, n}, 3, rng);  // i64 values with ties
      check_function(m, jit, "topk_i64", {xi}, what);
      check_function(m, jit, "take_fused", {normal({r, n}, rng), ids({r, 5}, n, rng)}, what);
      check_function(m, jit, "take0", {normal({n, 5}, rng), ids({r, 5}, n, rng)}, what);
      check_function(m, jit, "scatter1",
                     {normal({r, n}, rng), ids({r, 3}, n, rng), normal({r, 3}, rng)}, what);
      check_function(m, jit, "scatter0",
                     {normal({n, 4}, rng), ids({r, 4}, n, rng), normal({r, 4}, rng)}, what);
      check_function(m, jit, "scatter_i64",
                     {ids({n, 2}, 100, rng), ids({r, 2}, n, rng), ids({r, 2}, 1000, rng)}, what);
    }
  // A last axis shorter than k is refused before any kernel runs.
  EXPECT_EQ(testing::error_of([&] {
              jit.run("topk3", {normal({2, 2}, rng)});
            }),
            "entry point 'topk3': topk %i needs at least k = 3 elements along its last axis "
            "(3 > 2)");
}

// ---------------------------------------------------------------------------------------
// nn::SparseMoE

constexpr int64_t kD = 16, kF = 24, kE = 8;

// A model of one SparseMoE block (Mixtral's names under "block_sparse_moe"): forward(x [T, D]).
ir::Module moe_model(int64_t top_k) {
  dsl::ModelBuilder mb("moe");
  const ir::Dim T = mb.symbol("T", 40);
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor x = f.input("x", ir::DType::f32, {T, ir::Dim::constant(kD)});
  f.output(nn::SparseMoE{"block_sparse_moe", kD, kF, kE, top_k}(x), "y");
  return mb.finish();
}

ir::WeightMap moe_weights(std::mt19937& rng) {
  ir::WeightMap w;
  w["block_sparse_moe.gate.weight"] = normal({kE, kD}, rng);
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = fmt::format("block_sparse_moe.experts.{}.", e);
    w[p + "w1.weight"] = normal({kF, kD}, rng, 0.3f);
    w[p + "w2.weight"] = normal({kD, kF}, rng, 0.3f);
    w[p + "w3.weight"] = normal({kF, kD}, rng, 0.3f);
  }
  return w;
}

// The dense reference (Hugging Face's MixtralSparseMoeBlock written densely): every expert on
// every row, in double, weighted by the renormalized top-k mask of the router's softmax.
// `routed[e]` gets the rows whose top k include e.
ir::Tensor dense_reference(const ir::Tensor& x, const ir::WeightMap& w, int64_t top_k,
                           std::vector<int64_t>& routed) {
  const int64_t T = x.shape[0];
  routed.assign(kE, 0);
  std::vector<float> out(static_cast<size_t>(T * kD), 0.0f);
  const ir::Tensor& gate = w.at("block_sparse_moe.gate.weight");
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> p(kE);
    double mx = -1e300, sum = 0;
    for (int64_t e = 0; e < kE; ++e) {
      double l = 0;
      for (int64_t i = 0; i < kD; ++i) l += gate.f[e * kD + i] * x.f[t * kD + i];
      p[e] = l;
      mx = std::max(mx, l);
    }
    for (double& v : p) sum += (v = std::exp(v - mx));
    for (double& v : p) v /= sum;
    std::vector<int64_t> order(kE);
    for (int64_t e = 0; e < kE; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    std::vector<double> mask(kE, 0.0);
    double chosen = 0;
    for (int64_t j = 0; j < top_k; ++j) chosen += p[order[j]];
    for (int64_t j = 0; j < top_k; ++j) {
      mask[order[j]] = p[order[j]] / chosen;
      ++routed[order[j]];
    }
    for (int64_t e = 0; e < kE; ++e) {  // every expert, masked
      const std::string pre = fmt::format("block_sparse_moe.experts.{}.", e);
      const ir::Tensor &w1 = w.at(pre + "w1.weight"), &w2 = w.at(pre + "w2.weight"),
                       &w3 = w.at(pre + "w3.weight");
      std::vector<double> h(kF);
      for (int64_t j = 0; j < kF; ++j) {
        double a = 0, b = 0;
        for (int64_t i = 0; i < kD; ++i) {
          a += w1.f[j * kD + i] * x.f[t * kD + i];
          b += w3.f[j * kD + i] * x.f[t * kD + i];
        }
        h[j] = a / (1 + std::exp(-a)) * b;
      }
      for (int64_t i = 0; i < kD; ++i) {
        double y = 0;
        for (int64_t j = 0; j < kF; ++j) y += w2.f[i * kF + j] * h[j];
        out[t * kD + i] += static_cast<float>(mask[e] * y);
      }
    }
  }
  return ir::Tensor::from_f32({T, kD}, out);
}

// The compiled run's moe_ffn work from kiln's profile: (experts run, expert rows).
std::pair<int64_t, int64_t> profiled_moe_work(kiln_model* model) {
  const std::string report = kiln_model_profile(model);
  std::smatch m;
  const std::regex line(
      R"(builtin 'forward: moe_ffn %\d+' ran (\d+) time\(s\), [0-9.]+ ms per run, )"
      R"((\d+) experts run over (\d+) expert rows)");
  if (!std::regex_search(report, m, line)) {
    ADD_FAILURE() << "no moe_ffn line in the profile:\n" << report;
    return {-1, -1};
  }
  EXPECT_EQ(m[1].str(), "1");
  return {std::stoll(m[2].str()), std::stoll(m[3].str())};
}

struct MoeCase {
  int64_t top_k;
  bool one_expert;  // every row routed to expert 3 (top_k 1)
};

void check_moe(const MoeCase& c) {
  std::mt19937 rng(2026);
  const ir::Module m = moe_model(c.top_k);
  ir::WeightMap w = moe_weights(rng);
  if (c.one_expert) {
    // Positive inputs and a router whose row 3 is positive and the others negative: expert 3
    // has the largest logit on every row.
    ir::Tensor& g = w["block_sparse_moe.gate.weight"];
    for (int64_t e = 0; e < kE; ++e)
      for (int64_t i = 0; i < kD; ++i) g.f[e * kD + i] = e == 3 ? 0.5f : -0.5f - 0.1f * e;
  }
  jit::JitModel jit(m, w, ::testing::TempDir() + "/moe.safetensors");
  for (int64_t T : {1, 7, 33}) {
    const std::string what = fmt::format("T={} top_k={}", T, c.top_k);
    ir::Tensor x = normal({T, kD}, rng);
    if (c.one_expert)
      for (float& v : x.f) v = std::abs(v) + 0.05f;
    std::vector<int64_t> routed;
    const ir::Tensor want = dense_reference(x, w, c.top_k, routed);
    int64_t experts_chosen = 0, rows_routed = 0;
    for (int64_t n : routed) {
      experts_chosen += n > 0;
      rows_routed += n;
    }
    ASSERT_EQ(rows_routed, T * c.top_k) << what;
    if (c.one_expert) {
      ASSERT_EQ(routed[3], T) << what;
      ASSERT_EQ(experts_chosen, 1) << what;
    }

    ir::InterpretCounters counters;
    ir::InterpretOptions options;
    options.counters = &counters;
    const ir::Tensor interpreted = ir::interpret(m, function_of(m, "forward"), w, {x}, options)[0];
    expect_close(interpreted, want, 1e-4, "interpreter " + what);
    EXPECT_EQ(counters.moe_expert_rows, rows_routed) << what;
    EXPECT_EQ(counters.moe_experts_run, experts_chosen) << what;

    kiln_model_set_profiling(jit.model(), 1);  // clears the tallies
    const ir::Tensor compiled = jit.run("forward", {x})[0];
    expect_close(compiled, want, 1e-4, "compiled " + what);
    const auto [experts_run, expert_rows] = profiled_moe_work(jit.model());
    kiln_model_set_profiling(jit.model(), 0);
    EXPECT_EQ(expert_rows, rows_routed) << what;
    EXPECT_EQ(experts_run, experts_chosen) << what;
    // Work ∝ rows · top_k: strictly less than every expert on every row.
    EXPECT_LT(expert_rows, T * kE) << what;
  }
}

TEST(SparseMoE, Top2RunsOnlyTheChosenExperts) { check_moe({2, false}); }
TEST(SparseMoE, EveryRowToOneExpert) { check_moe({1, true}); }

// moe_ffn with the routing given: every row to expert 3 (one expert with all rows, the
// others empty), and a row naming one expert twice (both slots add); ids out of range are
// refused when binding.
TEST(SparseMoE, RoutingGivenAsInput) {
  dsl::ModelBuilder mb("routed");
  const ir::Dim T = mb.symbol("T", 40);
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor x = f.input("x", ir::DType::f32, {T, ir::Dim::constant(kD)});
  dsl::Tensor ids = f.input("ids", ir::DType::i64, {T, ir::Dim::constant(2)});
  dsl::Tensor gates = f.input("gates", ir::DType::f32, {T, ir::Dim::constant(2)});
  std::vector<dsl::ExpertWeights> ew;
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = fmt::format("block_sparse_moe.experts.{}.", e);
    ew.push_back({f.weight(p + "w1.weight", {kF, kD}), f.weight(p + "w3.weight", {kF, kD}),
                  f.weight(p + "w2.weight", {kD, kF})});
  }
  f.output(dsl::moe_ffn(x, ids, gates, ew), "y");
  const ir::Module m = mb.finish();
  std::mt19937 rng(7);
  const ir::WeightMap w = moe_weights(rng);
  jit::JitModel jit(m, w, ::testing::TempDir() + "/routed.safetensors");
  for (int64_t T : {1, 7, 33}) {
    const ir::Tensor x = normal({T, kD}, rng), g = normal({T, 2}, rng);
    for (const bool same : {true, false}) {
      // same: every slot of every row expert 3; else slot 0 expert 3 and slot 1 expert 5
      // on even rows, 3 on odd ones (a row naming expert 3 twice).
      std::vector<int64_t> v(static_cast<size_t>(2 * T), 3);
      if (!same)
        for (int64_t t = 0; t < T; t += 2) v[2 * t + 1] = 5;
      const ir::Tensor ids_t = ir::Tensor::from_ints(ir::DType::i64, {T, 2}, v);
      ir::InterpretCounters counters;
      ir::InterpretOptions options;
      options.counters = &counters;
      const ir::Tensor want =
          ir::interpret(m, function_of(m, "forward"), w, {x, ids_t, g}, options)[0];
      kiln_model_set_profiling(jit.model(), 1);
      const ir::Tensor got = jit.run("forward", {x, ids_t, g})[0];
      const auto [experts_run, expert_rows] = profiled_moe_work(jit.model());
      kiln_model_set_profiling(jit.model(), 0);
      const std::string what = fmt::format("T={} same={}", T, same);
      expect_close(got, want, 1e-5, what);
      const int64_t chosen = same ? 1 : 2;
      EXPECT_EQ(counters.moe_experts_run, chosen) << what;
      EXPECT_EQ(experts_run, chosen) << what;
      EXPECT_EQ(counters.moe_expert_rows, 2 * T) << what;
      EXPECT_EQ(expert_rows, 2 * T) << what;
      if (same) {
        // Both slots through expert 3 add: the same as one slot with the gates' sum.
        ir::Tensor summed = g;
        for (int64_t t = 0; t < T; ++t) {
          summed.f[2 * t] = g.f[2 * t] + g.f[2 * t + 1];
          summed.f[2 * t + 1] = 0;
        }
        expect_close(jit.run("forward", {x, ids_t, summed})[0], got, 1e-4, "summed " + what);
      }
    }
  }
  std::vector<int64_t> bad = {3, 3, 8, 0};
  EXPECT_EQ(testing::error_of([&] {
              jit.run("forward",
                      {normal({2, kD}, rng), ir::Tensor::from_ints(ir::DType::i64, {2, 2}, bad),
                       normal({2, 2}, rng)});
            }),
            "expert id 8 at 'ids'[1,0] is out of range [0, 8)");
}

// After the default pipeline: the router a linear, the experts one moe_ffn, no matmul left.
TEST(SparseMoE, DefaultPipelineKeepsOneMoeOpAndALinearRouter) {
  ir::Module m = moe_model(2);
  passes::run_passes(m, passes::default_pipeline(), {});
  std::map<std::string, int> ops;
  for (const ir::Op& op : function_of(m, "forward").ops) ++ops[ir::op_name(op.kind)];
  EXPECT_EQ(ops["moe_ffn"], 1);
  EXPECT_EQ(ops["linear"], 1);
  EXPECT_EQ(ops["topk"], 1);
  EXPECT_EQ(ops["take_along_axis"], 1);
  EXPECT_EQ(ops["matmul"], 0);
  EXPECT_EQ(ops["weight"], 1 + 3 * kE);
}

// Misuse of the block names it; a computed expert weight is refused by compiled code.
TEST(SparseMoE, MisuseIsAnError) {
  dsl::ModelBuilder mb("bad");
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor x = f.input("x", ir::DType::f32, {ir::Dim::constant(3), ir::Dim::constant(kD)});
  EXPECT_THAT(testing::error_of([&] {
                nn::SparseMoE{"moe", kD, kF, 2, 3}(x);
              }),
              HasSubstr("top_k = 3 exceeds experts = 2"));
  EXPECT_THAT(testing::error_of([&] {
                nn::SparseMoE{"moe", kD + 1, kF, 2, 1}(x);
              }),
              HasSubstr("d_model"));
}

TEST(SparseMoE, ComputedExpertWeightsAreRefusedByCompiledCode) {
  const ir::Module m = ir::parse_and_verify(R"(
module @m {
  weight @w : f32[3,4]
  weight @d : f32[4,3]
  func @f(%x: f32[2,4], %i: i64[2,1], %g: f32[2,1]) -> (f32[2,4]) {
    %a = weight() {name = "w"} : f32[3,4]
    %n = neg(%a) : f32[3,4]
    %b = weight() {name = "d"} : f32[4,3]
    %y = moe_ffn(%x, %i, %g, %n, %a, %b) {experts = 1} : f32[2,4]
    return %y
  }
})");
  ir::Module opt = m;
  passes::run_passes(opt, passes::default_pipeline(), {});
  EXPECT_THAT(testing::error_of([&] { codegen::lower_module(opt); }),
              HasSubstr("moe_ffn %y takes its expert weights from the model's weights; operand 3 "
                        "(%n) is computed at run time"));
}

}  // namespace
}  // namespace kiln
