// Tests of fuse-add-layernorm on the reference Transformer as the DSL emits it: how many
// add_layernorm ops it makes (tiny and base), and that the interpreter computes the same
// outputs before and after (tiny, several lengths, with and without padding); and on
// blocks whose LayerNorm is the Annotated Transformer's variant (unbiased std, eps outside
// the root, parameters alpha and beta), post-norm and pre-norm.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/dsl.h"
#include "frontend/models.h"
#include "frontend/nn.h"
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

// One encoder layer of width 16 built with the Annotated Transformer's LayerNorm,
//   post-norm: x = norm1(x + self_attn(x)); x = norm2(x + ffn(x)); norm(x)
//   pre-norm:  x = x + self_attn(norm1(x)); x = x + ffn(norm2(x)); norm(x)
ir::Module variant_block(bool pre_norm) {
  dsl::ModelBuilder mb("annotated");
  const dsl::Dim B = mb.symbol("B", 2), S = mb.symbol("S", 33);
  dsl::FunctionBuilder& f = mb.function("encode");
  dsl::Tensor x = f.input("x", dsl::DType::f32, {B, S, dsl::Dim::constant(16)});
  auto norm = [](const std::string& prefix) {
    return nn::LayerNorm{prefix,  16,    1e-6, /*unbiased=*/true, /*eps_outside=*/true,
                         "alpha", "beta"};
  };
  nn::MultiHeadAttention attn{"layers.0.self_attn", 16, 2};
  nn::FeedForward ffn{"layers.0.feed_forward", 16, 32};
  if (pre_norm) {
    dsl::Tensor h = norm("layers.0.sublayer.0.norm")(x);
    x = x + attn(h, h, {});
    x = x + ffn(norm("layers.0.sublayer.1.norm")(x));
  } else {
    x = norm("layers.0.sublayer.0.norm")(x + attn(x, x, {}));
    x = norm("layers.0.sublayer.1.norm")(x + ffn(x));
  }
  f.output(norm("norm")(x), "memory");
  return mb.finish();
}

// Every layernorm and add_layernorm of `f` is the variant: unbiased = 1, eps_outside = 1.
void expect_variant(const ir::Function& f) {
  for (const ir::Op& op : f.ops) {
    if (op.kind != OpKind::layernorm && op.kind != OpKind::add_layernorm) continue;
    EXPECT_TRUE(op.has_attr("unbiased") && op.int_attr("unbiased") == 1) << ir::op_name(op.kind);
    EXPECT_TRUE(op.has_attr("eps_outside") && op.int_attr("eps_outside") == 1)
        << ir::op_name(op.kind);
    EXPECT_EQ(op.float_attr("eps"), 1e-6);
  }
}

TEST(FuseAddLayerNorm, PostNormVariantFuses) {
  const ir::Module before = variant_block(/*pre_norm=*/false);
  const int adds = count_ops(function(before, "encode"), OpKind::add);
  EXPECT_EQ(count_ops(function(before, "encode"), OpKind::layernorm), 3);
  ir::Module after = testing::after_passes(before, {"fuse-add-layernorm"});
  // Both residual norms absorb their add (the linears' bias adds stay); the final norm (of
  // a norm) stays layernorm.
  const ir::Function& enc = function(after, "encode");
  EXPECT_EQ(count_ops(enc, OpKind::add_layernorm), 2);
  EXPECT_EQ(count_ops(enc, OpKind::layernorm), 1);
  EXPECT_EQ(count_ops(enc, OpKind::add), adds - 2);
  expect_variant(enc);
  EXPECT_LE(testing::max_difference(before, after, kFusionLengths), kFusionTolerance);
  // The parameters are bound by the Annotated Transformer's names.
  EXPECT_NE(after.find_weight("layers.0.sublayer.0.norm.alpha"), nullptr);
  EXPECT_NE(after.find_weight("layers.0.sublayer.1.norm.beta"), nullptr);
  EXPECT_EQ(after.find_weight("norm.weight"), nullptr);
}

TEST(FuseAddLayerNorm, PreNormVariantFusesWithItsSum) {
  const ir::Module before = variant_block(/*pre_norm=*/true);
  const int adds = count_ops(function(before, "encode"), OpKind::add);
  ir::Module after = testing::after_passes(before, {"fuse-add-layernorm"});
  // norm1 reads the input (no add); norm2 absorbs x + attn, whose sum is also the next
  // residual; the final norm absorbs the last residual add.
  const ir::Function& enc = function(after, "encode");
  EXPECT_EQ(count_ops(enc, OpKind::add_layernorm), 2);
  EXPECT_EQ(count_ops(enc, OpKind::add_layernorm_sum), 1);
  EXPECT_EQ(count_ops(enc, OpKind::layernorm), 1);
  EXPECT_EQ(count_ops(enc, OpKind::add), adds - 2);
  expect_variant(enc);
  EXPECT_LE(testing::max_difference(before, after, kFusionLengths), kFusionTolerance);
}

}  // namespace
}  // namespace kiln
