// The DSL and the registered Transformer: shape checking with located errors, config
// validation, weight names, parameter count, and the text round trip of `base`.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "frontend/dsl.h"
#include "frontend/models.h"
#include "frontend/nn.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "support/error.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

using kiln::testing::error_of;

TEST(Dsl, MatmulMismatchNamesOpShapesAndPlace) {
  std::string msg = error_of([] {
    dsl::ModelBuilder mb("toy");
    dsl::Dim B = mb.symbol("B", 4), S = mb.symbol("S", 8);
    dsl::FunctionBuilder& f = mb.function("main");
    dsl::Tensor x = f.input("x", dsl::DType::f32, {B, S, dsl::Dim::constant(24)});
    dsl::ScopeGuard scope(f, "encoder.layers.0.ffn");
    dsl::Tensor w = f.weight("w", {40, 36});
    dsl::matmul(x, w);  // the line reported below
  });
  EXPECT_THAT(msg,
              MatchesRegex("dsl error at model_test\\.cpp:[0-9]+ in 'encoder\\.layers\\.0\\.ffn' "
                           "\\(function 'main'\\): matmul\\(f32\\[B,S,24\\], f32\\[40,36\\]\\): "
                           "contraction dims differ: f32\\[B,S,24\\] x f32\\[40,36\\]"));
}

TEST(Dsl, BroadcastMismatchOfSymbols) {
  std::string msg = error_of([] {
    dsl::ModelBuilder mb("toy");
    dsl::Dim S = mb.symbol("S", 8), T = mb.symbol("T", 8);
    dsl::FunctionBuilder& f = mb.function("main");
    dsl::Tensor a = f.input("a", dsl::DType::f32, {S});
    dsl::Tensor b = f.input("b", dsl::DType::f32, {T});
    dsl::add(a, b);
  });
  EXPECT_THAT(msg, HasSubstr("add(f32[S], f32[T]): operand shapes [S] and [T] do not broadcast"));
}

TEST(Dsl, ReshapeElementCountAndUndeclaredSymbol) {
  EXPECT_THAT(
      error_of([] {
        dsl::ModelBuilder mb("toy");
        dsl::Dim S = mb.symbol("S", 8);
        dsl::FunctionBuilder& f = mb.function("main");
        dsl::Tensor a = f.input("a", dsl::DType::f32, {S, dsl::Dim::constant(6)});
        dsl::reshape(a, {S, dsl::Dim::constant(4), dsl::Dim::constant(2)});
      }),
      HasSubstr("reshape(f32[S,6]): cannot reshape [S,6] to [S,4,2]: element counts differ"));
  EXPECT_THAT(error_of([] {
                dsl::ModelBuilder mb("toy");
                dsl::FunctionBuilder& f = mb.function("main");
                f.input("a", dsl::DType::f32, {dsl::Dim::sym("Q")});
              }),
              HasSubstr("input 'a' uses undeclared symbol 'Q'"));
}

TEST(Dsl, WeightReusedWithAnotherShape) {
  EXPECT_THAT(error_of([] {
                dsl::ModelBuilder mb("toy");
                dsl::FunctionBuilder& f = mb.function("main");
                f.weight("w", {2, 3});
                f.weight("w", {3, 2});
              }),
              HasSubstr("weight 'w' used as f32[2,3] and as f32[3,2]"));
}

TEST(Dsl, FunctionWithoutOutputFailsVerification) {
  EXPECT_THAT(error_of([] {
                dsl::ModelBuilder mb("toy");
                dsl::FunctionBuilder& f = mb.function("main");
                f.input("a", dsl::DType::f32, {dsl::Dim::constant(2)});
                mb.finish();
              }),
              HasSubstr("[V3] function 'main' has no results"));
}

