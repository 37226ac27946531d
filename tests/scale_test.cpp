// Bounded costs (issue 10): graphs of 10^5 ops go through parse, verify, the default
// pipeline, the memory plan's checker and the interpreter in seconds, with no recursion
// deep enough to overflow the stack and nothing quadratic in the number of ops.
#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"

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

// 10^5 neg ops in a row: every one is read once by the next, so every one may be fused into
// its reader's kernel (the planner's and its checker's liveness follow the whole chain).
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

// Three live values of 2^47 bytes each need an arena above 2^48 bytes: plan-memory says so
// instead of overflowing offsets.
TEST(Scale, PlannerRefusesHugeArenas) {
  ir::Module m = ir::parse_and_verify(R"(module @m {
  func @f(%x: f32[35184372088832]) -> (f32[35184372088832]) {
    %a = exp(%x) : f32[35184372088832]
    %b = sqrt(%x) : f32[35184372088832]
    %c = neg(%x) : f32[35184372088832]
    %d = add(%a, %b) : f32[35184372088832]
    %e = add(%d, %c) : f32[35184372088832]
    return %e
  }
}
)",
                                      "arena.kir");
  EXPECT_EQ(testing::error_of([&] { passes::run_passes(m, {"plan-memory"}); }),
            "line 5: function 'f': the arena would need more than 281474976710656 bytes at the "
            "symbols' maxima (%c (neg) of 140737488355328 bytes at offset 281474976710656)");
}

}  // namespace
}  // namespace kiln
