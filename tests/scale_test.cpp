// Bounded costs (issue 10): graphs of 10^5 ops go through parse, verify, the default
// pipeline, the memory plan's checker and the interpreter in seconds, with no recursion
// deep enough to overflow the stack and nothing quadratic in the number of ops: long
// chains (fused or through views), and wide graphs (one value read by 25000 chains). The
// tests below the chains assert results only; that they finish is the time bound.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "ir/interpreter.h"
#include "ir/ir.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "passes/schedule.h"

namespace kiln {
namespace {

constexpr int kOps = 100'000;

// Seconds since `start`.
double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs `text` (one function @f(%x: f32[B,4]) -> one result) through every stage, timing
// each, and returns the result for x = [[1, 2, 3, 4]]. Each stage must take under
// `limit_s` seconds: a quadratic stage takes minutes at 10^5 ops.
ir::Tensor run_all_stages(const std::string& text, double limit_s = 20) {
  std::vector<std::pair<std::string, double>> times;
  auto start = std::chrono::steady_clock::now();
  ir::Module m = ir::parse_module(text, "chain.kir");
  times.emplace_back("parse", since(start));

  start = std::chrono::steady_clock::now();
  ir::verify_or_throw(m, "chain.kir");
  times.emplace_back("verify", since(start));

  start = std::chrono::steady_clock::now();
  passes::run_passes(m, passes::default_pipeline());
  times.emplace_back("pipeline", since(start));

  start = std::chrono::steady_clock::now();
  const ir::Function& f = m.functions.at(0);
  EXPECT_EQ(passes::check_memory_plan(m, f), std::vector<std::string>{});
  times.emplace_back("check plan", since(start));

  start = std::chrono::steady_clock::now();
  const std::string printed = ir::print_module(m);
  times.emplace_back("print", since(start));

  start = std::chrono::steady_clock::now();
  std::vector<ir::Tensor> out =
      ir::interpret(m, f, {}, {ir::Tensor::from_f32({1, 4}, {1, 2, 3, 4})});
  times.emplace_back("interpret", since(start));

  for (const auto& [stage, s] : times) {
    EXPECT_LT(s, limit_s) << stage << " took " << s << " s";
    std::fprintf(stderr, "  %-10s %7.3f s\n", stage.c_str(), s);
  }
  EXPECT_FALSE(printed.empty());
  EXPECT_EQ(out.size(), 1u);
  return out.empty() ? ir::Tensor{} : out[0];
}

std::string header() {
  return "module @m {\n  symbol B max 2\n  func @f(%x: f32[B,4]) -> (f32[B,4]) {\n";
}
std::string footer(int last) { return fmt::format("    return %v{}\n  }}\n}}\n", last); }

// 10^5 neg ops in a row: every one is read once by the next, so fuse-elementwise fuses them
// into their readers' kernels, 65 ops a kernel (the planner's and its checker's liveness
// follow each group).
TEST(Scale, ChainOfNegs) {
  std::string text = header() + "    %v0 = neg(%x) : f32[B,4]\n";
  for (int i = 1; i < kOps; ++i) text += fmt::format("    %v{} = neg(%v{}) : f32[B,4]\n", i, i - 1);
  text += footer(kOps - 1);
  ir::Tensor y = run_all_stages(text);
  // An even number of negations: x itself.
  EXPECT_EQ(y.f, (std::vector<float>{1, 2, 3, 4}));
}

// 10^5 adds of the parameter to a running sum: x is read by every op, each sum once.
TEST(Scale, ChainOfAddsSharingAnOperand) {
  std::string text = header() + "    %v0 = add(%x, %x) : f32[B,4]\n";
  for (int i = 1; i < kOps; ++i)
    text += fmt::format("    %v{} = add(%v{}, %x) : f32[B,4]\n", i, i - 1);
  text += footer(kOps - 1);
  ir::Tensor y = run_all_stages(text);
  const float n = kOps + 1;
  EXPECT_EQ(y.f, (std::vector<float>{n, 2 * n, 3 * n, 4 * n}));
}

// Views in a row (reshape there and back) between softmaxes: 10^5 ops whose liveness runs
// through chains of views, and reshape chains for canonicalize to fold.
TEST(Scale, ChainOfViewsAndSoftmaxes) {
  std::string text = header() + "    %v0 = softmax(%x) {axis = 1} : f32[B,4]\n";
  for (int i = 1; i < kOps; ++i) {
    if (i % 3 == 1)
      text += fmt::format("    %v{} = reshape(%v{}) : f32[B,2,2]\n", i, i - 1);
    else if (i % 3 == 2)
      text += fmt::format("    %v{} = reshape(%v{}) : f32[B,4]\n", i, i - 1);
    else
      text += fmt::format("    %v{} = softmax(%v{}) {{axis = 1}} : f32[B,4]\n", i, i - 1);
  }
  static_assert((kOps - 1) % 3 == 0, "the last op is a softmax");
  text += footer(kOps - 1);
  ir::Tensor y = run_all_stages(text);
  ASSERT_EQ(y.f.size(), 4u);
  float sum = 0;
  for (float v : y.f) sum += v;
  EXPECT_NEAR(sum, 1.0f, 1e-5f);  // a softmax's output
}

// Times one stage, for the log (no assertion: the suite's time is the bound).
template <class F>
void timed(const char* stage, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  std::fprintf(stderr, "  %-12s %7.3f s\n", stage, since(start));
}

// The chain of negs again, with schedule, fuse-elementwise and plan-memory alone and the plan
// itself checked. fuse-elementwise cuts the chain as lowering computes it, every 65 ops (a
// kernel's root and the ir::kMaxFusedDepth levels of fused ops below it): op i is fused unless
// kOps - 1 - i is a multiple of 65. A group's fused values are read by its root's kernel and
// the root before them by its first op, so 65 values are live at once: first fit needs 65
// blocks. (When the planner assumed the whole chain fused, every value lived to the end, which
// made the planner and its checker O(n * live values): 4.7 s and 10.9 s.)
TEST(Scale, FusedChainIsPlannedAndCheckedInSeconds) {
  std::string text = header() + "    %v0 = neg(%x) : f32[B,4]\n";
  for (int i = 1; i < kOps; ++i) text += fmt::format("    %v{} = neg(%v{}) : f32[B,4]\n", i, i - 1);
  text += footer(kOps - 1);
  ir::Module m = ir::parse_and_verify(text, "chain.kir");
  timed("schedule", [&] { passes::run_passes(m, {"schedule"}); });
  timed("fuse-elem", [&] { passes::run_passes(m, {"fuse-elementwise"}); });
  timed("plan-memory", [&] { passes::run_passes(m, {"plan-memory"}); });
  const ir::Function& f = m.functions[0];
  std::vector<std::string> violations;
  timed("check plan", [&] { violations = passes::check_memory_plan(m, f); });
  EXPECT_EQ(violations, std::vector<std::string>{});
  constexpr int kGroup = ir::kMaxFusedDepth + 1;
  EXPECT_EQ(f.arena_bytes, int64_t{kGroup} * 64);
  int misgrouped = 0;
  for (int i = 0; i < kOps; ++i) misgrouped += f.ops[i].fused != ((kOps - 1 - i) % kGroup != 0);
  EXPECT_EQ(misgrouped, 0);
  EXPECT_EQ(f.ops.back().arena_offset, -1);  // the result
}

// A wide graph: %y is read by 25000 chains (a constant added, a softmax), whose results a
// chain of adds sums; as written, every chain comes before the sum. The greedy walk had
// 25000 ready ops at each step and refinement rescanned %y's 25000 readers per cone and
// costed every trial move over the whole order: 677 s in schedule. It now interleaves each
// chain with its add, the plan is sound, and the sum is 25000 softmaxes of -x (a constant
// added to every element leaves a softmax as it is).
TEST(Scale, WideGraphIsScheduledAndPlannedInSeconds) {
  constexpr int kChains = kOps / 4;
  std::string text = header() + "    %y = neg(%x) : f32[B,4]\n";
  for (int i = 0; i < kChains; ++i)
    text += fmt::format(
        "    %c{0} = constant() {{value = {0}.5}} : f32[B,4]\n"
        "    %a{0} = add(%y, %c{0}) : f32[B,4]\n"
        "    %b{0} = softmax(%a{0}) {{axis = 1}} : f32[B,4]\n",
        i);
  text += "    %s0 = add(%b0, %b1) : f32[B,4]\n";
  for (int i = 2; i < kChains; ++i)
    text += fmt::format("    %s{} = add(%s{}, %b{}) : f32[B,4]\n", i - 1, i - 2, i);
  text += fmt::format("    return %s{}\n  }}\n}}\n", kChains - 2);

  ir::Module m = ir::parse_and_verify(text, "wide.kir");
  const int64_t peak_as_written = passes::peak_live_bytes(m, m.functions[0]);
  timed("schedule", [&] { passes::run_passes(m, {"schedule"}); });
  timed("fuse-elem", [&] { passes::run_passes(m, {"fuse-elementwise"}); });
  timed("plan-memory", [&] { passes::run_passes(m, {"plan-memory"}); });
  const ir::Function& f = m.functions[0];
  std::vector<std::string> violations;
  timed("check plan", [&] { violations = passes::check_memory_plan(m, f); });
  EXPECT_EQ(violations, std::vector<std::string>{});
  EXPECT_TRUE(ir::verify(m).empty());  // still in dependency order, the marks within V12

  // Interleaved: %c<i>, %a<i>, %b<i>, then the add reading %b<i>, for every chain from 2 on.
  const std::vector<std::string> names = ir::value_names(f);
  ASSERT_EQ(f.ops.size(), size_t{1 + 3 * kChains + kChains - 1});
  EXPECT_EQ(names[f.ops[0].result], "%y");
  int out_of_place = 0;
  for (int i = 2; i < kChains; ++i) {
    const size_t at = 1 + 4 * static_cast<size_t>(i) - 1;  // %c<i>
    out_of_place += names[f.ops[at].result] != fmt::format("%c{}", i) ||
                    names[f.ops[at + 2].result] != fmt::format("%b{}", i) ||
                    names[f.ops[at + 3].result] != fmt::format("%s{}", i - 1);
  }
  EXPECT_EQ(out_of_place, 0);
  EXPECT_LT(passes::peak_live_bytes(m, f), peak_as_written / 1000);
  // The adds of the sum are fused 65 at a time (ir::kMaxFusedDepth + 1), as lowering
  // computes them: a group's %b and fused %s live until its root runs, with the root before
  // it and the chain in flight (its constant and add): 132 blocks.
  EXPECT_EQ(f.arena_bytes, int64_t{2 * (ir::kMaxFusedDepth + 1) + 2} * 64);

  std::vector<ir::Tensor> out;
  timed("interpret", [&] {
    out = ir::interpret(m, f, {}, {ir::Tensor::from_f32({1, 4}, {1, 2, 3, 4})});
  });
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].f.size(), 4u);
  const double z = std::exp(-1.0) + std::exp(-2.0) + std::exp(-3.0) + std::exp(-4.0);
  for (int j = 0; j < 4; ++j) {
    const double expected = kChains * std::exp(-(j + 1.0)) / z;
    EXPECT_NEAR(out[0].f[j], expected, expected * 1e-3) << j;
  }
}

