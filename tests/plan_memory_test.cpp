// Tests of plan-memory: check_memory_plan proves the plans sound on the reference
// Transformer (tiny, small; as emitted and after the default pipeline) and on randomly
// generated graphs, and catches deliberately corrupted plans; the memory report; the base
// model's arena against the sum of its intermediates.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/ir.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/plan_memory.h"
#include "tests/pass_harness.h"
#include "tests/random_graph.h"

namespace kiln {
namespace {

using ir::OpKind;
using ir::TensorType;
using testing::kRandomGraphs;
using testing::random_module;

// Plans as lowered code reads memory: with fuse-elementwise's marks.
const std::vector<std::string> kScheduleAndPlan = {"schedule", "fuse-elementwise", "plan-memory"};

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

  // An offset whose end does not fit in 64 bits is outside too (it once wrapped to "sound").
  v = corrupted([&](ir::Function& f) {
    f.ops[first].arena_offset = std::numeric_limits<int64_t>::max() / 64 * 64;
  });
  EXPECT_TRUE(any_contains(v, "at offset 9223372036854775744 with ")) << joined(v);
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

// Pre-norm blocks: each add_layernorm_sum is written by its add_layernorm's kernel, so it is
// placed there, apart from the addends that kernel reads; the checker knows it too.
TEST(MemoryPlan, AddLayernormSumsArePlacedAtTheirAddLayernorm) {
  const ir::Module m = ir::parse_module(R"(module @prenorm {
  symbol B max 2
  symbol S max 4
  func @f(%x: f32[B,S,8], %a1: f32[B,S,8], %g: f32[8], %b: f32[8]) -> (f32[B,S,8]) {
    %h1 = add(%x, %a1) : f32[B,S,8]
    %n1 = layernorm(%h1, %g, %b) {eps = 1e-05} : f32[B,S,8]
    %a2 = mul(%n1, %n1) : f32[B,S,8]
    %h2 = add(%h1, %a2) : f32[B,S,8]
    %n2 = layernorm(%h2, %g, %b) {eps = 1e-05} : f32[B,S,8]
    %a3 = mul(%n2, %n2) : f32[B,S,8]
    %h3 = add(%h2, %a3) : f32[B,S,8]
    %out = layernorm(%h3, %g, %b) {eps = 1e-05} : f32[B,S,8]
    return %out
  }
}
)");
  const ir::Module planned = testing::after_passes(m, passes::default_pipeline());
  ASSERT_EQ(joined(violations(planned)), "");
  const ir::Function& f = planned.functions[0];
  int sums = 0;
  for (const ir::Op& op : f.ops) {
    if (op.kind != OpKind::add_layernorm_sum) continue;
    ++sums;
    // Its block meets neither the add_layernorm's result nor its addends.
    const ir::Op& norm = f.ops[static_cast<size_t>(f.defining_op(op.operands[0]))];
    for (ir::ValueId v : {norm.result, norm.operands[0], norm.operands[1]}) {
      const int d = f.defining_op(v);
      if (d >= 0 && f.ops[d].arena_offset >= 0)
        EXPECT_NE(f.ops[d].arena_offset, op.arena_offset) << ir::print_module(planned);
    }
  }
  EXPECT_EQ(sums, 2) << ir::print_module(planned);
  // Moved onto the other addend of its add_layernorm, a sum is caught: the kernel would
  // overwrite that addend while reading it.
  for (size_t i = 0; i < f.ops.size(); ++i) {
    if (f.ops[i].kind != OpKind::add_layernorm_sum) continue;
    ir::Module bad = planned;
    ir::Function& bf = bad.functions[0];
    const ir::Op& norm = bf.ops[static_cast<size_t>(bf.defining_op(bf.ops[i].operands[0]))];
    const int addend = bf.defining_op(norm.operands[1]);
    if (addend < 0 || bf.ops[addend].arena_offset < 0) continue;
    bf.ops[i].arena_offset = bf.ops[addend].arena_offset;
    const std::vector<std::string> v = passes::check_memory_plan(bad, bf);
    EXPECT_TRUE(any_contains(v, "while both are live")) << joined(v);
  }
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
  // the slice %s reads %a's memory at %y; in @fused %t is computed inside %y's kernel
  // (marked fused), which then reads %a. Both plans are reported, and a view with an offset too.
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
    %a = exp(%x) : f32[64] fused at 0
    %t = mul(%a, %z) : f32[64] fused at 0
    %b = neg(%z) : f32[64] fused at 256
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

}  // namespace
}  // namespace kiln
