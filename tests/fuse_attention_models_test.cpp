// Attention as today's models write it (issue 26), built with the nn blocks the way Hugging
// Face's PyTorch code writes it, each pattern in two spellings:
//   rotary     rotate_half by slices and cat (Llama), and the interleaved stack of GPT-J
//              (a reshape to [..., d/2, 2], slices, cat and a reshape back); tables from
//              positions with sin/cos, base and linear scaling configurable
//   GQA / MQA  repeat_kv by expand + reshape, and repeat_interleave by concat + reshape
//   bias       T5's relative position bias (bidirectional with key padding, shared by two
//              layers; unidirectional with the causal mask), ALiBi (slopes·(j - i), and
//              BLOOM's slopes·j [1,H,1,Lk] with key padding)
//   window     Mistral's sliding window (j > i or i - j >= W), GQA and rotary
//   soft-cap   Gemma 2's tanh(s / c)·c with rotary
// Each function must become, after the default pipeline, exactly one `attention` op per
// attention (with its kv_heads, bias, window and softcap), no matmul or softmax left and its
// projections linears; the pipeline's module in the interpreter must match the module as
// built (1e-4 of the output's scale), and the module compiled in process (tests/jit_model.h)
// must match the interpreter (1e-4: the kernel accumulates in f32 over a few dozen terms,
// about 1e-6 of the scale, while a wrong rotation, head group, bias or window moves outputs by
// ~1e-1), at lengths 1, 7 and 33, with and without padding.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/dsl.h"
#include "frontend/nn.h"
#include "ir/interpreter.h"
#include "ir/ir.h"
#include "jit_model.h"
#include "pass_harness.h"