// ---------------------------------------------------------------------------------------
// Absurd sizes: a clear error before any large allocation.

// A 64 GiB constant verifies (types may reach 2^48 bytes) but the interpreter refuses to
// allocate it, naming the op.
TEST(Scale, InterpreterRefusesHugeResults) {
  const ir::Module m = ir::parse_and_verify(R"(module @m {
  func @f(%x: f32[2]) -> (f32[4096,4096,1024]) {
    %c = constant() {value = 1.0} : f32[4096,4096,1024]
    return %c
  }
}
)",
                                            "huge.kir");
  EXPECT_EQ(
      testing::error_of(
          [&] { ir::interpret(m, m.functions[0], {}, {ir::Tensor::zeros(ir::DType::f32, {2})}); }),
      "line 3: function 'f', op 0 (%c = constant): its result f32[4096,4096,1024] of shape "
      "[4096,4096,1024] needs more than 4294967296 bytes, the interpreter's limit per tensor");
}

// Three live values of 2^39 bytes each need an arena above 2^40 bytes (1 TiB, the limit):
// plan-memory says so at compile time, naming the value that does not fit, instead of the
// compiled model failing to allocate its arena when it is created.
TEST(Scale, PlannerRefusesHugeArenas) {
  ir::Module m = ir::parse_and_verify(R"(module @m {
  func @f(%x: f32[137438953472]) -> (f32[137438953472]) {
    %a = exp(%x) : f32[137438953472]
    %b = sqrt(%x) : f32[137438953472]
    %c = neg(%x) : f32[137438953472]
    %d = add(%a, %b) : f32[137438953472]
    %e = add(%d, %c) : f32[137438953472]
    return %e
  }
}
)",
                                      "arena.kir");
  EXPECT_EQ(testing::error_of([&] { passes::run_passes(m, {"plan-memory"}); }),
            "line 5: function 'f': the arena would need more than 1099511627776 bytes at the "
            "symbols' maxima (%c (neg) of 549755813888 bytes at offset 1099511627776)");
}

}  // namespace
}  // namespace kiln
