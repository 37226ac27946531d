// Tests of schedule: it keeps the outputs bit for bit (tiny and random graphs), never raises
// the peak of live bytes, places sources right before their first user, is deterministic,
// keeps op locations with their ops, and drops a memory plan only when the order changes.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/ir.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/plan_memory.h"
#include "passes/schedule.h"
#include "tests/pass_harness.h"
#include "tests/random_graph.h"

namespace kiln {
namespace {

using ir::OpKind;
using testing::kRandomGraphs;
using testing::random_module;

ir::Module tiny() { return models::build_model("transformer", "tiny"); }
ir::Module small() { return models::build_model("transformer", "small"); }

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
  for (const char* name : {"forward", "encode"})
    EXPECT_LT(passes::peak_live_bytes(scheduled, *scheduled.find_function(name)),
              passes::peak_live_bytes(t, *t.find_function(name)))
        << name;
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
