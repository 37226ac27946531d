// Ops on symbolic sizes compiled end to end (tests/jit_model.h: the default pipeline,
// lowering, Halide JIT, the runtime) against the interpreter at lengths 1, 7 and 33: concat
// along a symbolic axis ([B,1,D] ++ [B,T,D] -> [B,T+1,D]), slices dropping that token again,
// reshapes merging a symbolic axis with constant ones ([B,T,4,16] -> [B,64*T]) and back,
// parameters of type [B,T+1,D], a ViT-style encoder with a prepended class token that fuses
// its attention; the output shapes the runtime reports (kiln_model_output_shapes) for T+1, and
// the runtime's errors for inputs whose T and T+1 disagree.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "frontend/dsl.h"
#include "frontend/nn.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "jit_model.h"
#include "pass_harness.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

constexpr double kTolerance = 1e-4;  // as general_path_test.cpp: relative to the output's scale

double relative_error(const ir::Tensor& got, const ir::Tensor& want) {
  if (got.dtype != want.dtype || got.shape != want.shape) return INFINITY;
  if (want.dtype != ir::DType::f32) return got.ints == want.ints ? 0.0 : INFINITY;
  double scale = 1.0, err = 0.0;
  for (float w : want.f) scale = std::max(scale, std::abs(static_cast<double>(w)));
  for (size_t i = 0; i < got.f.size(); ++i)
    err = std::max(err, std::abs(static_cast<double>(got.f[i]) - want.f[i]));
  return err / scale;
}

std::string weights_file(const std::string& name) {
  return ::testing::TempDir() + "kiln_symdims_" + name + ".safetensors";
}

// T at 1, 7 and 33 (B at 1, 3, 2).
const std::vector<std::map<std::string, int64_t>> kLengths = {
    {{"B", 1}, {"T", 1}}, {{"B", 3}, {"T", 7}}, {{"B", 2}, {"T", 33}}};

// Runs every entry point of the compiled `model` at each length against the interpreter;
// checks each result's shape (as kiln_model_output_shapes reported it) against `shapes`
// (result name -> dims as functions of B and T), when given.
void compare(jit::JitModel& model, const ir::Module& m, const ir::WeightMap& weights,
             const std::map<std::string, std::vector<std::string>>& shapes = {}) {
  uint32_t seed = 3;
  for (const ir::Function& f : m.functions)
    for (const auto& sizes : kLengths) {
      std::vector<ir::Tensor> inputs = testing::random_inputs(m, f, sizes, seed++, false);
      std::vector<ir::Tensor> want = ir::interpret(m, f, weights, inputs);
      std::vector<ir::Tensor> got = model.run(f.name, inputs);
      ASSERT_EQ(got.size(), want.size());
      for (size_t r = 0; r < got.size(); ++r) {
        EXPECT_LE(relative_error(got[r], want[r]), kTolerance)
            << f.name << " result " << r << " at T = " << sizes.at("T");
        // The declared type evaluated at B and T.
        std::vector<int64_t> declared;
        for (const ir::Dim& d : f.type(f.results[r]).shape)
          declared.push_back(d.is_symbolic() ? d.at(sizes.at(d.symbol)) : d.value);
        EXPECT_EQ(got[r].shape, declared) << f.name << " result " << r;
      }
    }
}

TEST(SymbolicDims, ConcatSliceAndReshapeCompiled) {
  const std::string text = R"(module @symdims {
  symbol B max 3
  symbol T max 33
  weight @cls : f32[1,1,64]
  func @tokens(%x: f32[B,T,64]) -> (f32[B,T+1,64], f32[B,T,64], f32[B,T+1,64], f32[B,2*T+1,64], f32[B,64*T+64], f32[B,64*T], f32[B,T,4,16], f32[B,1,64]) {
    %c = weight() {name = "cls"} : f32[1,1,64]
    %ce = expand(%c) : f32[B,1,64]
    %y = concat(%ce, %x) {axis = 1} : f32[B,T+1,64]
    %yr = relu(%y) : f32[B,T+1,64]
    %z = slice(%yr) {axis = 1, start = 1} : f32[B,T,64]
    %zx = mul(%z, %x) : f32[B,T,64]
    %app = concat(%x, %ce) {axis = 1} : f32[B,T+1,64]
    %w = concat(%x, %ce, %x) {axis = 1} : f32[B,2*T+1,64]
    %flat = reshape(%yr) : f32[B,64*T+64]
    %zf = reshape(%z) : f32[B,64*T]
    %heads = reshape(%zf) : f32[B,T,4,16]
    %first = slice(%yr) {axis = 1, start = 0} : f32[B,1,64]
    return %y, %zx, %app, %w, %flat, %zf, %heads, %first
  }
  func @params(%a: f32[B,T+1,4], %b: f32[B,T,4]) -> (f32[B,2*T+1,4], f32[B,T,4]) {
    %c = concat(%a, %b) {axis = 1} : f32[B,2*T+1,4]
    %s = slice(%a) {axis = 1, start = 1} : f32[B,T,4]
    %d = sub(%s, %b) : f32[B,T,4]
    return %c, %d
  }
}
)";
  ir::Module m = ir::parse_and_verify(text);
  ir::WeightMap weights = testing::random_weights(m, 5);
  jit::JitModel model(m, weights, weights_file("ops"));
  compare(model, m, weights);

  // T+1 as the runtime reports it, and inputs whose T and T+1 disagree.
  std::vector<ir::Tensor> ok = {ir::Tensor::from_f32({2, 6, 4}, std::vector<float>(48, 1.0f)),
                                ir::Tensor::from_f32({2, 5, 4}, std::vector<float>(40, 0.5f))};
  std::vector<ir::Tensor> out = model.run("params", ok);
  EXPECT_EQ(out.at(0).shape, (std::vector<int64_t>{2, 11, 4}));
  EXPECT_EQ(out.at(1).shape, (std::vector<int64_t>{2, 5, 4}));
  try {
    model.run("params", {ok[0], ir::Tensor::from_f32({2, 4, 4}, std::vector<float>(32))});
    FAIL() << "T = 4 with T+1 = 6 accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "input 'a' gives T+1 = 6, but input 'b' gives T = 4");
  }
  try {
    model.run("params", {ir::Tensor::from_f32({2, 35, 4}, std::vector<float>(280)), ok[1]});
    FAIL() << "T+1 = 35 accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "input 'a' has shape [2,35,4]: dim 1 (T+1) is 35, above its maximum 34");
  }
  try {
    model.run("params", {ir::Tensor::from_f32({2, 1, 4}, std::vector<float>(8)), ok[1]});
    FAIL() << "T+1 = 1 accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "input 'a' has shape [2,1,4]: dim 1 (T+1) is 1, expected at least 2");
  }
}