namespace kiln {
namespace {

using dsl::Dim;
using dsl::DType;
using dsl::Tensor;

constexpr int64_t kHidden = 32, kVocab = 11, kPadId = 0;
constexpr double kTolerance = 1e-4;

// What one function must fuse into.
struct Expected {
  std::string function;
  int layers = 1;
  int64_t heads = 4, kv_heads = 4;
  bool causal = false, key_pad = false, bias = false;
  int64_t window = 0;
  double softcap = 0;
};

const std::vector<Expected> kExpected = {
    // name, layers, heads, kv_heads, causal, key_pad, bias, window, softcap
    {"rope_half_gqa_expand", 1, 4, 2, true, false, false, 0, 0},
    {"rope_interleaved_mqa_concat", 1, 4, 1, true, false, false, 0, 0},
    {"rope_scaled_softcap", 1, 4, 4, true, false, false, 0, 5.0},
    {"t5_encoder", 2, 4, 4, false, true, true, 0, 0},
    {"t5_decoder", 1, 4, 4, true, false, true, 0, 0},
    {"alibi", 1, 4, 4, true, false, true, 0, 0},
    {"alibi_bloom_gqa_concat", 1, 6, 3, true, true, true, 0, 0},
    {"sliding_window", 1, 4, 2, true, false, false, 3, 0},
    {"sliding_window_interleaved", 1, 4, 4, true, false, false, 5, 0},
};

// causal: bool [1,1,L,L], true where key j > query i.
Tensor causal(Tensor ids) { return nn::causal_mask(ids); }
// key padding: bool [B,1,1,L], true at pad_id.
Tensor key_padding(Tensor ids) {
  const Dim one = Dim::constant(1);
  return dsl::reshape(nn::padding_mask(ids, kPadId), {ids.dim(0), one, one, ids.dim(1)});
}

ir::Module build() {
  dsl::ModelBuilder mb("todays_attention");
  mb.set_config("pad_id", std::to_string(kPadId));
  const Dim B = mb.symbol("B", 3), S = mb.symbol("S", 40);
  for (const Expected& e : kExpected) {
    dsl::FunctionBuilder& f = mb.function(e.function);
    Tensor ids = f.input("ids", DType::i64, {B, S});
    Tensor x = nn::Embedding{e.function + ".embed_tokens", kVocab, kHidden}(ids);
    nn::GQAttention attn{.prefix = e.function + ".layers.0.self_attn",
                         .hidden = kHidden,
                         .heads = e.heads,
                         .kv_heads = e.kv_heads,
                         .head_dim = 8};
    Tensor y;
    const std::string& n = e.function;
    if (n == "rope_half_gqa_expand") {
      attn.rotary = true;
      y = attn(x, causal(ids));
    } else if (n == "rope_interleaved_mqa_concat") {
      attn.rotary = true;
      attn.rotary_style = nn::RotaryStyle::interleaved;
      attn.repeat = nn::RepeatKv::concat;
      attn.qkv_bias = true;
      y = attn(x, causal(ids));
    } else if (n == "rope_scaled_softcap") {
      attn.rotary = true;
      attn.rotary_base = 500000;
      attn.rotary_scaling = 4;
      attn.softcap = e.softcap;
      y = attn(x, causal(ids));
    } else if (n == "t5_encoder") {
      // T5: no scaling, one bias computed once and added in every layer.
      attn.scaling = 1;
      Tensor bias = nn::T5RelativeBias{.prefix = n + ".relative_attention_bias",
                                       .heads = e.heads,
                                       .buckets = 32,
                                       .max_distance = 100}(f, S, S);
      Tensor mask = key_padding(ids);
      Tensor h = dsl::add(x, attn(x, mask, bias));
      nn::GQAttention attn1 = attn;
      attn1.prefix = n + ".layers.1.self_attn";
      y = attn1(h, mask, bias);
    } else if (n == "t5_decoder") {
      attn.scaling = 1;
      Tensor bias = nn::T5RelativeBias{.prefix = n + ".relative_attention_bias",
                                       .heads = e.heads,
                                       .buckets = 32,
                                       .max_distance = 100,
                                       .bidirectional = false}(f, S, S);
      y = attn(x, causal(ids), bias);
    } else if (n == "alibi") {
      y = attn(x, causal(ids), nn::alibi_bias(f, e.heads, S, S));
    } else if (n == "alibi_bloom_gqa_concat") {
      attn.repeat = nn::RepeatKv::concat;
      y = attn(x, dsl::logical_or(causal(ids), key_padding(ids)),
               nn::alibi_bias(f, e.heads, S, S, /*relative=*/false));
    } else if (n == "sliding_window") {
      attn.rotary = true;
      y = attn(x, nn::sliding_window_mask(ids, e.window));
    } else {
      attn.rotary = true;
      attn.rotary_style = nn::RotaryStyle::interleaved;
      y = attn(x, nn::sliding_window_mask(ids, e.window));
    }
    f.output(y, "y");
  }
  return mb.finish();
}

// Function `e` after the default pipeline: one attention op per layer with e's attributes,
// no matmul or softmax, every projection a linear.
void expect_fused(const ir::Module& m, const Expected& e) {
  SCOPED_TRACE(e.function);
  const ir::Function& f = testing::function(m, e.function);
  EXPECT_EQ(testing::count_ops(f, ir::OpKind::softmax), 0);
  EXPECT_EQ(testing::count_ops(f, ir::OpKind::matmul), 0);
  ASSERT_EQ(testing::count_ops(f, ir::OpKind::attention), e.layers);
  // q, k and v merged into one linear by merge-projections, and o_proj.
  EXPECT_EQ(testing::count_ops(f, ir::OpKind::linear), 2 * e.layers);
  for (const ir::Op& op : f.ops) {
    if (op.kind != ir::OpKind::attention) continue;
    auto int_attr = [&](const char* name) { return op.has_attr(name) ? op.int_attr(name) : 0; };
    EXPECT_EQ(op.int_attr("heads"), e.heads);
    EXPECT_EQ(op.has_attr("kv_heads") ? op.int_attr("kv_heads") : e.heads, e.kv_heads);
    EXPECT_EQ(op.has_attr("kv_heads"), e.kv_heads != e.heads);
    EXPECT_EQ(int_attr("causal"), e.causal ? 1 : 0);
    EXPECT_EQ(int_attr("bias"), e.bias ? 1 : 0);
    EXPECT_EQ(int_attr("window"), e.window);
    EXPECT_EQ(op.has_attr("softcap") ? op.float_attr("softcap") : 0.0, e.softcap);
    EXPECT_EQ(op.operands.size(), 3u + e.key_pad + e.bias);
  }
}

double relative_error(const ir::Tensor& got, const ir::Tensor& want) {
  if (got.shape != want.shape || got.dtype != want.dtype) return INFINITY;
  double scale = 1.0, err = 0.0;
  for (float w : want.f) scale = std::max(scale, std::abs(static_cast<double>(w)));
  for (size_t i = 0; i < want.f.size(); ++i) {
    if (std::isnan(got.f[i]) || std::isnan(want.f[i])) return INFINITY;
    err = std::max(err, std::abs(static_cast<double>(got.f[i]) - want.f[i]));
  }
  return err / scale;
}

TEST(FuseAttentionModels, OneAttentionPerLayerMatchingInterpreterAndKernel) {
  const ir::Module m = build();
  const ir::WeightMap weights = testing::random_weights(m, 7);
  jit::JitModel model(m, weights, ::testing::TempDir() + "kiln_todays_attention.safetensors");
  const ir::Module& fused = model.module();
  for (const Expected& e : kExpected) expect_fused(fused, e);
  ir::WeightMap fused_weights = weights;  // with the merged projections' weights
  ir::materialize_weights(fused, fused_weights);

  double worst_fused = 0, worst_compiled = 0;
  uint32_t seed = 1;
  for (const Expected& e : kExpected) {
    const ir::Function& f = testing::function(m, e.function);
    const ir::Function& ff = testing::function(fused, e.function);
    for (int64_t length : {1, 7, 33})
      for (bool padding : {false, true}) {
        SCOPED_TRACE(e.function + " S=" + std::to_string(length) +
                     (padding ? " padded" : " unpadded"));
        const std::map<std::string, int64_t> sizes = {{"B", 3}, {"S", length}};
        const std::vector<ir::Tensor> inputs = testing::random_inputs(m, f, sizes, seed++, padding);
        const std::vector<ir::Tensor> want = ir::interpret(m, f, weights, inputs);
        const std::vector<ir::Tensor> fused_got = ir::interpret(fused, ff, fused_weights, inputs);
        const std::vector<ir::Tensor> got = model.run(e.function, inputs);
        ASSERT_EQ(want.size(), 1u);
        ASSERT_EQ(fused_got.size(), 1u);
        ASSERT_EQ(got.size(), 1u);
        const double fused_err = relative_error(fused_got[0], want[0]);
        EXPECT_LE(fused_err, kTolerance) << "fused module in the interpreter";
        const double err = relative_error(got[0], fused_got[0]);
        EXPECT_LE(err, kTolerance) << "compiled against the interpreter";
        worst_fused = std::max(worst_fused, fused_err);
        worst_compiled = std::max(worst_compiled, err);
      }
  }
  std::printf("[ todays attention ] max relative error: fused %.3g, compiled %.3g\n", worst_fused,
              worst_compiled);
}

}  // namespace
}  // namespace kiln
