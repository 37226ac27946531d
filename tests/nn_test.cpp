// nn building blocks: misuse reported up front at the user's line with the module path,
// the state_dict names of the new blocks, and what the blocks compute (interpreter).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "frontend/dsl.h"
#include "frontend/nn.h"
#include "ir/interpreter.h"
#include "support/error.h"

namespace kiln {
namespace {

using dsl::Dim;
using dsl::DType;
using kiln::testing::error_of;
using ::testing::HasSubstr;

// A function with x f32[B,S,width] and ids i64[B,S] to apply blocks to.
struct Fixture {
  dsl::ModelBuilder mb{"toy"};
  Dim B = mb.symbol("B", 4), S = mb.symbol("S", 16);
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor ids = f.input("ids", DType::i64, {B, S});
  dsl::Tensor x;
  explicit Fixture(int64_t width) : x(f.input("x", DType::f32, {B, S, Dim::constant(width)})) {}
};

// "dsl error at nn_test.cpp:LINE in 'SCOPE' (function 'forward'): " for a misuse on LINE.
std::string at(int line, const std::string& scope) {
  return "dsl error at nn_test.cpp:" + std::to_string(line) + " in '" + scope +
         "' (function 'forward'): ";
}

TEST(NnMisuse, ZeroOrNegativeHeadsNameTheBlockAndTheUserLine) {
  int line = 0;
  std::string msg = error_of([&] {
    Fixture t(64);
    line = __LINE__ + 1;
    nn::EncoderBlock{"encoder.layers.0", 64, 0, 128}(t.x, {});
  });
  EXPECT_EQ(msg,
            at(line, "encoder.layers.0.self_attn") + "heads = 0, expected a positive head count");
  msg = error_of([&] {
    Fixture t(64);
    line = __LINE__ + 1;
    nn::MultiHeadAttention{"attn", 64, -2}(t.x, t.x, {});
  });
  EXPECT_EQ(msg, at(line, "attn") + "heads = -2, expected a positive head count");
}

TEST(NnMisuse, GroupedQueryAttentionConfiguration) {
  int line = 0;
  std::string msg = error_of([&] {
    Fixture t(32);
    line = __LINE__ + 1;
    nn::GQAttention{.prefix = "layers.0.self_attn", .hidden = 32, .heads = 4, .kv_heads = 3}(t.x,
                                                                                             {});
  });
  EXPECT_EQ(msg, at(line, "layers.0.self_attn") + "kv_heads = 3 does not divide heads = 4");
  msg = error_of([&] {
    Fixture t(32);
    line = __LINE__ + 1;
    nn::Rotary{.head_dim = 5}.tables(t.f, t.S);
  });
  EXPECT_EQ(msg, at(line, "rotary") + "head_dim = 5, expected a positive even size");
}

// The rotary embedding in both conventions against the rotation it is: head_dim 4, base
// 10000 (inv_freq 1 and 0.01), positions 0..3. rotate_half pairs dims (0, 2) and (1, 3),
// the interleaved form (0, 1) and (2, 3); each pair (a, b) at angle t·f becomes
// (a cos - b sin, b cos + a sin). Linear scaling 2 halves the angles.
TEST(NnValues, RotaryBothConventions) {
  for (const nn::RotaryStyle style : {nn::RotaryStyle::half, nn::RotaryStyle::interleaved})
    for (const double scaling : {1.0, 2.0}) {
      dsl::ModelBuilder mb("rope");
      const Dim S = mb.symbol("S", 8);
      dsl::FunctionBuilder& f = mb.function("forward");
      dsl::Tensor x =
          f.input("x", DType::f32, {Dim::constant(1), Dim::constant(1), S, Dim::constant(4)});
      const nn::Rotary rope{.head_dim = 4, .scaling = scaling, .style = style};
      auto [cos, sin] = rope.tables(f, S);
      f.output(rope(x, cos, sin), "y");
      const ir::Module m = mb.finish();
      std::vector<float> xs;
      for (int i = 0; i < 16; ++i) xs.push_back(0.25f * static_cast<float>(i) - 1.5f);
      const ir::Tensor in = ir::Tensor::from_f32({1, 1, 4, 4}, xs);
      const ir::Tensor y = ir::interpret(m, m.functions[0], {}, {in})[0];
      const bool half = style == nn::RotaryStyle::half;
      for (int t = 0; t < 4; ++t)
        for (int pair = 0; pair < 2; ++pair) {
          const int i0 = half ? pair : 2 * pair, i1 = half ? pair + 2 : 2 * pair + 1;
          const double angle = t / scaling * (pair == 0 ? 1.0 : 0.01);
          const double a = xs[static_cast<size_t>(t * 4 + i0)],
                       b = xs[static_cast<size_t>(t * 4 + i1)];
          EXPECT_NEAR(y.f[static_cast<size_t>(t * 4 + i0)],
                      a * std::cos(angle) - b * std::sin(angle), 1e-5)
              << "t " << t << " pair " << pair << (half ? " half" : " interleaved");
          EXPECT_NEAR(y.f[static_cast<size_t>(t * 4 + i1)],
                      b * std::cos(angle) + a * std::sin(angle), 1e-5)
              << "t " << t << " pair " << pair << (half ? " half" : " interleaved");
        }
    }
}

// Hugging Face's T5Attention._relative_position_bucket, in float as torch computes it.
int64_t t5_bucket(int64_t rp, bool bidirectional, int64_t nb, int64_t max_distance) {
  int64_t ret = 0;
  if (bidirectional) {
    nb /= 2;
    ret += rp > 0 ? nb : 0;
    rp = rp < 0 ? -rp : rp;
  } else {
    rp = rp < 0 ? -rp : 0;
  }
  const int64_t max_exact = nb / 2;
  if (rp < max_exact) return ret + rp;
  const float large = std::log(static_cast<float>(rp) / static_cast<float>(max_exact)) /
                      static_cast<float>(std::log(static_cast<double>(max_distance) / max_exact)) *
                      static_cast<float>(nb - max_exact);
  return ret + std::min(max_exact + static_cast<int64_t>(large), nb - 1);
}

// T5's relative position bias reads relative_attention_bias.weight [buckets, heads] at the
// bucket of j - i as Hugging Face computes it (bidirectional and not), as [1, H, Lq, Lk]:
// with weight[bucket, h] = 100·bucket + h the result spells the bucket out.
TEST(NnValues, T5RelativePositionBuckets) {
  for (const bool bidirectional : {true, false}) {
    dsl::ModelBuilder mb("t5");
    const Dim S = mb.symbol("S", 64);
    dsl::FunctionBuilder& f = mb.function("forward");
    dsl::Tensor ids = f.input("ids", DType::i64, {Dim::constant(1), S});
    (void)ids;
    const nn::T5RelativeBias rel{.prefix = "block.0.layer.0.SelfAttention.relative_attention_bias",
                                 .heads = 2,
                                 .buckets = 32,
                                 .max_distance = 100,
                                 .bidirectional = bidirectional};
    f.output(rel(f, S, S), "bias");
    const ir::Module m = mb.finish();
    std::vector<float> w;
    for (int bucket = 0; bucket < 32; ++bucket)
      for (int h = 0; h < 2; ++h)
        w.push_back(100.0f * static_cast<float>(bucket) + static_cast<float>(h));
    const ir::WeightMap weights = {{rel.prefix + ".weight", ir::Tensor::from_f32({32, 2}, w)}};
    const int64_t L = 60;
    const ir::Tensor out =
        ir::interpret(m, m.functions[0], weights,
                      {ir::Tensor::from_ints(DType::i64, {1, L}, std::vector<int64_t>(L, 1))})[0];
    ASSERT_EQ(out.shape, (std::vector<int64_t>{1, 2, L, L}));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < L; ++j)
          ASSERT_EQ(out.f[static_cast<size_t>((h * L + i) * L + j)],
                    100.0f * static_cast<float>(t5_bucket(j - i, bidirectional, 32, 100)) +
                        static_cast<float>(h))
              << "h " << h << " i " << i << " j " << j << (bidirectional ? " bidirectional" : "");
  }
}

// ALiBi slopes as Hugging Face's build_alibi_tensor computes them: 2^(-8(h+1)/n) for n a
// power of two; for 6 heads the 4 of 2^(-2(h+1)) and then 2^-1, 2^-3.
TEST(NnValues, AlibiSlopes) {
  for (const auto& [heads, want] : std::vector<std::pair<int64_t, std::vector<double>>>{
           {8, {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625}},
           {6, {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125}},
           {1, {0.00390625}}}) {
    dsl::ModelBuilder mb("alibi");
    const Dim S = mb.symbol("S", 8);
    dsl::FunctionBuilder& f = mb.function("forward");
    dsl::Tensor ids = f.input("ids", DType::i64, {Dim::constant(1), S});
    (void)ids;
    f.output(nn::alibi_slopes(f, heads), "slopes");
    f.output(nn::alibi_bias(f, heads, S, S), "bias");
    const ir::Module m = mb.finish();
    const std::vector<ir::Tensor> out = ir::interpret(
        m, m.functions[0], {}, {ir::Tensor::from_ints(DType::i64, {1, 3}, {1, 1, 1})});
    ASSERT_EQ(out[0].f.size(), want.size());
    for (size_t h = 0; h < want.size(); ++h) {
      EXPECT_NEAR(out[0].f[h], want[h], 1e-6 * want[h]) << heads << " heads, head " << h;
      // bias[0, h, i, j] = slope·(j - i): row 2, key 0 is -2·slope.
      EXPECT_NEAR(out[1].f[(h * 3 + 2) * 3 + 0], -2 * want[h], 1e-6) << heads << " heads";
    }
  }
}

TEST(NnMisuse, HeadsNotDividingDModel) {
  int line = 0;
  std::string msg = error_of([&] {
    Fixture t(64);
    dsl::ScopeGuard scope(t.f, "encoder");
    line = __LINE__ + 1;
    nn::EncoderBlock{"encoder.layers.1", 64, 5, 128, /*pre_norm=*/true}(t.x, {});
  });
  EXPECT_EQ(msg, at(line, "encoder.layers.1.self_attn") + "heads = 5 does not divide d_model = 64");
  msg = error_of([&] {
    Fixture t(64);
    dsl::Tensor memory = t.x;
    line = __LINE__ + 1;
    nn::DecoderBlock{"decoder.layers.0", 64, 7, 128}(t.x, memory, {}, {});
  });
  EXPECT_EQ(msg, at(line, "decoder.layers.0.self_attn") + "heads = 7 does not divide d_model = 64");
}

TEST(NnMisuse, MismatchedDims) {
  int line = 0;
  std::string msg = error_of([&] {
    Fixture t(64);
    line = __LINE__ + 1;
    nn::Linear{"classifier", 32, 3}(t.x);
  });
  EXPECT_EQ(msg, at(line, "classifier") + "input is f32[B,S,64], expected a last dim of in = 32");
  msg = error_of([&] {
    Fixture t(48);
    line = __LINE__ + 1;
    nn::EncoderBlock{"layers.0", 64, 4, 128}(t.x, {});
  });
  EXPECT_EQ(msg,
            at(line, "layers.0") + "input is f32[B,S,48], expected a last dim of d_model = 64");
  msg = error_of([&] {
    Fixture t(64);
    line = __LINE__ + 1;
    nn::FeedForward{"ffn", 64, 0}(t.x);
  });
  EXPECT_EQ(msg, at(line, "ffn") + "d_ff = 0, expected a positive size");
  msg = error_of([&] {
    Fixture t(64);
    line = __LINE__ + 1;
    nn::PositionEmbedding{"pos_emb", 8, 64}(t.x);
  });
  EXPECT_EQ(msg, at(line, "pos_emb") + "input length S may be up to 16, above max_len = 8");
  msg = error_of([&] {
    Fixture t(64);
    line = __LINE__ + 1;
    nn::Embedding{"tok_emb", 50, 32}.tied_projection(t.x);
  });
  EXPECT_EQ(msg,
            at(line, "tok_emb") +
                "input of the tied projection is f32[B,S,64], expected a last dim of dim = 32");
  msg = error_of([&] {
    Fixture t(64);
    line = __LINE__ + 1;
    nn::EncoderBlock{"layers.0", 64, 4, 128}(t.x, nn::padding_mask(t.ids, 0));
  });
  EXPECT_EQ(msg, at(line, "layers.0") +
                     "mask is bool[B,S], expected bool of rank 4 broadcasting to the scores "
                     "[B, heads, Lq, Lk]");
}

TEST(NnMisuse, PoolingMaskMustMatchTheInput) {
  int line = 0;
  std::string msg = error_of([&] {
    Fixture t(8);
    dsl::Tensor other = t.f.input("other", DType::i64, {t.B, t.B});
    line = __LINE__ + 1;
    nn::mean_pool(t.x, nn::padding_mask(other, 0));
  });
  EXPECT_THAT(msg, HasSubstr("dsl error at nn_test.cpp:" + std::to_string(line) +
                             " (function 'forward'): mean_pool: padding mask is bool[B,B], "
                             "expected bool[B,S] (true at padding)"));
}

// A shape error that only an op inside a block finds (a mask that does not broadcast to the
// scores) is reported at the user's line too, not in nn.cpp.
TEST(NnMisuse, OpErrorsInsideABlockPointAtTheUserLine) {
  int line = 0;
  std::string msg = error_of([&] {
    Fixture t(16);
    Dim T = t.mb.symbol("T", 16);
    dsl::Tensor other = t.f.input("other", DType::i64, {t.B, T});
    line = __LINE__ + 1;
    nn::EncoderBlock{"layers.3", 16, 2, 32}(t.x, nn::key_padding_mask(other, 0));
  });
  EXPECT_THAT(msg, HasSubstr(at(line, "layers.3.self_attn") + "select(bool[B,1,1,T]"));
}

// The DSL's operators report a misuse at the user's expression, not in dsl.cpp.
TEST(NnMisuse, OperatorsReportTheUserLine) {
  int line = 0;
  std::string msg = error_of([&] {
    Fixture t(8);
    dsl::Tensor y = t.f.input("y", DType::f32, {t.B, t.S, Dim::constant(6)});
    line = __LINE__ + 1;
    dsl::Tensor z = 1.0 - t.x * 2.0 + y;
  });
  EXPECT_EQ(msg, "dsl error at nn_test.cpp:" + std::to_string(line) +
                     " (function 'forward'): add(f32[B,S,8], f32[B,S,6]): operand shapes "
                     "[B,S,8] and [B,S,6] do not broadcast");
  msg = error_of([&] {
    line = __LINE__ + 1;
    -dsl::Tensor() + 1.0;
  });
  EXPECT_EQ(msg, "dsl error at nn_test.cpp:" + std::to_string(line) +
                     ": neg: operand is an empty tensor");
}

// The unbiased variance of one feature divides by D - 1 = 0: an error at the user's line,
// from nn::LayerNorm (its configuration) and from dsl::layernorm (the op's type rule), never
// a model that computes NaN.
TEST(NnMisuse, UnbiasedLayerNormOfOneFeature) {
  int line = 0;
  std::string msg = error_of([&] {
    Fixture t(1);
    line = __LINE__ + 1;
    nn::LayerNorm{"norm", 1, 1e-6, /*unbiased=*/true, /*eps_outside=*/true, "alpha", "beta"}(t.x);
  });
  EXPECT_EQ(msg, at(line, "norm") +
                     "dim = 1 with unbiased variance divides by dim - 1 = 0, "
                     "expected dim >= 2");
  msg = error_of([&] {
    Fixture t(1);
    dsl::Tensor g = t.f.weight("g", {1}), b = t.f.weight("b", {1});
    line = __LINE__ + 1;
    dsl::layernorm(t.x, g, b, dsl::LayerNormOptions{1e-6, /*unbiased=*/true});
  });
  EXPECT_EQ(msg, "dsl error at nn_test.cpp:" + std::to_string(line) +
                     " (function 'forward'): layernorm(f32[B,S,1], f32[1], f32[1]): unbiased "
                     "variance over a last dim of 1 divides by zero (D - 1 = 0)");
  // Biased, one feature is fine (every output is beta).
  Fixture t(1);
  EXPECT_NO_THROW(nn::LayerNorm({"norm", 1})(t.x));
  msg = error_of([&] {
    Fixture u(4);
    line = __LINE__ + 1;
    nn::LayerNorm{"norm", 4, 1e-6, false, false, "scale", "scale"}(u.x);
  });
  EXPECT_EQ(
      msg, at(line, "norm") + "parameter names 'scale' and 'scale' must be distinct and non-empty");
}

// The Annotated Transformer's LayerNorm: parameters `<prefix>.alpha` and `<prefix>.beta`,
//   alpha * (x - mean) / (x.std(-1) + eps) + beta   (torch.std: unbiased)
// computed as written, in double, against the interpreter; the aggregate forms without the
// new fields still give nn.LayerNorm (weight/bias, no attributes).
TEST(Nn, AnnotatedTransformerLayerNorm) {
  Fixture t(4);
  t.f.output(nn::LayerNorm{"norm", 4, 1e-6, true, true, "alpha", "beta"}(t.x), "y");
  t.f.output(nn::LayerNorm{"ln", 4}(t.x), "plain");
  t.f.output(nn::LayerNorm{"ln2", 4, 1e-6}(t.x), "plain_eps");
  ir::Module m = t.mb.finish();
  std::vector<std::string> names;
  for (const auto& w : m.weights) names.push_back(w.name);
  EXPECT_EQ(names, (std::vector<std::string>{"norm.alpha", "norm.beta", "ln.weight", "ln.bias",
                                             "ln2.weight", "ln2.bias"}));
  int variants = 0, plain = 0;
  for (const ir::Op& op : m.functions[0].ops) {
    if (op.kind != ir::OpKind::layernorm) continue;
    if (op.attrs.size() == 1) {
      ++plain;  // {eps} only: the IR of every existing model is unchanged
    } else {
      ++variants;
      EXPECT_EQ(op.int_attr("unbiased"), 1);
      EXPECT_EQ(op.int_attr("eps_outside"), 1);
      EXPECT_EQ(op.float_attr("eps"), 1e-6);
    }
  }
  EXPECT_EQ(variants, 1);
  EXPECT_EQ(plain, 2);

  const std::vector<float> xs = {1, 2, 4, 8, -3, 0.5f, 0.25f, 7};
  const std::vector<float> alpha = {1.5f, -1, 0.5f, 2}, beta = {0.25f, 0, -1, 3};
  ir::WeightMap weights{{"norm.alpha", ir::Tensor::from_f32({4}, alpha)},
                        {"norm.beta", ir::Tensor::from_f32({4}, beta)}};
  for (const char* p : {"ln", "ln2"}) {
    weights[std::string(p) + ".weight"] = ir::Tensor::from_f32({4}, {1, 1, 1, 1});
    weights[std::string(p) + ".bias"] = ir::Tensor::from_f32({4}, {0, 0, 0, 0});
  }
  ir::Tensor ids = ir::Tensor::from_ints(DType::i64, {1, 2}, {1, 1});
  std::vector<ir::Tensor> out =
      ir::interpret(m, m.functions.at(0), weights, {ids, ir::Tensor::from_f32({1, 2, 4}, xs)});
  for (int row = 0; row < 2; ++row) {
    double mean = 0, ss = 0;
    for (int i = 0; i < 4; ++i) mean += xs[row * 4 + i] / 4.0;
    for (int i = 0; i < 4; ++i) ss += (xs[row * 4 + i] - mean) * (xs[row * 4 + i] - mean);
    const double std_unbiased = std::sqrt(ss / 3);  // x.std(-1)
    for (int i = 0; i < 4; ++i) {
      const double want = alpha[i] * (xs[row * 4 + i] - mean) / (std_unbiased + 1e-6) + beta[i];
      EXPECT_NEAR(out[0].f[row * 4 + i], want, 1e-6 * std::max(1.0, std::abs(want)));
      // nn.LayerNorm: biased variance inside the root.
      const double plain_want = (xs[row * 4 + i] - mean) / std::sqrt(ss / 4 + 1e-5);
      EXPECT_NEAR(out[1].f[row * 4 + i], plain_want, 1e-6 * std::max(1.0, std::abs(plain_want)));
    }
  }
}

// The names a PyTorch twin with the documented attribute names has.
TEST(Nn, PreNormBlockTiedEmbeddingAndPositionsStateDictNames) {
  Fixture t(8);
  nn::Embedding emb{"tok_emb", 11, 8};
  dsl::Tensor h = nn::PositionEmbedding{"pos_emb", 16, 8}(emb(t.ids));
  h = nn::EncoderBlock{"blocks.0", 8, 2, 12, /*pre_norm=*/true}(h, nn::causal_mask(t.ids));
  h = nn::LayerNorm{"ln_f", 8}(h);
  t.f.output(emb.tied_projection(h), "logits");
  ir::Module m = t.mb.finish();
  std::vector<std::string> names;
  for (const auto& w : m.weights) names.push_back(w.name + " " + ir::to_string(w.type));
  const std::vector<std::string> want = {"tok_emb.weight f32[11,8]",
                                         "pos_emb.weight f32[16,8]",
                                         "blocks.0.norm1.weight f32[8]",
                                         "blocks.0.norm1.bias f32[8]",
                                         "blocks.0.self_attn.w_q.weight f32[8,8]",
                                         "blocks.0.self_attn.w_q.bias f32[8]",
                                         "blocks.0.self_attn.w_k.weight f32[8,8]",
                                         "blocks.0.self_attn.w_k.bias f32[8]",
                                         "blocks.0.self_attn.w_v.weight f32[8,8]",
                                         "blocks.0.self_attn.w_v.bias f32[8]",
                                         "blocks.0.self_attn.w_o.weight f32[8,8]",
                                         "blocks.0.self_attn.w_o.bias f32[8]",
                                         "blocks.0.norm2.weight f32[8]",
                                         "blocks.0.norm2.bias f32[8]",
                                         "blocks.0.ffn.w_1.weight f32[12,8]",
                                         "blocks.0.ffn.w_1.bias f32[12]",
                                         "blocks.0.ffn.w_2.weight f32[8,12]",
                                         "blocks.0.ffn.w_2.bias f32[8]",
                                         "ln_f.weight f32[8]",
                                         "ln_f.bias f32[8]"};  // the tied projection adds no weight
  EXPECT_EQ(names, want);
}

// Attention and feed-forward take a write-up's parameter names and bias choices (seed 003:
// W_q, W_k, W_v without bias, W_o with one; FFN linear1/linear2).
TEST(Nn, AttentionAndFeedForwardParameterNames) {
  Fixture t(8);
  dsl::Tensor h = nn::MultiHeadAttention{"attn",
                                         8,
                                         2,
                                         "W_q",
                                         "W_k",
                                         "W_v",
                                         "W_o",
                                         /*qkv_bias=*/false,
                                         /*o_bias=*/true}(t.x, t.x, {});
  h = nn::FeedForward{"ffn", 8, 12, nn::Activation::relu, "linear1", "linear2"}(h);
  t.f.output(h, "y");
  ir::Module m = t.mb.finish();
  std::vector<std::string> names;
  for (const auto& w : m.weights) names.push_back(w.name + " " + ir::to_string(w.type));
  const std::vector<std::string> want = {
      "attn.W_q.weight f32[8,8]", "attn.W_k.weight f32[8,8]",     "attn.W_v.weight f32[8,8]",
      "attn.W_o.weight f32[8,8]", "attn.W_o.bias f32[8]",         "ffn.linear1.weight f32[12,8]",
      "ffn.linear1.bias f32[12]", "ffn.linear2.weight f32[8,12]", "ffn.linear2.bias f32[8]"};
  EXPECT_EQ(names, want);
}

// mean_pool averages only the valid positions; first_token takes position 0.
TEST(Nn, PoolingComputesTheMaskedMeanAndTheFirstToken) {
  Fixture t(2);
  dsl::Tensor pad = nn::padding_mask(t.ids, 0);
  t.f.output(nn::mean_pool(t.x, pad), "mean");
  t.f.output(nn::first_token(t.x), "first");
  ir::Module m = t.mb.finish();
  std::vector<float> xs(12);
  for (int i = 0; i < 12; ++i) xs[i] = static_cast<float>(i);
  // Row 1 has one valid position.
  ir::Tensor ids = ir::Tensor::from_ints(DType::i64, {2, 3}, {5, 6, 7, 4, 0, 0});
  ir::Tensor x = ir::Tensor::from_f32({2, 3, 2}, xs);
  std::vector<ir::Tensor> out = ir::interpret(m, m.functions.at(0), {}, {ids, x});
  const std::vector<float>& mean = out.at(0).f;
  ASSERT_EQ(mean.size(), 4u);
  EXPECT_FLOAT_EQ(mean[0], (0 + 2 + 4) / 3.0f);
  EXPECT_FLOAT_EQ(mean[1], (1 + 3 + 5) / 3.0f);
  EXPECT_FLOAT_EQ(mean[2], 6);
  EXPECT_FLOAT_EQ(mean[3], 7);
  const std::vector<float>& first = out.at(1).f;
  EXPECT_EQ(first, (std::vector<float>{0, 1, 6, 7}));
}

}  // namespace
}  // namespace kiln