// The DSL's math functions and scalar arithmetic on either side, run by the interpreter
// and compared with the PyTorch definitions evaluated here in double.
TEST(Dsl, MathFunctionsAndScalarArithmetic) {
  dsl::ModelBuilder mb("toy");
  dsl::FunctionBuilder& f = mb.function("main");
  dsl::Tensor x = f.input("x", dsl::DType::f32, {dsl::Dim::constant(6)});
  using dsl::Tensor;
  const std::vector<std::pair<std::string, Tensor>> outs = {
      {"gelu", dsl::gelu(x)},
      {"gelu_tanh", dsl::gelu_tanh(x)},
      {"silu", dsl::silu(x)},
      {"tanh", dsl::tanh(x)},
      {"sigmoid", dsl::sigmoid(x)},
      {"erf", dsl::erf(x)},
      {"log", dsl::log(x * x + 1.0)},
      {"exp", dsl::exp(-x)},
      {"scalars", (1.0 - x) * 2.0 + 3.0 / (x - 4.0) - (x + 0.5) / 2.0},
      {"neg", -dsl::neg(x)}};
  for (const auto& [name, t] : outs) f.output(t, name);
  const ir::Module m = mb.finish();
  const std::vector<float> xs = {-2.5f, -1.0f, 0.0f, 0.3f, 1.0f, 3.0f};
  const std::vector<ir::Tensor> got =
      ir::interpret(m, m.functions[0], {}, {ir::Tensor::from_f32({6}, xs)});
  ASSERT_EQ(got.size(), outs.size());
  const double c = std::sqrt(2.0 / std::acos(-1.0));
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    const double want[] = {0.5 * v * (1 + std::erf(v / std::sqrt(2.0))),
                           0.5 * v * (1 + std::tanh(c * (v + 0.044715 * v * v * v))),
                           v / (1 + std::exp(-v)),
                           std::tanh(v),
                           1 / (1 + std::exp(-v)),
                           std::erf(v),
                           std::log(v * v + 1),
                           std::exp(-v),
                           (1 - v) * 2 + 3 / (v - 4) - (v + 0.5) / 2,
                           v};
    for (size_t k = 0; k < outs.size(); ++k)
      EXPECT_NEAR(got[k].f[i], want[k], 1e-6 * std::max(1.0, std::fabs(want[k])))
          << outs[k].first << "(" << v << ")";
  }
  // The ops are the IR's own (no decomposition): one op per function.
  const ir::Function& fn = m.functions[0];
  EXPECT_EQ(fn.ops[static_cast<size_t>(fn.defining_op(fn.results[0]))].kind, ir::OpKind::gelu);
  EXPECT_EQ(fn.ops[static_cast<size_t>(fn.defining_op(fn.results[1]))].kind, ir::OpKind::gelu_tanh);
}

TEST(Dsl, MathFunctionOfIntegersIsAnError) {
  EXPECT_THAT(error_of([] {
                dsl::ModelBuilder mb("toy");
                dsl::FunctionBuilder& f = mb.function("main");
                dsl::gelu(f.input("ids", dsl::DType::i64, {dsl::Dim::constant(2)}));
              }),
              HasSubstr("gelu(i64[2]): operand must be f32"));
}

// Without --config: the model's only config, or base (kiln emit, generators).
TEST(Models, DefaultConfigIsTheOnlyOneOrBase) {
  EXPECT_EQ(models::default_config(models::find_model("transformer")), "base");
  EXPECT_EQ(models::default_config(models::find_model("seed2_tied_generator")), "small");
  models::ModelInfo two{"two", "", {{"a", {}}, {"b", {}}}, nullptr};
  EXPECT_THAT(error_of([&] { models::default_config(two); }),
              HasSubstr("model 'two' has 2 configs and none is 'base': choose one with --config "
                        "(known: a, b)"));
}

TEST(Models, ConfigErrorsNameTheKey) {
  EXPECT_THAT(error_of([] { models::build_model("transformer", "base", {"d_model=500"}); }),
              HasSubstr("config 'd_model' = 500 is not divisible by 'heads' = 8"));
  EXPECT_THAT(error_of([] { models::build_model("transformer", "base", {"dmodel=512"}); }),
              HasSubstr("unknown config key 'dmodel' for model 'transformer'"));
  EXPECT_THAT(error_of([] { models::build_model("transformer", "base", {"heads=eight"}); }),
              HasSubstr("config key 'heads' needs an integer, got 'eight'"));
  EXPECT_THAT(
      error_of([] { models::build_model("transformer", "huge"); }),
      HasSubstr("model 'transformer' has no config 'huge' (known: base, numbers, small, tiny)"));
  EXPECT_THAT(error_of([] { models::build_model("gpt", "base"); }),
              HasSubstr("unknown model 'gpt' (known: transformer, seed0_neginf_fill, "
                        "seed1_custom_layernorm, seed2_tied_generator, "
                        "seed3_query_mask, seed4_no_final_norm)"));
  EXPECT_THAT(error_of([] { models::build_model("transformer", "tiny", {"pad_id=41"}); }),
              HasSubstr("config 'pad_id' = 41 is outside the vocabularies"));
}

