// Tests of fuse-elementwise: which ops of the reference Transformer it marks (each mark
// honours verifier V12, and the marks round-trip through the text form), that the
// interpreter computes the same outputs with and without the marks (tiny, and random graphs
// through the default pipeline), and that a second run changes nothing.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/ir.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/fuse_elementwise.h"
#include "passes/pipeline.h"
#include "tests/pass_harness.h"
#include "tests/random_graph.h"

namespace kiln {
namespace {

using ir::OpKind;
using testing::function;

ir::Module tiny() { return models::build_model("transformer", "tiny"); }

// The default pipeline without fuse-elementwise (and so without its marks).
std::vector<std::string> pipeline_without_marks() {
  std::vector<std::string> names;
  for (const std::string& p : passes::default_pipeline())
    if (p != "fuse-elementwise") names.push_back(p);
  return names;
}

int count_fused(const ir::Function& f) {
  int n = 0;
  for (const ir::Op& op : f.ops) n += op.fused;
  return n;
}

TEST(FuseElementwise, MarksTinysChainsAndTheyRoundTrip) {
  ir::Module m = testing::after_passes(tiny(), passes::default_pipeline());
  const ir::Function& fwd = function(m, "forward");
  // Both embeddings' gather and scale (the scale's constant shared: computed in both
  // kernels), which the position add computes, and the pad id compared with the ids.
  EXPECT_EQ(count_fused(fwd), 6) << ir::print_module(m);
  int gathers = 0;
  for (const ir::Op& op : fwd.ops) gathers += op.fused && op.kind == OpKind::gather;
  EXPECT_EQ(gathers, 2);
  for (const ir::Op& op : fwd.ops)
    if (op.fused) EXPECT_TRUE(ir::is_elementwise_fusable(op.kind)) << ir::op_name(op.kind);
  EXPECT_TRUE(ir::verify(m).empty());
  const std::string text = ir::print_module(m);
  EXPECT_NE(text.find(" fused at "), std::string::npos);
  EXPECT_EQ(ir::print_module(ir::parse_module(text)), text);
}

TEST(FuseElementwise, SecondRunChangesNothing) {
  ir::Module m = testing::after_passes(tiny(), passes::default_pipeline());
  EXPECT_FALSE(passes::fuse_elementwise(m));
  // And a module without marks gets them.
  ir::Module unmarked = testing::after_passes(tiny(), pipeline_without_marks());
  EXPECT_EQ(count_fused(function(unmarked, "forward")), 0);
  EXPECT_TRUE(passes::fuse_elementwise(unmarked));
}

TEST(FuseElementwise, TinyComputesTheSame) {
  ir::Module before = testing::after_passes(tiny(), pipeline_without_marks());
  ir::Module after = testing::after_passes(before, {"fuse-elementwise"});
  EXPECT_LE(testing::max_difference(before, after, testing::kFusionLengths),
            testing::kFusionTolerance);
}

TEST(FuseElementwise, RandomGraphsComputeTheSameAndVerify) {
  int fused = 0;
  for (uint32_t seed = 0; seed < 40; ++seed) {
    const ir::Module input = testing::random_module(seed, /*general=*/seed % 2 == 1);
    ir::Module before = testing::after_passes(input, pipeline_without_marks());
    ir::Module after = testing::after_passes(before, {"fuse-elementwise"});
    EXPECT_TRUE(ir::verify(after).empty()) << "seed " << seed;
    fused += count_fused(after.functions[0]);
    EXPECT_LE(testing::max_difference(before, after, {1, 5}), testing::kFusionTolerance)
        << "seed " << seed;
  }
  EXPECT_GT(fused, 20);
}

}  // namespace
}  // namespace kiln
