// Tests of fuse-linear on the reference Transformer as the DSL emits it: how many linear
// ops it makes (tiny and base), and that the interpreter computes the same outputs before
// and after (tiny, several lengths, with and without padding).
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/ir.h"
#include "passes/fuse_linear.h"
#include "tests/pass_harness.h"

namespace kiln {
namespace {

using testing::count_ops;
using testing::function;

using testing::kFusionLengths;
using testing::kFusionTolerance;

using ir::OpKind;

// Linear ops with act = `act`.
int count_linears(const ir::Function& f, const std::string& act) {
  int n = 0;
  for (const ir::Op& op : f.ops) n += op.kind == OpKind::linear && op.str_attr("act") == act;
  return n;
}

ir::Module tiny() { return models::build_model("transformer", "tiny"); }

TEST(FuseLinear, TinyTurnsEveryLinearIntoOneOp) {
  ir::Module after = testing::after_passes(tiny(), {"fuse-linear"});
  // forward: encoder 2 x (4 attention + 2 ffn), decoder 2 x (8 attention + 2 ffn), and
  // the generator: 12 + 20 + 1; the ffn w_1 of each of the 4 layers absorbs its relu.
  const ir::Function& fwd = function(after, "forward");
  EXPECT_EQ(count_ops(fwd, OpKind::linear), 33);
  EXPECT_EQ(count_linears(fwd, "relu"), 4);
  EXPECT_EQ(count_ops(fwd, OpKind::relu), 0);
  // Attention's Q·Kᵀ and P·V (2 per attention, 6 attentions) stay matmuls.
  EXPECT_EQ(count_ops(fwd, OpKind::matmul), 12);
  // Every linear has its bias.
  for (const ir::Op& op : fwd.ops)
    if (op.kind == OpKind::linear) EXPECT_EQ(op.operands.size(), 3u);
  // encode: the encoder alone.
  const ir::Function& enc = function(after, "encode");
  EXPECT_EQ(count_ops(enc, OpKind::linear), 12);
  EXPECT_EQ(count_linears(enc, "relu"), 2);
  EXPECT_EQ(count_ops(enc, OpKind::relu), 0);
  EXPECT_EQ(count_ops(enc, OpKind::matmul), 4);
}

TEST(FuseLinear, TinyComputesTheSame) {
  ir::Module before = tiny();
  ir::Module after = testing::after_passes(before, {"fuse-linear"});
  EXPECT_LE(testing::max_difference(before, after, kFusionLengths), kFusionTolerance);
}

TEST(FuseLinear, SecondRunChangesNothing) {
  ir::Module m = testing::after_passes(tiny(), {"fuse-linear"});
  EXPECT_FALSE(passes::fuse_linear(m));
}

TEST(FuseLinear, BaseCounts) {
  ir::Module after =
      testing::after_passes(models::build_model("transformer", "base"), {"fuse-linear"});
  // 6 encoder layers x 6 + 6 decoder layers x 10 + the generator.
  const ir::Function& fwd = function(after, "forward");
  EXPECT_EQ(count_ops(fwd, OpKind::linear), 97);
  EXPECT_EQ(count_linears(fwd, "relu"), 12);
  EXPECT_EQ(count_ops(fwd, OpKind::relu), 0);
}

}  // namespace
}  // namespace kiln
