// Tests of fuse-attention on the reference Transformer as the DSL emits it (no
// canonicalize first): how many attention ops it makes, with which operands and
// attributes, and that the interpreter computes the same outputs before and after.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/ir.h"
#include "passes/fuse_attention.h"
#include "tests/pass_harness.h"

namespace kiln {
namespace {

using testing::count_ops;
using testing::function;

// Tolerance on every output (logits, memory): the fused op multiplies by float(1/c)
// where the unfused graph divides by float(c), which may differ by 1 ulp in a score;
// the rest of the computation is the same, so differences stay far below this.
constexpr double kTolerance = 1e-5;

struct AttentionCounts {
  int attention = 0, softmax = 0, causal = 0, key_padded = 0;
};

AttentionCounts counts(const ir::Function& f) {
  AttentionCounts c;
  c.softmax = count_ops(f, ir::OpKind::softmax);
  for (const ir::Op& op : f.ops) {
    if (op.kind != ir::OpKind::attention) continue;
    ++c.attention;
    c.causal += op.int_attr("causal") == 1;
    c.key_padded += op.operands.size() == 4;
  }
  return c;
}

// Every attention op has heads = config heads and scale = 1/sqrt(d_model/heads).
void expect_attrs(const ir::Module& m) {
  const int64_t heads = std::stoll(m.config.at("heads"));
  const double dk = static_cast<double>(std::stoll(m.config.at("d_model")) / heads);
  for (const ir::Function& f : m.functions)
    for (const ir::Op& op : f.ops)
      if (op.kind == ir::OpKind::attention) {
        EXPECT_EQ(op.int_attr("heads"), heads) << f.name;
        EXPECT_NEAR(op.float_attr("scale"), 1.0 / std::sqrt(dk), 1e-12) << f.name;
      }
}

TEST(FuseAttention, TinyFusesEveryAttention) {
  ir::Module before = models::build_model("transformer", "tiny");
  ir::Module after = testing::after_passes(before, {"fuse-attention"});
  // forward: 2 encoder self (key padding), 2 decoder self (causal + key padding),
  // 2 cross (source key padding).
  AttentionCounts fwd = counts(function(after, "forward"));
  EXPECT_EQ(fwd.attention, 6);
  EXPECT_EQ(fwd.softmax, 0);
  EXPECT_EQ(fwd.causal, 2);
  EXPECT_EQ(fwd.key_padded, 6);
  AttentionCounts enc = counts(function(after, "encode"));
  EXPECT_EQ(enc.attention, 2);
  EXPECT_EQ(enc.softmax, 0);
  EXPECT_EQ(enc.causal, 0);
  EXPECT_EQ(enc.key_padded, 2);
  expect_attrs(after);
  // The head splits and merges went with the softmaxes: no rank-4 f32 value is left.
  for (const ir::Function& f : after.functions)
    for (const ir::Value& v : f.values)
      EXPECT_FALSE(v.type.rank() == 4 && v.type.dtype == ir::DType::f32) << f.name;
}

TEST(FuseAttention, TinyMatchesInterpreter) {
  ir::Module before = models::build_model("transformer", "tiny");
  ir::Module after = testing::after_passes(before, {"fuse-attention"});
  ASSERT_EQ(counts(function(after, "forward")).attention, 6);
  // Lengths 1, 7 and 33 (of max 40), with and without padding, batch 2.
  EXPECT_LE(testing::max_difference(before, after, {1, 7, 33}), kTolerance);
}

TEST(FuseAttention, SmallFusesAndMatchesInterpreter) {
  // small: 5 heads of 4, 1 encoder and 3 decoder layers, pad_id 1.
  ir::Module before = models::build_model("transformer", "small");
  ir::Module after = testing::after_passes(before, {"fuse-attention"});
  AttentionCounts fwd = counts(function(after, "forward"));
  EXPECT_EQ(fwd.attention, 7);
  EXPECT_EQ(fwd.softmax, 0);
  EXPECT_EQ(fwd.causal, 3);
  EXPECT_EQ(counts(function(after, "encode")).attention, 1);
  expect_attrs(after);
  EXPECT_LE(testing::max_difference(before, after, {1, 7, 33}), kTolerance);
}

TEST(FuseAttention, BaseCounts) {
  // Too big to interpret: only the op counts (6 encoder + 12 decoder attentions).
  ir::Module m = models::build_model("transformer", "base");
  ASSERT_EQ(counts(function(m, "forward")).softmax, 18);
  EXPECT_TRUE(passes::fuse_attention(m));
  AttentionCounts fwd = counts(function(m, "forward"));
  EXPECT_EQ(fwd.attention, 18);
  EXPECT_EQ(fwd.softmax, 0);
  EXPECT_EQ(fwd.causal, 6);
  EXPECT_EQ(counts(function(m, "encode")).attention, 6);
  expect_attrs(m);
}

TEST(FuseAttention, SecondRunChangesNothing) {
  ir::Module m = models::build_model("transformer", "tiny");
  EXPECT_TRUE(passes::fuse_attention(m));
  ir::Module once = m;
  EXPECT_FALSE(passes::fuse_attention(m));
  EXPECT_EQ(function(m, "forward").ops.size(), function(once, "forward").ops.size());
}

TEST(FuseAttention, LeavesSharedProbabilitiesAlone) {
  // Returning the first encoder layer's probabilities as an extra result blocks that
  // one fusion only; the other one in `encode` still fuses.
  ir::Module m = models::build_model("transformer", "tiny");
  ir::Function* f = m.find_function("encode");
  ASSERT_NE(f, nullptr);
  for (const ir::Op& op : f->ops)
    if (op.kind == ir::OpKind::softmax) {
      f->values[op.result].name = "probs";
      f->results.push_back(op.result);
      break;
    }
  EXPECT_TRUE(passes::fuse_attention(m));
  AttentionCounts enc = counts(*m.find_function("encode"));
  EXPECT_EQ(enc.attention, 1);
  EXPECT_EQ(enc.softmax, 1);
}

}  // namespace
}  // namespace kiln
