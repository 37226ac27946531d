// Tests of fuse-add-layernorm on the reference Transformer as the DSL emits it: how many
// add_layernorm ops it makes (tiny and base), and that the interpreter computes the same
// outputs before and after (tiny, several lengths, with and without padding).
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/ir.h"
#include "passes/fuse_add_layernorm.h"
#include "tests/pass_harness.h"

namespace kiln {
namespace {

using testing::count_ops;
using testing::function;

using testing::kFusionLengths;
using testing::kFusionTolerance;

using ir::OpKind;

ir::Module tiny() { return models::build_model("transformer", "tiny"); }

TEST(FuseAddLayerNorm, TinyFusesEveryResidualNorm) {
  ir::Module after = testing::after_passes(tiny(), {"fuse-add-layernorm"});
  // forward: 2 norms per encoder layer, 3 per decoder layer; the final encoder and
  // decoder norms (whose input is a norm, not an add) stay layernorm.
  const ir::Function& fwd = function(after, "forward");
  EXPECT_EQ(count_ops(fwd, OpKind::add_layernorm), 2 * 2 + 2 * 3);
  EXPECT_EQ(count_ops(fwd, OpKind::layernorm), 2);
  const ir::Function& enc = function(after, "encode");
  EXPECT_EQ(count_ops(enc, OpKind::add_layernorm), 2 * 2);
  EXPECT_EQ(count_ops(enc, OpKind::layernorm), 1);
}

TEST(FuseAddLayerNorm, TinyComputesTheSame) {
  ir::Module before = tiny();
  ir::Module after = testing::after_passes(before, {"fuse-add-layernorm"});
  EXPECT_LE(testing::max_difference(before, after, kFusionLengths), kFusionTolerance);
}

TEST(FuseAddLayerNorm, BaseCounts) {
  ir::Module after =
      testing::after_passes(models::build_model("transformer", "base"), {"fuse-add-layernorm"});
  const ir::Function& fwd = function(after, "forward");
  EXPECT_EQ(count_ops(fwd, OpKind::add_layernorm), 6 * 2 + 6 * 3);
  EXPECT_EQ(count_ops(fwd, OpKind::layernorm), 2);
}

}  // namespace
}  // namespace kiln
