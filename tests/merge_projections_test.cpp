// Tests of merge-projections on the reference Transformer as the DSL emits it (after
// fuse-linear): how many merged linears it makes, which weights it declares, and that the
// interpreter computes the same outputs before and after (tiny, several lengths, with and
// without padding).
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/ir.h"
#include "passes/merge_projections.h"
#include "tests/pass_harness.h"

namespace kiln {
namespace {

using testing::count_ops;
using testing::function;

using testing::kFusionLengths;
using testing::kFusionTolerance;

using ir::OpKind;

// Linear ops whose result's last dim is `n` (merged ones are 2 or 3 times d_model wide).
int count_linears_of_width(const ir::Function& f, int64_t n) {
  int count = 0;
  for (const ir::Op& op : f.ops)
    count += op.kind == OpKind::linear && f.type(op.result).shape.back().is_const(n);
  return count;
}

ir::Module tiny() { return models::build_model("transformer", "tiny"); }

TEST(MergeProjections, TinyMergesEachAttentionBlock) {
  ir::Module before = testing::after_passes(tiny(), {"fuse-linear"});
  ir::Module after = testing::after_passes(before, {"merge-projections"});
  const int64_t d = 24;  // tiny d_model
  // forward: Q,K,V of 2 encoder and 2 decoder self-attentions, K,V of the memory in the 2
  // cross-attentions (one pair per layer, never all four of the memory together).
  const ir::Function& fwd = function(after, "forward");
  EXPECT_EQ(count_linears_of_width(fwd, 3 * d), 4);
  EXPECT_EQ(count_linears_of_width(fwd, 2 * d), 2);
  EXPECT_EQ(count_ops(fwd, OpKind::linear), 33 - 4 * 3 - 2 * 2 + 6);
  EXPECT_EQ(count_ops(fwd, OpKind::slice), 2 + 4 * 3 + 2 * 2);  // 2: the position tables
  const ir::Function& enc = function(after, "encode");
  EXPECT_EQ(count_linears_of_width(enc, 3 * d), 2);
  EXPECT_EQ(count_ops(enc, OpKind::linear), 12 - 2 * 3 + 2);

  // The original weights stay declared as they were; the merged ones are declared once
  // (encode reuses forward's encoder weights) with their derivations.
  for (const ir::Weight& w : before.weights) {
    const ir::Weight* kept = after.find_weight(w.name);
    ASSERT_NE(kept, nullptr) << w.name;
    EXPECT_EQ(kept->type, w.type) << w.name;
    EXPECT_FALSE(kept->derivation.has_value()) << w.name;
  }
  EXPECT_EQ(after.weights.size(), before.weights.size() + 2 * (2 + 2 + 2));
  const ir::Weight* qkv = after.find_weight("encoder.layers.1.self_attn.w_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  ASSERT_TRUE(qkv->derivation.has_value());
  EXPECT_EQ(qkv->derivation->op, "concat");
  EXPECT_EQ(qkv->derivation->inputs,
            (std::vector<std::string>{"encoder.layers.1.self_attn.w_q.weight",
                                      "encoder.layers.1.self_attn.w_k.weight",
                                      "encoder.layers.1.self_attn.w_v.weight"}));
  EXPECT_EQ(qkv->derivation->attrs, (ir::Attrs{{"axis", int64_t{0}}}));
  EXPECT_EQ(ir::to_string(qkv->type), "f32[72,24]");
  const ir::Weight* kv = after.find_weight("decoder.layers.0.cross_attn.w_kv.bias");
  ASSERT_NE(kv, nullptr);
  ASSERT_TRUE(kv->derivation.has_value());
  EXPECT_EQ(kv->derivation->inputs,
            (std::vector<std::string>{"decoder.layers.0.cross_attn.w_k.bias",
                                      "decoder.layers.0.cross_attn.w_v.bias"}));
  EXPECT_EQ(ir::to_string(kv->type), "f32[48]");
}

TEST(MergeProjections, TinyComputesTheSame) {
  ir::Module before = tiny();
  ir::Module after = testing::after_passes(before, {"fuse-linear", "merge-projections"});
  EXPECT_LE(testing::max_difference(before, after, kFusionLengths), kFusionTolerance);
}

TEST(MergeProjections, SecondRunChangesNothing) {
  ir::Module m = testing::after_passes(tiny(), {"fuse-linear", "merge-projections"});
  const size_t weights = m.weights.size();
  EXPECT_FALSE(passes::merge_projections(m));
  EXPECT_EQ(m.weights.size(), weights);
}

TEST(MergeProjections, WithoutLinearsChangesNothing) {
  ir::Module m = tiny();
  EXPECT_FALSE(passes::merge_projections(m));
}

TEST(MergeProjections, AllThreeComputeTheSame) {
  ir::Module before = tiny();
  ir::Module after =
      testing::after_passes(before, {"fuse-add-layernorm", "fuse-linear", "merge-projections"});
  const ir::Function& fwd = function(after, "forward");
  EXPECT_EQ(count_ops(fwd, OpKind::add_layernorm), 10);
  EXPECT_EQ(count_ops(fwd, OpKind::linear), 23);
  EXPECT_LE(testing::max_difference(before, after, kFusionLengths), kFusionTolerance);
}

}  // namespace
}  // namespace kiln