// The reference model's state_dict names, listed independently of nn.cpp.
std::vector<std::string> reference_names(int enc, int dec) {
  std::vector<std::string> names = {"src_embed.weight", "tgt_embed.weight"};
  auto attn = [&](const std::string& p) {
    for (const char* w : {"w_q", "w_k", "w_v", "w_o"})
      for (const char* s : {"weight", "bias"}) names.push_back(p + "." + w + "." + s);
  };
  auto norm_ffn = [&](const std::string& p, int norms) {
    for (const char* w : {"w_1", "w_2"})
      for (const char* s : {"weight", "bias"}) names.push_back(p + ".ffn." + w + "." + s);
    for (int n = 1; n <= norms; ++n)
      for (const char* s : {"weight", "bias"})
        names.push_back(p + ".norm" + std::to_string(n) + "." + s);
  };
  for (int i = 0; i < enc; ++i) {
    std::string p = "encoder.layers." + std::to_string(i);
    attn(p + ".self_attn");
    norm_ffn(p, 2);
  }
  for (int i = 0; i < dec; ++i) {
    std::string p = "decoder.layers." + std::to_string(i);
    attn(p + ".self_attn");
    attn(p + ".cross_attn");
    norm_ffn(p, 3);
  }
  for (const char* n : {"encoder.norm.weight", "encoder.norm.bias", "decoder.norm.weight",
                        "decoder.norm.bias", "generator.weight", "generator.bias"})
    names.push_back(n);
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Models, BaseHasTheReferenceWeightsAndParameterCount) {
  ir::Module m = models::build_model("transformer", "base");
  std::vector<std::string> names;
  int64_t params = 0;
  for (const ir::Weight& w : m.weights) {
    names.push_back(w.name);
    params += ir::static_numel(w.type);
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, reference_names(6, 6));
  // 2·32000·512 embeddings + 6 encoder layers (3,152,384 each) + 6 decoder layers
  // (4,204,032 each) + 2 final norms + generator 512·32000 + 32000.
  EXPECT_EQ(params, 93'324'544);
  const ir::Weight* gen = m.find_weight("generator.weight");
  ASSERT_NE(gen, nullptr);
  EXPECT_EQ(ir::to_string(gen->type), "f32[32000,512]");  // nn.Linear layout [out, in]
}

TEST(Models, BaseEntryPoints) {
  ir::Module m = models::build_model("transformer", "base");
  const ir::Function* fwd = m.find_function("forward");
  const ir::Function* enc = m.find_function("encode");
  ASSERT_TRUE(fwd && enc);
  EXPECT_EQ(ir::to_string(fwd->type(fwd->params[0])), "i64[B,S]");
  EXPECT_EQ(ir::to_string(fwd->type(fwd->params[1])), "i64[B,T]");
  EXPECT_EQ(ir::to_string(fwd->type(fwd->results[0])), "f32[B,T,32000]");
  EXPECT_EQ(ir::to_string(enc->type(enc->results[0])), "f32[B,S,512]");
  EXPECT_EQ(m.find_symbol("B")->max, 16);
  EXPECT_EQ(m.find_symbol("S")->max, 128);
}

TEST(Models, BaseRoundTripsThroughText) {
  ir::Module m = models::build_model("transformer", "base");
  std::string text = ir::print_module(m);
  ir::Module parsed = ir::parse_and_verify(text, "base.kir");
  EXPECT_EQ(ir::print_module(parsed), text);
  EXPECT_TRUE(ir::verify(parsed).empty());
}

}  // namespace
}  // namespace kiln