// A parameter [B,64*T] alone binds T (its size over 64) and the reshape splits it again.
TEST(SymbolicDims, ScaledParameterBindsItsSymbol) {
  const std::string text = R"(module @scaled {
  symbol B max 3
  symbol T max 33
  func @split(%x: f32[B,64*T]) -> (f32[B,T,4,16], f32[B,T+1,64]) {
    %h = reshape(%x) : f32[B,T,4,16]
    %t = reshape(%x) : f32[B,T,64]
    %z = constant() {value = 0} : f32[B,1,64]
    %p = concat(%t, %z) {axis = 1} : f32[B,T+1,64]
    return %h, %p
  }
}
)";
  ir::Module m = ir::parse_and_verify(text);
  ir::WeightMap weights;
  jit::JitModel model(m, weights, weights_file("scaled"));
  compare(model, m, weights);
  try {
    model.run("split", {ir::Tensor::from_f32({1, 100}, std::vector<float>(100))});
    FAIL() << "a size that is no multiple of 64 accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "input 'x' has shape [1,100]: dim 1 (64*T) is 100, expected a multiple "
                 "of 64");
  }
}

// A ViT-style encoder written with the DSL: patch embedding, a learned class token
// prepended ([B,1,D] ++ [B,T,D] -> [B,T+1,D]), learned positions over T+1, one pre-norm
// encoder block, the class token's logits and the patch tokens without it. Its attention
// fuses (one attention op, no softmax or matmul left) and the model compiles.
TEST(SymbolicDims, VitWithClassTokenFusesAndCompiles) {
  using dsl::Dim;
  using dsl::DType;
  dsl::ModelBuilder mb("vit");
  const Dim B = mb.symbol("B", 3), T = mb.symbol("T", 33);
  const int64_t patch = 12, d = 16, classes = 5;
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor patches = f.input("patches", DType::f32, {B, T, Dim::constant(patch)});
  dsl::Tensor x = nn::Linear{"patch_embed", patch, d}(patches);
  dsl::Tensor cls =
      dsl::expand(f.weight("cls_token", {1, 1, d}), {B, Dim::constant(1), Dim::constant(d)});
  x = dsl::concat({cls, x}, 1);
  EXPECT_EQ(ir::to_string(x.type()), "f32[B,T+1,16]");
  x = nn::PositionEmbedding{"pos_embed", 34, d}(x);
  x = nn::EncoderBlock{"blocks.0", d, 2, 32, /*pre_norm=*/true}(x, dsl::Tensor());
  x = nn::LayerNorm{"norm", d}(x);
  f.output(nn::Linear{"head", d, classes}(nn::first_token(x)), "logits");
  f.output(dsl::slice(x, 1, 1, T), "tokens");
  f.output(dsl::reshape(x, {B, (T + 1) * d}), "flat");
  ir::Module m = mb.finish();
  ASSERT_NO_THROW(ir::verify_or_throw(m));
  ir::WeightMap weights = testing::random_weights(m, 7);
  jit::JitModel model(m, weights, weights_file("vit"));
  std::map<ir::OpKind, int> kinds;
  for (const ir::Op& op : model.module().functions[0].ops) ++kinds[op.kind];
  EXPECT_EQ(kinds[ir::OpKind::attention], 1);
  EXPECT_EQ(kinds[ir::OpKind::softmax], 0);
  EXPECT_EQ(kinds[ir::OpKind::matmul], 0);
  EXPECT_EQ(kinds[ir::OpKind::concat], 1);
  compare(model, m, weights);
}

// What stays out of scope is refused by the DSL, naming the dims.
TEST(SymbolicDims, RefusedFormsNameTheDims) {
  using dsl::Dim;
  using dsl::DType;
  dsl::ModelBuilder mb("refused");
  const Dim B = mb.symbol("B", 3), S = mb.symbol("S", 9), T = mb.symbol("T", 9);
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor a = f.input("a", DType::f32, {B, S, Dim::constant(4)});
  dsl::Tensor b = f.input("b", DType::f32, {B, T, Dim::constant(4)});
  try {
    (void)(S + T);
    FAIL() << "S + T accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "dim arithmetic: the sum of dims S and T: sums of different symbols are not "
                 "supported");
  }
  try {
    (void)(B * T);
    FAIL() << "B * T accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("the product of dims B and T"));
  }
  try {
    dsl::concat({a, b}, 1);
    FAIL() << "concat of S and T accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot concat f32[B,S,4], f32[B,T,4] along axis 1: the sum "
                                    "of dims S and T: sums of different symbols are not "
                                    "supported"));
  }
}

}  // namespace
}  // namespace kiln
