// Tests for the reference interpreter (ir/interpreter.h): small hand-computed cases per
// op kind, fused ops against their unfused graphs, and the text of every input error.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "ir/interpreter.h"
#include "ir/ir.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "noise.h"
#include "support/error.h"

namespace kiln::ir {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

using kiln::testing::error_of;
using kiln::testing::noise;

Dim C(int64_t v) { return Dim::constant(v); }
Dim Sym(const char* name) { return Dim::sym(name); }
TensorType F32(std::vector<Dim> dims) { return {DType::f32, std::move(dims)}; }
TensorType I64(std::vector<Dim> dims) { return {DType::i64, std::move(dims)}; }
TensorType I32(std::vector<Dim> dims) { return {DType::i32, std::move(dims)}; }
TensorType Bool(std::vector<Dim> dims) { return {DType::boolean, std::move(dims)}; }

Tensor F(std::vector<int64_t> shape, std::vector<float> data) {
  return Tensor::from_f32(std::move(shape), std::move(data));
}
Tensor I(std::vector<int64_t> shape, std::vector<int64_t> data) {
  return Tensor::from_ints(DType::i64, std::move(shape), std::move(data));
}
Tensor B(std::vector<int64_t> shape, std::vector<int64_t> data) {
  return Tensor::from_ints(DType::boolean, std::move(shape), std::move(data));
}

// The static type of a tensor.
TensorType type_of(const Tensor& t) {
  TensorType type{t.dtype, {}};
  for (int64_t d : t.shape) type.shape.push_back(C(d));
  return type;
}

// Verifies `m` (a test bug otherwise) and runs its only function.
std::vector<Tensor> run(const Module& m, const std::vector<Tensor>& inputs,
                        const WeightMap& weights = {}) {
  for (const Diagnostic& d : verify(m)) ADD_FAILURE() << format_diagnostic(d);
  return interpret(m, m.functions.at(0), weights, inputs);
}

// A module whose function applies one op to parameters of the inputs' static types.
Module one_op_module(OpKind kind, const std::vector<Tensor>& inputs, const TensorType& result,
                     Attrs attrs = {}) {
  Module m;
  m.name = "test";
  Function f;
  f.name = "f";
  std::vector<ValueId> params;
  for (size_t i = 0; i < inputs.size(); ++i)
    params.push_back(f.add_param("x" + std::to_string(i), type_of(inputs[i])));
  f.results.push_back(f.add_op(kind, params, result, std::move(attrs)));
  m.functions.push_back(std::move(f));
  return m;
}

// Runs one op on `inputs` and returns its result.
Tensor run_op(OpKind kind, const std::vector<Tensor>& inputs, const TensorType& result,
              Attrs attrs = {}) {
  std::vector<Tensor> out = run(one_op_module(kind, inputs, result, std::move(attrs)), inputs);
  EXPECT_EQ(out.size(), 1u);
  return out.at(0);
}

// ---------------------------------------------------------------------------------
// Tensor

TEST(TensorTest, ConstructorsAndTypeString) {
  Tensor z = Tensor::zeros(DType::f32, {2, 3});
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.f, std::vector<float>(6, 0.0f));
  EXPECT_EQ(z.type_string(), "f32[2,3]");
  Tensor s = Tensor::zeros(DType::i64, {});
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.ints.size(), 1u);
  EXPECT_EQ(s.type_string(), "i64[]");
  EXPECT_EQ(B({2}, {0, 1}).type_string(), "bool[2]");
  EXPECT_EQ(Tensor::zeros(DType::i32, {4, 0}).numel(), 0);
}

// ---------------------------------------------------------------------------------
// Sources

TEST(InterpreterTest, Constant) {
  Tensor a = run_op(OpKind::constant, {}, F32({C(2), C(2)}), {{"value", 1.5}});
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_THAT(a.f, ElementsAre(1.5f, 1.5f, 1.5f, 1.5f));
  Tensor b = run_op(OpKind::constant, {}, I64({}), {{"value", int64_t{-7}}});
  EXPECT_THAT(b.ints, ElementsAre(-7));
  Tensor c = run_op(OpKind::constant, {}, F32({}), {{"value", int64_t{3}}});
  EXPECT_THAT(c.f, ElementsAre(3.0f));
  Tensor d = run_op(OpKind::constant, {}, Bool({C(2)}), {{"value", int64_t{1}}});
  EXPECT_THAT(d.ints, ElementsAre(1, 1));
}

TEST(InterpreterTest, SinusoidTable) {
  const int64_t rows = 7, dim = 6;
  Tensor t = run_op(OpKind::sinusoid_table, {}, F32({C(rows), C(dim)}));
  ASSERT_EQ(t.shape, (std::vector<int64_t>{rows, dim}));
  // Position 0: sin(0) = 0 in even columns, cos(0) = 1 in odd ones.
  EXPECT_THAT(std::vector<float>(t.f.begin(), t.f.begin() + dim),
              ElementsAre(0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 1.0f));
  // Position 1, columns 0 and 1: the frequency is 1.
  EXPECT_EQ(t.f[dim + 0], static_cast<float>(std::sin(1.0)));
  EXPECT_EQ(t.f[dim + 1], static_cast<float>(std::cos(1.0)));
  // Everything, from the formula written as pos * 10000^(-2i/d) per frequency pair.
  for (int64_t pos = 0; pos < rows; ++pos) {
    for (int64_t i = 0; 2 * i < dim; ++i) {
      const double freq = std::exp(-std::log(10000.0) * (2.0 * i) / dim);
      const double angle = pos * freq;
      EXPECT_NEAR(t.f[pos * dim + 2 * i], std::sin(angle), 1e-6) << pos << "," << 2 * i;
      EXPECT_NEAR(t.f[pos * dim + 2 * i + 1], std::cos(angle), 1e-6) << pos << "," << 2 * i + 1;
    }
  }
  // Position 3, column 2: sin(3 / 10000^(2/6)).
  EXPECT_EQ(t.f[3 * dim + 2], static_cast<float>(std::sin(3.0 / std::pow(10000.0, 2.0 / 6.0))));
}

TEST(InterpreterTest, SinusoidTableOddDim) {
  Tensor t = run_op(OpKind::sinusoid_table, {}, F32({C(2), C(3)}));
  // Column 2 is the sine of the second pair, which has no cosine column.
  EXPECT_EQ(t.f[3 + 2], static_cast<float>(std::sin(1.0 / std::pow(10000.0, 2.0 / 3.0))));
}

TEST(InterpreterTest, Iota) {
  EXPECT_THAT(run_op(OpKind::iota, {}, I64({C(2), C(3)}), {{"axis", int64_t{1}}}).ints,
              ElementsAre(0, 1, 2, 0, 1, 2));
  EXPECT_THAT(run_op(OpKind::iota, {}, I64({C(2), C(3)}), {{"axis", int64_t{0}}}).ints,
              ElementsAre(0, 0, 0, 1, 1, 1));
  Tensor t = run_op(OpKind::iota, {}, I32({C(2), C(2)}), {{"axis", int64_t{-1}}});
  EXPECT_EQ(t.dtype, DType::i32);
  EXPECT_THAT(t.ints, ElementsAre(0, 1, 0, 1));
}

TEST(InterpreterTest, IotaWithSymbolicShape) {
  Module m;
  m.symbols = {{"S", 8}};
  Function f;
  f.name = "f";
  f.add_param("x", F32({Sym("S")}));
  f.results.push_back(f.add_op(OpKind::iota, {}, I64({Sym("S")}), {{"axis", int64_t{0}}}));
  m.functions.push_back(f);
  EXPECT_THAT(run(m, {F({4}, {9, 9, 9, 9})})[0].ints, ElementsAre(0, 1, 2, 3));
}

TEST(InterpreterTest, Weight) {
  Module m;
  m.declare_weight("w", F32({C(2)}));
  Function f;
  f.name = "f";
  f.results.push_back(f.add_op(OpKind::weight, {}, F32({C(2)}), {{"name", std::string("w")}}));
  m.functions.push_back(f);
  EXPECT_THAT(run(m, {}, {{"w", F({2}, {4, 5})}})[0].f, ElementsAre(4.0f, 5.0f));
  EXPECT_EQ(error_of([&] { run(m, {}, {}); }), "weight 'w' was not loaded");
  EXPECT_EQ(error_of([&] {
              run(m, {}, {{"w", F({3}, {1, 2, 3})}});
            }),
            "weight 'w' has type f32[3], expected f32[2]");
  EXPECT_EQ(error_of([&] {
              run(m, {}, {{"w", I({2}, {1, 2})}});
            }),
            "weight 'w' has type i64[2], expected f32[2]");
}

TEST(InterpreterTest, MaterializeWeights) {
  Module m;
  m.declare_weight("a", F32({C(1), C(2)}));
  m.declare_weight("b", F32({C(2), C(2)}));
  m.weights.push_back(Weight{"ab", F32({C(3), C(2)}),
                             WeightDerivation{"concat", {"a", "b"}, {{"axis", int64_t{0}}}}});
  m.weights.push_back(Weight{"ba", F32({C(2), C(3)}),
                             WeightDerivation{"concat", {"a", "b"}, {{"axis", int64_t{1}}}}});
  // "ba" concatenates along axis 1, which needs equal rows: give it matching inputs.
  m.weights.back().derivation->inputs = {"b", "c"};
  m.declare_weight("c", F32({C(2), C(1)}));
  EXPECT_TRUE(verify(m).empty());
  WeightMap w{{"a", F({1, 2}, {1, 2})}, {"b", F({2, 2}, {3, 4, 5, 6})}, {"c", F({2, 1}, {7, 8})}};
  materialize_weights(m, w);
  EXPECT_EQ(w.at("ab").shape, (std::vector<int64_t>{3, 2}));
  EXPECT_THAT(w.at("ab").f, ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ(w.at("ba").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_THAT(w.at("ba").f, ElementsAre(3, 4, 7, 5, 6, 8));

  WeightMap missing{{"a", F({1, 2}, {1, 2})}, {"c", F({2, 1}, {7, 8})}};
  EXPECT_EQ(error_of([&] { materialize_weights(m, missing); }),
            "weight 'ab' is built from 'b', which was not loaded");
  WeightMap wrong{{"a", F({1, 3}, {1, 2, 3})}, {"b", F({2, 2}, {3, 4, 5, 6})}};
  EXPECT_EQ(error_of([&] { materialize_weights(m, wrong); }),
            "weight 'a' has type f32[1,3], expected f32[1,2]");
}

// ---------------------------------------------------------------------------------
// Elementwise

TEST(InterpreterTest, BroadcastAdd) {
  // [2,1] + [3] -> [2,3].
  Tensor r = run_op(OpKind::add, {F({2, 1}, {10, 20}), F({3}, {1, 2, 3})}, F32({C(2), C(3)}));
  EXPECT_EQ(r.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_THAT(r.f, ElementsAre(11, 12, 13, 21, 22, 23));
  // Rank 0 + [2].
  EXPECT_THAT(run_op(OpKind::add, {F({}, {1}), F({2}, {1, 2})}, F32({C(2)})).f, ElementsAre(2, 3));
}

TEST(InterpreterTest, FloatArithmetic) {
  Tensor a = F({4}, {1, -2, 3, 0.5f});
  Tensor b = F({4}, {4, 5, -6, 0.25f});
  const TensorType t = F32({C(4)});
  EXPECT_THAT(run_op(OpKind::sub, {a, b}, t).f, ElementsAre(-3, -7, 9, 0.25f));
  EXPECT_THAT(run_op(OpKind::mul, {a, b}, t).f, ElementsAre(4, -10, -18, 0.125f));
  EXPECT_THAT(run_op(OpKind::div, {a, b}, t).f, ElementsAre(0.25f, -0.4f, -0.5f, 2));
  EXPECT_THAT(run_op(OpKind::maximum, {a, b}, t).f, ElementsAre(4, 5, 3, 0.5f));
  // Float division by zero is IEEE.
  EXPECT_EQ(run_op(OpKind::div, {F({}, {1}), F({}, {0})}, F32({})).f[0],
            std::numeric_limits<float>::infinity());
  // The f32 sum is rounded to float: 1 + 2^-30 == 1.
  EXPECT_EQ(run_op(OpKind::add, {F({}, {1}), F({}, {std::ldexp(1.0f, -30)})}, F32({})).f[0], 1.0f);
}

TEST(InterpreterTest, IntegerArithmetic) {
  Tensor a = I({4}, {7, -7, 7, 3});
  Tensor b = I({4}, {2, 2, -2, 5});
  const TensorType t = I64({C(4)});
  EXPECT_THAT(run_op(OpKind::add, {a, b}, t).ints, ElementsAre(9, -5, 5, 8));
  EXPECT_THAT(run_op(OpKind::sub, {a, b}, t).ints, ElementsAre(5, -9, 9, -2));
  EXPECT_THAT(run_op(OpKind::mul, {a, b}, t).ints, ElementsAre(14, -14, -14, 15));
  EXPECT_THAT(run_op(OpKind::div, {a, b}, t).ints, ElementsAre(3, -3, -3, 0));  // toward zero
  EXPECT_THAT(run_op(OpKind::maximum, {a, b}, t).ints, ElementsAre(7, 2, 7, 5));
  // i32 wraps around.
  Tensor big = Tensor::from_ints(DType::i32, {}, {2147483647});
  Tensor one = Tensor::from_ints(DType::i32, {}, {1});
  EXPECT_THAT(run_op(OpKind::add, {big, one}, I32({})).ints, ElementsAre(-2147483648LL));
}

TEST(InterpreterTest, IntegerOverflowWraps) {
  const int64_t min = std::numeric_limits<int64_t>::min();
  EXPECT_THAT(run_op(OpKind::div, {I({}, {min}), I({}, {-1})}, I64({})).ints, ElementsAre(min));
  EXPECT_THAT(run_op(OpKind::neg, {I({}, {min})}, I64({})).ints, ElementsAre(min));
  EXPECT_THAT(
      run_op(OpKind::add, {I({}, {std::numeric_limits<int64_t>::max()}), I({}, {1})}, I64({})).ints,
      ElementsAre(min));
}

TEST(InterpreterTest, IntegerDivisionByZero) {
  Module m = one_op_module(OpKind::div, {I({2}, {1, 2}), I({2}, {1, 0})}, I64({C(2)}));
  m.functions[0].values[m.functions[0].results[0]].name = "q";
  EXPECT_EQ(error_of([&] {
              run(m, {I({2}, {1, 2}), I({2}, {1, 0})});
            }),
            "function 'f', op 0 (%q = div): integer division by zero");
}

TEST(InterpreterTest, ErrorsNameTheSourceLineOfTheOp) {
  const Module m = parse_module(R"(module @m {
  func @f(%a: i64[2], %b: i64[2]) -> (i64[2]) {
    %q = div(%a, %b) : i64[2]
    return %q
  }
}
)");
  EXPECT_EQ(error_of([&] {
              run(m, {I({2}, {1, 2}), I({2}, {1, 0})});
            }),
            "line 3: function 'f', op 0 (%q = div): integer division by zero");
}

TEST(InterpreterTest, Comparisons) {
  Tensor a = F({3}, {1, 2, 3});
  Tensor b = F({3}, {2, 2, 2});
  const TensorType t = Bool({C(3)});
  EXPECT_THAT(run_op(OpKind::eq, {a, b}, t).ints, ElementsAre(0, 1, 0));
  EXPECT_THAT(run_op(OpKind::ne, {a, b}, t).ints, ElementsAre(1, 0, 1));
  EXPECT_THAT(run_op(OpKind::lt, {a, b}, t).ints, ElementsAre(1, 0, 0));
  EXPECT_THAT(run_op(OpKind::le, {a, b}, t).ints, ElementsAre(1, 1, 0));
  EXPECT_THAT(run_op(OpKind::gt, {a, b}, t).ints, ElementsAre(0, 0, 1));
  EXPECT_THAT(run_op(OpKind::ge, {a, b}, t).ints, ElementsAre(0, 1, 1));
  Tensor r = run_op(OpKind::eq, {I({2, 1}, {0, 1}), I({2}, {0, 1})}, Bool({C(2), C(2)}));
  EXPECT_EQ(r.dtype, DType::boolean);
  EXPECT_THAT(r.ints, ElementsAre(1, 0, 0, 1));
}

TEST(InterpreterTest, Logical) {
  Tensor a = B({4}, {0, 0, 1, 1});
  Tensor b = B({4}, {0, 1, 0, 1});
  const TensorType t = Bool({C(4)});
  EXPECT_THAT(run_op(OpKind::logical_and, {a, b}, t).ints, ElementsAre(0, 0, 0, 1));
  EXPECT_THAT(run_op(OpKind::logical_or, {a, b}, t).ints, ElementsAre(0, 1, 1, 1));
  EXPECT_THAT(run_op(OpKind::logical_not, {a}, t).ints, ElementsAre(1, 1, 0, 0));
}

TEST(InterpreterTest, UnaryOps) {
  Tensor x = F({4}, {-2, 0, 1, 4});
  const TensorType t = F32({C(4)});
  EXPECT_THAT(run_op(OpKind::relu, {x}, t).f, ElementsAre(0, 0, 1, 4));
  EXPECT_THAT(run_op(OpKind::neg, {x}, t).f, ElementsAre(2, 0, -1, -4));
  EXPECT_THAT(run_op(OpKind::sqrt, {F({3}, {0, 4, 2})}, F32({C(3)})).f,
              ElementsAre(0, 2, std::sqrt(2.0f)));
  Tensor e = run_op(OpKind::exp, {F({3}, {0, 1, -1})}, F32({C(3)}));
  EXPECT_EQ(e.f[0], 1.0f);
  EXPECT_EQ(e.f[1], static_cast<float>(std::exp(1.0)));
  EXPECT_EQ(e.f[2], static_cast<float>(std::exp(-1.0)));
  EXPECT_THAT(run_op(OpKind::relu, {I({3}, {-5, 0, 5})}, I64({C(3)})).ints, ElementsAre(0, 0, 5));
  EXPECT_THAT(run_op(OpKind::neg, {I({2}, {-5, 5})}, I64({C(2)})).ints, ElementsAre(5, -5));
}

// The math functions as PyTorch defines them: the published values of torch.erf, tanh,
// sigmoid, nn.GELU(), nn.GELU(approximate='tanh') and nn.SiLU() at a few points, and the
// definitions evaluated with std:: functions in double, rounded to f32 once.
TEST(InterpreterTest, MathFunctions) {
  const std::vector<float> xs = {-3.0f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 2.0f, 10.0f};
  const Tensor x = F({8}, xs);
  const TensorType t = F32({C(8)});
  struct Case {
    OpKind kind;
    double (*f)(double);
  };
  const Case cases[] = {
      {OpKind::tanh, [](double v) { return std::tanh(v); }},
      {OpKind::erf, [](double v) { return std::erf(v); }},
      {OpKind::sigmoid, [](double v) { return 1.0 / (1.0 + std::exp(-v)); }},
      {OpKind::silu, [](double v) { return v / (1.0 + std::exp(-v)); }},
      {OpKind::gelu, [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); }},
      {OpKind::gelu_tanh, [](double v) {
         const double c = std::sqrt(2.0 / std::acos(-1.0));
         return 0.5 * v * (1.0 + std::tanh(c * (v + 0.044715 * v * v * v)));
       }}};
  for (const Case& c : cases) {
    const Tensor r = run_op(c.kind, {x}, t);
    for (size_t i = 0; i < xs.size(); ++i)
      EXPECT_EQ(r.f[i], static_cast<float>(c.f(xs[i]))) << op_name(c.kind) << "(" << xs[i] << ")";
  }
  // Published values (torch, f32), at x = 1 and x = -1.
  const auto at = [&](OpKind kind, size_t i) { return run_op(kind, {x}, t).f[i]; };
  EXPECT_NEAR(at(OpKind::gelu, 5), 0.8413447, 1e-7);
  EXPECT_NEAR(at(OpKind::gelu, 1), -0.1586553, 1e-7);
  EXPECT_NEAR(at(OpKind::gelu_tanh, 5), 0.8411920, 1e-7);
  EXPECT_NEAR(at(OpKind::gelu_tanh, 1), -0.1588080, 1e-7);
  EXPECT_NEAR(at(OpKind::silu, 5), 0.7310586, 1e-7);
  EXPECT_NEAR(at(OpKind::silu, 1), -0.2689414, 1e-7);
  EXPECT_NEAR(at(OpKind::erf, 5), 0.8427008, 1e-7);
  EXPECT_NEAR(at(OpKind::tanh, 1), -0.7615942, 1e-7);
  EXPECT_EQ(at(OpKind::sigmoid, 3), 0.5f);
  EXPECT_EQ(at(OpKind::gelu, 3), 0.0f);
  EXPECT_EQ(at(OpKind::gelu, 7), 10.0f);
  EXPECT_NEAR(at(OpKind::gelu_tanh, 0), -0.0036373, 1e-7);
  // log: exact at 1, log(e^2) = 2, -inf at 0, NaN below.
  const Tensor l = run_op(
      OpKind::log, {F({4}, {1.0f, static_cast<float>(std::exp(2.0)), 0.0f, -1.0f})}, F32({C(4)}));
  EXPECT_EQ(l.f[0], 0.0f);
  EXPECT_NEAR(l.f[1], 2.0f, 1e-6);
  EXPECT_TRUE(std::isinf(l.f[2]) && l.f[2] < 0);
  EXPECT_TRUE(std::isnan(l.f[3]));
}

// sign, as torch.sign: -1, 0 or +1 by the sign (-0.0 gives 0, tiny values their sign), NaN
// stays NaN; defined on f32 only.
TEST(InterpreterTest, Sign) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor r = run_op(
      OpKind::sign, {F({8}, {-2.5f, -1e-30f, -0.0f, 0.0f, 3.0f, inf, -inf, nan})}, F32({C(8)}));
  EXPECT_THAT(std::vector<float>(r.f.begin(), r.f.begin() + 7),
              ElementsAre(-1, -1, 0, 0, 1, 1, -1));
  EXPECT_FALSE(std::signbit(r.f[2]));
  EXPECT_TRUE(std::isnan(r.f[7]));
  // Of a non-f32 operand: a verifier error.
  const std::vector<Diagnostic> d =
      verify(one_op_module(OpKind::sign, {I({2}, {-1, 1})}, I64({C(2)})));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_THAT(format_diagnostic(d[0]), HasSubstr("sign: operand must be f32"));
}

// sin, cos, rsqrt, abs and minimum: values by hand, the edge cases PyTorch defines,
// and their type rules.
TEST(InterpreterTest, MoreMath) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = F({5}, {0.0f, 1.5707963267948966f, -3.0f, 4.0f, nan});
  // In double, rounded once (the float nearest pi/2 is not pi/2: its cosine is -4.4e-8).
  auto d = [](double (*f)(double), float v) { return static_cast<float>(f(v)); };
  EXPECT_THAT(run_op(OpKind::sin, {x}, F32({C(5)})).f,
              ElementsAre(0.0f, 1.0f, d(std::sin, -3.0f), d(std::sin, 4.0f), ::testing::IsNan()));
  EXPECT_THAT(run_op(OpKind::cos, {x}, F32({C(5)})).f,
              ElementsAre(1.0f, d(std::cos, 1.5707963267948966f), d(std::cos, -3.0f),
                          d(std::cos, 4.0f), ::testing::IsNan()));
  EXPECT_THAT(run_op(OpKind::rsqrt, {F({4}, {4.0f, 0.0f, -1.0f, inf})}, F32({C(4)})).f,
              ElementsAre(0.5f, inf, ::testing::IsNan(), 0.0f));
  EXPECT_THAT(run_op(OpKind::abs, {F({3}, {-2.5f, 0.0f, 3.0f})}, F32({C(3)})).f,
              ElementsAre(2.5f, 0.0f, 3.0f));
  const int64_t lo = std::numeric_limits<int64_t>::min();
  EXPECT_THAT(run_op(OpKind::abs, {I({3}, {-4, 5, lo})}, I64({C(3)})).ints,
              ElementsAre(4, 5, lo));  // wraps, as torch.abs
  EXPECT_THAT(
      run_op(OpKind::minimum, {F({3}, {1.0f, nan, -inf}), F({3}, {2.0f, 0.0f, 3.0f})}, F32({C(3)}))
          .f,
      ElementsAre(1.0f, ::testing::IsNan(), -inf));
  EXPECT_THAT(run_op(OpKind::minimum, {I({2}, {3, -7}), I({2}, {1, 9})}, I64({C(2)})).ints,
              ElementsAre(1, -7));
  // The f32 functions take f32 operands only: a verifier error.
  const std::vector<Diagnostic> diags =
      verify(one_op_module(OpKind::sin, {I({2}, {1, 2})}, I64({C(2)})));
  ASSERT_EQ(diags.size(), 1u);
  EXPECT_THAT(format_diagnostic(diags[0]), HasSubstr("sin: operand must be f32"));
}

// A linear op applies its activation after the bias, as the unfused op would.
TEST(InterpreterTest, LinearActivations) {
  const Tensor x = F({2, 3}, {1, -2, 0.5f, -1, 0.25f, 2});
  const Tensor w = F({2, 3}, {0.5f, 1, -1, 2, 0, 1});
  const Tensor b = F({2}, {0.1f, -0.3f});
  const TensorType t = F32({C(2), C(2)});
  const Tensor none = run_op(OpKind::linear, {x, w, b}, t, {{"act", std::string("none")}});
  for (const char* act : {"relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"}) {
    const OpKind kind = *parse_op_kind(act);
    const Tensor fused = run_op(OpKind::linear, {x, w, b}, t, {{"act", std::string(act)}});
    const Tensor separate = run_op(kind, {none}, t);
    EXPECT_EQ(fused.f, separate.f) << act;
  }
}

TEST(InterpreterTest, Select) {
  // cond [2,1], a [2,2], b scalar.
  Tensor r = run_op(OpKind::select, {B({2, 1}, {1, 0}), F({2, 2}, {1, 2, 3, 4}), F({}, {-9})},
                    F32({C(2), C(2)}));
  EXPECT_THAT(r.f, ElementsAre(1, 2, -9, -9));
  Tensor s = run_op(OpKind::select, {B({3}, {0, 1, 0}), I({3}, {1, 2, 3}), I({3}, {4, 5, 6})},
                    I64({C(3)}));
  EXPECT_THAT(s.ints, ElementsAre(4, 2, 6));
}

TEST(InterpreterTest, Cast) {
  Tensor x = F({5}, {-2.7f, -0.5f, 0, 2.7f, 3});
  EXPECT_THAT(run_op(OpKind::cast, {x}, I64({C(5)})).ints, ElementsAre(-2, 0, 0, 2, 3));
  EXPECT_THAT(run_op(OpKind::cast, {x}, I32({C(5)})).ints, ElementsAre(-2, 0, 0, 2, 3));
  EXPECT_THAT(run_op(OpKind::cast, {x}, Bool({C(5)})).ints, ElementsAre(1, 1, 0, 1, 1));
  EXPECT_THAT(run_op(OpKind::cast, {I({3}, {-1, 0, 7})}, F32({C(3)})).f, ElementsAre(-1, 0, 7));
  EXPECT_THAT(run_op(OpKind::cast, {I({3}, {-1, 0, 7})}, Bool({C(3)})).ints, ElementsAre(1, 0, 1));
  EXPECT_THAT(run_op(OpKind::cast, {B({2}, {1, 0})}, I64({C(2)})).ints, ElementsAre(1, 0));
  EXPECT_THAT(run_op(OpKind::cast, {B({2}, {1, 0})}, F32({C(2)})).f, ElementsAre(1, 0));
  // i64 -> i32 keeps the low 32 bits.
  EXPECT_THAT(run_op(OpKind::cast, {I({1}, {(int64_t{1} << 32) + 5})}, I32({C(1)})).ints,
              ElementsAre(5));
  // A NaN or out-of-range float has no integer value.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(error_of([&] { run_op(OpKind::cast, {F({1}, {nan})}, I64({C(1)})); }),
              HasSubstr("cannot cast nan to i64"));
  EXPECT_THAT(error_of([&] { run_op(OpKind::cast, {F({1}, {3e9f})}, I32({C(1)})); }),
              HasSubstr("cannot cast 3000000000 to i32"));
}

// ---------------------------------------------------------------------------------
// Data movement

TEST(InterpreterTest, Gather) {
  Tensor table = F({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  Tensor ids = I({2, 2}, {3, 0, 1, 1});
  Tensor r = run_op(OpKind::gather, {table, ids}, F32({C(2), C(2), C(2)}));
  EXPECT_EQ(r.shape, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_THAT(r.f, ElementsAre(30, 31, 0, 1, 10, 11, 10, 11));
  // i32 ids, rank-1 table.
  Tensor r2 = run_op(OpKind::gather,
                     {I({3}, {5, 6, 7}), Tensor::from_ints(DType::i32, {2}, {2, 0})}, I64({C(2)}));
  EXPECT_THAT(r2.ints, ElementsAre(7, 5));
}

// A module `f(src: i64[B,S]) = gather(table, src)` with a [37,2] table.
Module embedding_module() {
  Module m;
  m.symbols = {{"B", 4}, {"S", 40}};
  m.declare_weight("emb", F32({C(37), C(2)}));
  Function f;
  f.name = "encode";
  ValueId src = f.add_param("src", I64({Sym("B"), Sym("S")}));
  ValueId table = f.add_op(OpKind::weight, {}, F32({C(37), C(2)}), {{"name", std::string("emb")}});
  f.results.push_back(f.add_op(OpKind::gather, {table, src}, F32({Sym("B"), Sym("S"), C(2)})));
  m.functions.push_back(f);
  return m;
}

WeightMap embedding_weights() {
  std::vector<float> data(74);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  return {{"emb", F({37, 2}, data)}};
}

TEST(InterpreterTest, GatherOutOfRange) {
  Module m = embedding_module();
  WeightMap w = embedding_weights();
  std::vector<Tensor> out = run(m, {I({1, 2}, {36, 1})}, w);
  EXPECT_THAT(out[0].f, ElementsAre(72, 73, 2, 3));
  EXPECT_EQ(error_of([&] {
              run(m, {I({2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 45, 0})}, w);
            }),
            "token id 45 at 'src'[1,3] is out of range [0, 37)");
  EXPECT_EQ(error_of([&] {
              run(m, {I({1, 3}, {1, 2, 37})}, w);
            }),
            "token id 37 at 'src'[0,2] is out of range [0, 37)");
  EXPECT_EQ(error_of([&] {
              run(m, {I({1, 3}, {-1, 2, 3})}, w);
            }),
            "token id -1 at 'src'[0,0] is out of range [0, 37)");
}

TEST(InterpreterTest, GatherOutOfRangeNamesUnnamedValue) {
  // ids computed by an unnamed op: named as the printer numbers it.
  Module m;
  Function f;
  f.name = "f";
  ValueId table = f.add_param("table", F32({C(3)}));
  ValueId ids = f.add_op(OpKind::constant, {}, I64({C(2)}), {{"value", int64_t{5}}});
  f.results.push_back(f.add_op(OpKind::gather, {table, ids}, F32({C(2)})));
  m.functions.push_back(f);
  EXPECT_EQ(error_of([&] {
              run(m, {F({3}, {1, 2, 3})});
            }),
            "token id 5 at '%0'[0] is out of range [0, 3)");
}

TEST(InterpreterTest, Transpose) {
  // [2,3,4] with perm [1,2,0] -> [3,4,2]; result[i,j,k] = in[k,i,j].
  std::vector<float> data(24);
  for (int i = 0; i < 24; ++i) data[i] = static_cast<float>(i);
  Tensor r = run_op(OpKind::transpose, {F({2, 3, 4}, data)}, F32({C(3), C(4), C(2)}),
                    {{"perm", std::vector<int64_t>{1, 2, 0}}});
  ASSERT_EQ(r.shape, (std::vector<int64_t>{3, 4, 2}));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 2; ++k) EXPECT_EQ(r.f[(i * 4 + j) * 2 + k], data[(k * 3 + i) * 4 + j]);
  // A plain 2-D transpose.
  EXPECT_THAT(run_op(OpKind::transpose, {I({2, 3}, {1, 2, 3, 4, 5, 6})}, I64({C(3), C(2)}),
                     {{"perm", std::vector<int64_t>{1, 0}}})
                  .ints,
              ElementsAre(1, 4, 2, 5, 3, 6));
}

TEST(InterpreterTest, Reshape) {
  Tensor r = run_op(OpKind::reshape, {F({2, 3}, {1, 2, 3, 4, 5, 6})}, F32({C(3), C(1), C(2)}));
  EXPECT_EQ(r.shape, (std::vector<int64_t>{3, 1, 2}));
  EXPECT_THAT(r.f, ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST(InterpreterTest, Slice) {
  Tensor x = F({2, 4}, {0, 1, 2, 3, 10, 11, 12, 13});
  EXPECT_THAT(
      run_op(OpKind::slice, {x}, F32({C(2), C(2)}), {{"axis", int64_t{1}}, {"start", int64_t{1}}})
          .f,
      ElementsAre(1, 2, 11, 12));
  EXPECT_THAT(
      run_op(OpKind::slice, {x}, F32({C(1), C(4)}), {{"axis", int64_t{0}}, {"start", int64_t{1}}})
          .f,
      ElementsAre(10, 11, 12, 13));
  EXPECT_THAT(
      run_op(OpKind::slice, {x}, F32({C(2), C(1)}), {{"axis", int64_t{-1}}, {"start", int64_t{3}}})
          .f,
      ElementsAre(3, 13));
}

TEST(InterpreterTest, SliceBeyondActualExtent) {
  // pe[T, 4] = slice(table[10, 4]) is fine for any T <= 10; x[S] vs y[T] is checked at run time.
  Module m;
  m.symbols = {{"S", 8}, {"T", 8}};
  Function f;
  f.name = "f";
  ValueId x = f.add_param("x", F32({Sym("S")}));
  f.add_param("y", F32({Sym("T")}));
  f.results.push_back(
      f.add_op(OpKind::slice, {x}, F32({Sym("T")}), {{"axis", int64_t{0}}, {"start", int64_t{0}}}));
  m.functions.push_back(f);
  EXPECT_THAT(run(m, {F({3}, {1, 2, 3}), F({2}, {0, 0})})[0].f, ElementsAre(1, 2));
  EXPECT_EQ(error_of([&] {
              run(m, {F({3}, {1, 2, 3}), F({4}, {0, 0, 0, 0})});
            }),
            "function 'f', op 0 (%0 = slice): slice [0, 4) of axis 0 exceeds its extent 3");
}

TEST(InterpreterTest, Concat) {
  Tensor a = F({2, 1}, {1, 2});
  Tensor b = F({2, 2}, {3, 4, 5, 6});
  EXPECT_THAT(run_op(OpKind::concat, {a, b}, F32({C(2), C(3)}), {{"axis", int64_t{1}}}).f,
              ElementsAre(1, 3, 4, 2, 5, 6));
  Tensor c = F({1, 2}, {7, 8});
  EXPECT_THAT(run_op(OpKind::concat, {b, c, c}, F32({C(4), C(2)}), {{"axis", int64_t{0}}}).f,
              ElementsAre(3, 4, 5, 6, 7, 8, 7, 8));
}

// ---------------------------------------------------------------------------------
// Reductions and normalization

TEST(InterpreterTest, Matmul) {
  // [[1,2,3],[4,5,6]] x [[7,8],[9,10],[11,12]] = [[58,64],[139,154]].
  Tensor a = F({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = F({3, 2}, {7, 8, 9, 10, 11, 12});
  EXPECT_THAT(run_op(OpKind::matmul, {a, b}, F32({C(2), C(2)})).f, ElementsAre(58, 64, 139, 154));
  // Batched lhs with a rank-2 rhs: each batch times b.
  Tensor a2 = F({2, 1, 3}, {1, 2, 3, 1, 0, -1});
  EXPECT_THAT(run_op(OpKind::matmul, {a2, b}, F32({C(2), C(1), C(2)})).f,
              ElementsAre(58, 64, -4, -4));
  // Batch dims broadcast: [1,1,2] x [2,2,1] -> [2,1,1].
  Tensor a3 = F({1, 1, 2}, {1, 2});
  Tensor b3 = F({2, 2, 1}, {3, 4, 5, 6});
  EXPECT_THAT(run_op(OpKind::matmul, {a3, b3}, F32({C(2), C(1), C(1)})).f, ElementsAre(11, 17));
}

TEST(InterpreterTest, MatmulAccumulatesInDouble) {
  // 1e8 + 1 - 1e8 in float would be 0; accumulated in double it is 1.
  Tensor a = F({1, 3}, {1e8f, 1, -1e8f});
  Tensor b = F({3, 1}, {1, 1, 1});
  EXPECT_THAT(run_op(OpKind::matmul, {a, b}, F32({C(1), C(1)})).f, ElementsAre(1.0f));
}

TEST(InterpreterTest, Softmax) {
  Tensor r =
      run_op(OpKind::softmax, {F({2}, {0, std::log(2.0f)})}, F32({C(2)}), {{"axis", int64_t{0}}});
  EXPECT_NEAR(r.f[0], 1.0 / 3.0, 1e-7);
  EXPECT_NEAR(r.f[1], 2.0 / 3.0, 1e-7);
  // Along axis 0 of [2,2]: columns are independent; large values do not overflow.
  Tensor c = run_op(OpKind::softmax, {F({2, 2}, {1000, 5, 1000, 5})}, F32({C(2), C(2)}),
                    {{"axis", int64_t{0}}});
  EXPECT_THAT(c.f, ElementsAre(0.5f, 0.5f, 0.5f, 0.5f));
  Tensor d = run_op(OpKind::softmax, {F({1, 3}, {-1e9f, 0, -1e9f})}, F32({C(1), C(3)}),
                    {{"axis", int64_t{-1}}});
  EXPECT_THAT(d.f, ElementsAre(0, 1, 0));
}

TEST(InterpreterTest, RmsNorm) {
  // Row [1, 2, 2]: mean of squares 3, so y = x / sqrt(3 + eps) * gamma; no mean subtracted,
  // no beta. Row [3, 4, 0]: mean of squares 25/3.
  const double eps = 1e-6;
  Tensor r = run_op(OpKind::layernorm, {F({2, 3}, {1, 2, 2, 3, 4, 0}), F({3}, {1, 0.5f, 2})},
                    F32({C(2), C(3)}), {{"eps", eps}, {"rms", int64_t{1}}});
  const double a = 1.0 / std::sqrt(3.0 + eps), b = 1.0 / std::sqrt(25.0 / 3.0 + eps);
  EXPECT_THAT(r.f,
              ElementsAre(static_cast<float>(a), static_cast<float>(a), static_cast<float>(4 * a),
                          static_cast<float>(3 * b), static_cast<float>(2 * b), 0.0f));
  // add_layernorm {rms}: the norm of x + y, with y one row repeated ([1, 3] over [2, 3]).
  Tensor s = run_op(OpKind::add_layernorm,
                    {F({2, 3}, {0, 1, 1, 2, 3, -1}), F({1, 3}, {1, 1, 1}), F({3}, {1, 0.5f, 2})},
                    F32({C(2), C(3)}), {{"eps", eps}, {"rms", int64_t{1}}});
  EXPECT_EQ(s.f, r.f);
}

TEST(InterpreterTest, Layernorm) {
  // [1,2,3]: mean 2, biased variance 2/3, so y = (x - 2) / sqrt(2/3 + eps).
  const double eps = 1e-5;
  Tensor r = run_op(OpKind::layernorm, {F({1, 3}, {1, 2, 3}), F({3}, {1, 1, 1}), F({3}, {0, 0, 0})},
                    F32({C(1), C(3)}), {{"eps", eps}});
  const double s = 1.0 / std::sqrt(2.0 / 3.0 + eps);
  EXPECT_EQ(r.f[0], static_cast<float>(-s));
  EXPECT_EQ(r.f[1], 0.0f);
  EXPECT_EQ(r.f[2], static_cast<float>(s));
  EXPECT_NEAR(r.f[2], 1.2247357, 1e-6);
  // gamma and beta, and two rows.
  Tensor g =
      run_op(OpKind::layernorm, {F({2, 2}, {1, 3, 5, 5}), F({2}, {2, 3}), F({2}, {0.5f, -1})},
             F32({C(2), C(2)}), {{"eps", 0.25}});
  // Row [1,3]: mean 2, var 1 -> (x-2)/sqrt(1.25). Row [5,5]: var 0 -> 0.
  const double t = 1.0 / std::sqrt(1.25);
  EXPECT_EQ(g.f[0], static_cast<float>(-t * 2 + 0.5));
  EXPECT_EQ(g.f[1], static_cast<float>(t * 3 - 1));
  EXPECT_EQ(g.f[2], 0.5f);
  EXPECT_EQ(g.f[3], -1.0f);
}

// The PyTorch LayerNorm of the Annotated Transformer and its relatives, in double:
//   alpha * (x - mean) / (x.std(-1) + eps) + beta      (unbiased, eps_outside)
// with torch.std unbiased (Σ(x - mean)² / (D - 1)); `unbiased` false divides by D
// (torch.var(unbiased=False), nn.LayerNorm's), `eps_outside` false takes
// sqrt(var + eps) for std + eps (nn.LayerNorm's).
std::vector<double> torch_layernorm(const std::vector<float>& x, const std::vector<float>& alpha,
                                    const std::vector<float>& beta, int64_t d, double eps,
                                    bool unbiased, bool eps_outside) {
  std::vector<double> y(x.size());
  for (size_t row = 0; row < x.size() / d; ++row) {
    const float* xr = &x[row * d];
    double mean = 0;
    for (int64_t i = 0; i < d; ++i) mean += xr[i];
    mean /= static_cast<double>(d);
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += (xr[i] - mean) * (xr[i] - mean);
    const double var = ss / static_cast<double>(unbiased ? d - 1 : d);
    const double denom = eps_outside ? std::sqrt(var) + eps : std::sqrt(var + eps);
    for (int64_t i = 0; i < d; ++i) y[row * d + i] = alpha[i] * (xr[i] - mean) / denom + beta[i];
  }
  return y;
}

// Every variant of layernorm and add_layernorm ({unbiased, eps_outside} absent, 0 or 1)
// matches the double reference above to float rounding, on unit-scale rows with a large
// eps (where each flag changes the result by 3-10%) and on nearly constant rows with
// eps = 1e-6 (var ~1e-11: sqrt(var + eps) ~1e-3 against sqrt(var) + eps ~1e-5).
TEST(InterpreterTest, LayernormVariantsMatchTorchFormula) {
  const int64_t rows = 3, d = 8;
  const std::vector<float> alpha = noise(d, 21), beta = noise(d, 22);
  std::vector<float> flat = noise(rows * d, 23);
  for (float& v : flat) v = 5.0f + 1e-5f * v;
  struct Data {
    std::vector<float> x;
    double eps;
  };
  for (const Data& data : {Data{noise(rows * d, 20), 0.25}, Data{flat, 1e-6}}) {
    // add_layernorm's addends: x = (x - 1) + 1, its sum rounded to float as the op does.
    std::vector<float> shifted = data.x, ones(data.x.size(), 1.0f), sum(data.x.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = (shifted[i] -= 1.0f) + 1.0f;
    std::vector<std::vector<double>> refs;
    for (int variant = 0; variant < 4; ++variant) {
      const bool unbiased = variant & 1, eps_outside = variant & 2;
      SCOPED_TRACE(::testing::Message() << "eps " << data.eps << " unbiased " << unbiased
                                        << " eps_outside " << eps_outside);
      const std::vector<double> want =
          torch_layernorm(data.x, alpha, beta, d, data.eps, unbiased, eps_outside);
      const std::vector<double> want_sum =
          torch_layernorm(sum, alpha, beta, d, data.eps, unbiased, eps_outside);
      if (data.eps == 0.25) {  // the reference itself tells the variants apart
        for (const std::vector<double>& other : refs) {
          double diff = 0;
          for (size_t i = 0; i < want.size(); ++i)
            diff = std::max(diff, std::abs(want[i] - other[i]));
          EXPECT_GT(diff, 1e-2);
        }
        refs.push_back(want);
      }
      // The flags written when set; the default variant with an explicit 0 once.
      Attrs attrs{{"eps", data.eps}};
      if (unbiased) attrs["unbiased"] = int64_t{1};
      if (eps_outside) attrs["eps_outside"] = int64_t{1};
      if (variant == 0) attrs["eps_outside"] = int64_t{0};
      const Tensor ln =
          run_op(OpKind::layernorm, {F({rows, d}, data.x), F({d}, alpha), F({d}, beta)},
                 F32({C(rows), C(d)}), attrs);
      const Tensor fused =
          run_op(OpKind::add_layernorm,
                 {F({rows, d}, shifted), F({rows, d}, ones), F({d}, alpha), F({d}, beta)},
                 F32({C(rows), C(d)}), attrs);
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR(ln.f[i], want[i], 2e-7 * std::max(1.0, std::abs(want[i]))) << "layernorm " << i;
        EXPECT_NEAR(fused.f[i], want_sum[i], 2e-7 * std::max(1.0, std::abs(want_sum[i])))
            << "add_layernorm " << i;
      }
    }
  }
}

TEST(InterpreterTest, Reduce) {
  Tensor x = F({2, 3}, {1, 2, 3, 4, 5, 9});
  const Attrs ax1{{"axes", std::vector<int64_t>{1}}};
  EXPECT_THAT(run_op(OpKind::reduce_sum, {x}, F32({C(2)}), ax1).f, ElementsAre(6, 18));
  EXPECT_THAT(run_op(OpKind::reduce_max, {x}, F32({C(2)}), ax1).f, ElementsAre(3, 9));
  EXPECT_THAT(run_op(OpKind::reduce_mean, {x}, F32({C(2)}), ax1).f, ElementsAre(2, 6));
  Tensor k = run_op(OpKind::reduce_sum, {x}, F32({C(1), C(3)}),
                    {{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{1}}});
  EXPECT_EQ(k.shape, (std::vector<int64_t>{1, 3}));
  EXPECT_THAT(k.f, ElementsAre(5, 7, 12));
  Tensor all = run_op(OpKind::reduce_mean, {x}, F32({}), {{"axes", std::vector<int64_t>{0, -1}}});
  EXPECT_THAT(all.f, ElementsAre(4));
  EXPECT_THAT(run_op(OpKind::reduce_sum, {I({2, 2}, {1, -2, 3, 4})}, I64({C(2)}),
                     {{"axes", std::vector<int64_t>{0}}})
                  .ints,
              ElementsAre(4, 2));
  EXPECT_THAT(run_op(OpKind::reduce_max, {I({2, 2}, {1, -2, 3, -4})}, I64({C(2)}),
                     {{"axes", std::vector<int64_t>{1}}})
                  .ints,
              ElementsAre(1, 3));
  // Empty axes: the identity.
  EXPECT_THAT(
      run_op(OpKind::reduce_sum, {x}, F32({C(2), C(3)}), {{"axes", std::vector<int64_t>{}}}).f,
      ElementsAreArray(x.f));
}

TEST(InterpreterTest, ReduceMiddleAxisOfRank3) {
  // x[i,j,k] = 100i + 10j + k, shape [2,3,2]; summing over j gives 300i + 30 + 3k.
  std::vector<float> data;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) data.push_back(static_cast<float>(100 * i + 10 * j + k));
  Tensor r = run_op(OpKind::reduce_sum, {F({2, 3, 2}, data)}, F32({C(2), C(1), C(2)}),
                    {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{1}}});
  EXPECT_THAT(r.f, ElementsAre(30, 33, 330, 333));
  Tensor mx = run_op(OpKind::reduce_max, {F({2, 3, 2}, data)}, F32({C(3)}),
                     {{"axes", std::vector<int64_t>{0, 2}}});
  EXPECT_THAT(mx.f, ElementsAre(101, 111, 121));
}

TEST(InterpreterTest, Argmax) {
  // Ties: the first maximum wins.
  Tensor r = run_op(OpKind::argmax, {F({2, 4}, {1, 3, 3, 2, 7, 7, 7, 7})}, I64({C(2)}),
                    {{"axis", int64_t{1}}});
  EXPECT_EQ(r.dtype, DType::i64);
  EXPECT_THAT(r.ints, ElementsAre(1, 0));
  EXPECT_THAT(
      run_op(OpKind::argmax, {F({2, 2}, {1, 5, 2, 5})}, I64({C(2)}), {{"axis", int64_t{0}}}).ints,
      ElementsAre(1, 0));
  EXPECT_THAT(run_op(OpKind::argmax, {I({3}, {-4, -2, -3})}, I64({}), {{"axis", int64_t{0}}}).ints,
              ElementsAre(1));
}

// ---------------------------------------------------------------------------------
// Fused ops

TEST(InterpreterTest, LinearAndRelu) {
  // x [2,2]; W [2,2] = [[1,1],[-1,-1]]; b = [0.5, 0.5].
  Tensor x = F({2, 2}, {1, 2, -1, 0});
  Tensor w = F({2, 2}, {1, 1, -1, -1});
  Tensor b = F({2}, {0.5f, 0.5f});
  const TensorType t = F32({C(2), C(2)});
  EXPECT_THAT(run_op(OpKind::linear, {x, w, b}, t, {{"act", std::string("none")}}).f,
              ElementsAre(3.5f, -2.5f, -0.5f, 1.5f));
  EXPECT_THAT(run_op(OpKind::linear, {x, w, b}, t, {{"act", std::string("relu")}}).f,
              ElementsAre(3.5f, 0, 0, 1.5f));
  EXPECT_THAT(run_op(OpKind::linear, {x, w}, t, {{"act", std::string("none")}}).f,
              ElementsAre(3, -3, -1, 1));
  // Rank 3 input, N != K.
  Tensor w3 = F({3, 2}, {1, 0, 0, 1, 1, 1});
  EXPECT_THAT(run_op(OpKind::linear, {F({1, 2, 2}, {1, 2, 3, 4}), w3}, F32({C(1), C(2), C(3)}),
                     {{"act", std::string("none")}})
                  .f,
              ElementsAre(1, 2, 3, 3, 4, 7));
}

TEST(InterpreterTest, LinearEqualsUnfusedGraph) {
  Module m;
  Function f;
  f.name = "f";
  ValueId x = f.add_param("x", F32({C(3), C(5)}));
  ValueId w = f.add_param("w", F32({C(4), C(5)}));
  ValueId b = f.add_param("b", F32({C(4)}));
  ValueId fused =
      f.add_op(OpKind::linear, {x, w, b}, F32({C(3), C(4)}), {{"act", std::string("relu")}});
  ValueId wt =
      f.add_op(OpKind::transpose, {w}, F32({C(5), C(4)}), {{"perm", std::vector<int64_t>{1, 0}}});
  ValueId mm = f.add_op(OpKind::matmul, {x, wt}, F32({C(3), C(4)}));
  ValueId sum = f.add_op(OpKind::add, {mm, b}, F32({C(3), C(4)}));
  ValueId unfused = f.add_op(OpKind::relu, {sum}, F32({C(3), C(4)}));
  f.results = {fused, unfused};
  m.functions.push_back(f);
  auto out = run(m, {F({3, 5}, noise(15, 1)), F({4, 5}, noise(20, 2)), F({4}, noise(4, 3))});
  EXPECT_EQ(out[0].f, out[1].f);  // bit for bit
}

TEST(InterpreterTest, AddLayernormEqualsUnfused) {
  Module m;
  Function f;
  f.name = "f";
  const TensorType t = F32({C(2), C(3), C(8)});
  ValueId x = f.add_param("x", t);
  ValueId y = f.add_param("y", t);
  ValueId g = f.add_param("g", F32({C(8)}));
  ValueId b = f.add_param("b", F32({C(8)}));
  const Attrs eps{{"eps", 1e-5}};
  ValueId fused = f.add_op(OpKind::add_layernorm, {x, y, g, b}, t, eps);
  ValueId sum = f.add_op(OpKind::add, {x, y}, t);
  ValueId unfused = f.add_op(OpKind::layernorm, {sum, g, b}, t, eps);
  f.results = {fused, unfused};
  m.functions.push_back(f);
  auto out = run(m, {F({2, 3, 8}, noise(48, 4)), F({2, 3, 8}, noise(48, 5)), F({8}, noise(8, 6)),
                     F({8}, noise(8, 7))});
  EXPECT_EQ(out[0].f, out[1].f);  // bit for bit
  // And the rows are normalized: mean 0 with gamma 1, beta 0 would give unit variance;
  // check one row by hand instead.
  std::vector<float> xs = noise(48, 4), ys = noise(48, 5), gs = noise(8, 6), bs = noise(8, 7);
  double mean = 0, var = 0;
  for (int i = 0; i < 8; ++i) mean += xs[i] + ys[i];
  mean /= 8;
  for (int i = 0; i < 8; ++i) var += (xs[i] + ys[i] - mean) * (xs[i] + ys[i] - mean);
  var /= 8;
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(out[0].f[i], (xs[i] + ys[i] - mean) / std::sqrt(var + 1e-5) * gs[i] + bs[i], 1e-5);
}

// Naive attention in double: per batch b, head h, query i.
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor* key_pad, int64_t heads, double scale,
                                    bool causal) {
  const int64_t B = q.shape[0], Lq = q.shape[1], Lk = k.shape[1];
  const int64_t Dk = q.shape[2] / heads, Dv = v.shape[2] / heads;
  std::vector<double> out(B * Lq * heads * Dv, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < Lq; ++i) {
        std::vector<double> s(Lk);
        for (int64_t j = 0; j < Lk; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < Dk; ++d)
            dot += q.f[(b * Lq + i) * heads * Dk + h * Dk + d] *
                   static_cast<double>(k.f[(b * Lk + j) * heads * Dk + h * Dk + d]);
          s[j] = dot * scale;
          if ((causal && j > i) || (key_pad && key_pad->ints[b * Lk + j])) s[j] = -1e9;
        }
        double mx = s[0], total = 0;
        for (double x : s) mx = std::max(mx, x);
        for (double& x : s) total += (x = std::exp(x - mx));
        for (int64_t e = 0; e < Dv; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < Lk; ++j)
            acc += s[j] / total * v.f[(b * Lk + j) * heads * Dv + h * Dv + e];
          out[(b * Lq + i) * heads * Dv + h * Dv + e] = acc;
        }
      }
  return out;
}

TEST(InterpreterTest, AttentionOneHeadByHand) {
  // One query [1, 0] against keys [1, 0] and [0, 1], scale 1: scores [1, 0], so the
  // weights are [e/(e+1), 1/(e+1)].
  Tensor q = F({1, 1, 2}, {1, 0});
  Tensor k = F({1, 2, 2}, {1, 0, 0, 1});
  Tensor v = F({1, 2, 1}, {10, 20});
  Tensor r = run_op(OpKind::attention, {q, k, v}, F32({C(1), C(1), C(1)}),
                    {{"heads", int64_t{1}}, {"scale", 1.0}});
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.f[0], (10 * e + 20) / (e + 1), 1e-5);
}

TEST(InterpreterTest, AttentionMatchesNaive) {
  const int64_t nb = 2, Lq = 3, Lk = 4, H = 2, Dk = 3, Dv = 2;
  Tensor q = F({nb, Lq, H * Dk}, noise(nb * Lq * H * Dk, 11));
  Tensor k = F({nb, Lk, H * Dk}, noise(nb * Lk * H * Dk, 12));
  Tensor v = F({nb, Lk, H * Dv}, noise(nb * Lk * H * Dv, 13));
  Tensor pad = B({nb, Lk}, {0, 0, 0, 1, 0, 1, 0, 0});
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dk));
  const TensorType t = F32({C(nb), C(Lq), C(H * Dv)});
  for (int causal = 0; causal <= 1; ++causal) {
    for (bool with_pad : {false, true}) {
      std::vector<Tensor> in = {q, k, v};
      if (with_pad) in.push_back(pad);
      Tensor r = run_op(OpKind::attention, in, t,
                        {{"heads", H}, {"scale", scale}, {"causal", int64_t{causal}}});
      std::vector<double> want =
          naive_attention(q, k, v, with_pad ? &pad : nullptr, H, scale, causal != 0);
      ASSERT_EQ(r.f.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(r.f[i], want[i], 1e-6)
            << "causal " << causal << " pad " << with_pad << " at " << i;
    }
  }
}

TEST(InterpreterTest, AttentionMaskedKeysGetZeroWeight) {
  // Key 1 of batch 0 is padding and its value is huge: it must not show up.
  Tensor q = F({1, 2, 2}, {1, 2, 3, 4});
  Tensor k = F({1, 3, 2}, {1, 0, 0, 1, 1, 1});
  Tensor v = F({1, 3, 1}, {1, 1e6f, 3});
  Tensor pad = B({1, 3}, {0, 1, 0});
  const Attrs attrs{{"heads", int64_t{1}}, {"scale", 1.0}};
  Tensor r = run_op(OpKind::attention, {q, k, v, pad}, F32({C(1), C(2), C(1)}), attrs);
  // Without the padded key at all:
  Tensor k2 = F({1, 2, 2}, {1, 0, 1, 1});
  Tensor v2 = F({1, 2, 1}, {1, 3});
  Tensor r2 = run_op(OpKind::attention, {q, k2, v2}, F32({C(1), C(2), C(1)}), attrs);
  EXPECT_EQ(r.f, r2.f);
  // Causal: query 0 sees only key 0, so its output is v[0] exactly.
  Tensor c = run_op(OpKind::attention, {q, k, v}, F32({C(1), C(2), C(1)}),
                    {{"heads", int64_t{1}}, {"scale", 1.0}, {"causal", int64_t{1}}});
  EXPECT_EQ(c.f[0], 1.0f);
  // Query 1 sees keys 0 and 1 with scores 3 and 4.
  EXPECT_NEAR(c.f[1], (std::exp(3.0) * 1 + std::exp(4.0) * 1e6) / (std::exp(3.0) + std::exp(4.0)),
              0.1);
}

// fill_inf: a row whose keys are all masked is NaN (PyTorch's softmax of a row of -inf),
// other rows are as with -1e9; query_pad (the last operand) masks whole rows: the mean of v
// over all keys with -1e9, NaN with fill_inf.
TEST(InterpreterTest, AttentionInfiniteFillAndQueryPadding) {
  Tensor q = F({2, 2, 2}, {1, 2, 3, 4, 1, 2, 3, 4});
  Tensor k = F({2, 3, 2}, {1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1});
  Tensor v = F({2, 3, 1}, {1, 5, 3, 1, 5, 3});
  Tensor pad = B({2, 3}, {0, 1, 0, 1, 1, 1});  // batch 1: every key is padding
  Tensor qpad = B({2, 2}, {0, 1, 0, 0});       // query 1 of batch 0 is padding
  const TensorType t = F32({C(2), C(2), C(1)});
  const Attrs base{{"heads", int64_t{1}}, {"scale", 1.0}};
  Attrs inf = base;
  inf["fill_inf"] = int64_t{1};
  Tensor r = run_op(OpKind::attention, {q, k, v, pad}, t, base);
  Tensor ri = run_op(OpKind::attention, {q, k, v, pad}, t, inf);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(ri.f[i], r.f[i]) << i;       // batch 0 keeps keys 0 and 2
    EXPECT_NEAR(r.f[2 + i], 3.0f, 1e-6);   // batch 1, -1e9: the mean of v
    EXPECT_TRUE(std::isnan(ri.f[2 + i]));  // batch 1, -inf: NaN
  }
  Attrs with_query = base;
  with_query["query_pad"] = int64_t{1};
  Tensor rq = run_op(OpKind::attention, {q, k, v, qpad}, t, with_query);
  Tensor rk = run_op(OpKind::attention, {q, k, v}, t, base);
  EXPECT_EQ(rq.f[0], rk.f[0]);
  EXPECT_NEAR(rq.f[1], 3.0f, 1e-6);  // padded query
  EXPECT_EQ(rq.f[2], rk.f[2]);
  EXPECT_EQ(rq.f[3], rk.f[3]);
  with_query["fill_inf"] = int64_t{1};
  Tensor rqi = run_op(OpKind::attention, {q, k, v, pad, qpad}, t, with_query);
  EXPECT_EQ(rqi.f[0], r.f[0]);
  EXPECT_TRUE(std::isnan(rqi.f[1]));  // padded query
  EXPECT_TRUE(std::isnan(rqi.f[2]));  // padded keys
  EXPECT_TRUE(std::isnan(rqi.f[3]));
}

// The graph the DSL emits for attention, next to the fused op; d_k = 4, so the scale
// 1/sqrt(4) = 0.5 multiplies exactly as the division by 2 does, and the two agree bit for bit.
TEST(InterpreterTest, AttentionEqualsUnfusedGraph) {
  const int64_t Bn = 2, L = 3, H = 2, Dk = 4;
  Module m;
  m.symbols = {{"B", 4}, {"L", 8}};
  Function f;
  f.name = "f";
  const Dim b = Sym("B"), l = Sym("L");
  ValueId q = f.add_param("q", F32({b, l, C(H * Dk)}));
  ValueId k = f.add_param("k", F32({b, l, C(H * Dk)}));
  ValueId v = f.add_param("v", F32({b, l, C(H * Dk)}));
  ValueId pad = f.add_param("pad", Bool({b, l}));
  ValueId fused = f.add_op(OpKind::attention, {q, k, v, pad}, F32({b, l, C(H * Dk)}),
                           {{"heads", H}, {"scale", 0.5}, {"causal", int64_t{1}}});
  auto heads = [&](ValueId x) {  // [B,L,H*Dk] -> [B,H,L,Dk]
    ValueId r = f.add_op(OpKind::reshape, {x}, F32({b, l, C(H), C(Dk)}));
    return f.add_op(OpKind::transpose, {r}, F32({b, C(H), l, C(Dk)}),
                    {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  };
  ValueId qh = heads(q), kh = heads(k), vh = heads(v);
  ValueId kt = f.add_op(OpKind::transpose, {kh}, F32({b, C(H), C(Dk), l}),
                        {{"perm", std::vector<int64_t>{0, 1, 3, 2}}});
  ValueId scores = f.add_op(OpKind::matmul, {qh, kt}, F32({b, C(H), l, l}));
  ValueId two = f.add_op(OpKind::constant, {}, F32({}), {{"value", 2.0}});
  ValueId scaled = f.add_op(OpKind::div, {scores, two}, F32({b, C(H), l, l}));
  ValueId row = f.add_op(OpKind::iota, {}, I64({l, l}), {{"axis", int64_t{0}}});
  ValueId col = f.add_op(OpKind::iota, {}, I64({l, l}), {{"axis", int64_t{1}}});
  ValueId future = f.add_op(OpKind::gt, {col, row}, Bool({l, l}));
  ValueId pad4 = f.add_op(OpKind::reshape, {pad}, Bool({b, C(1), C(1), l}));
  ValueId mask = f.add_op(OpKind::logical_or, {future, pad4}, Bool({b, C(1), l, l}));
  ValueId neg = f.add_op(OpKind::constant, {}, F32({}), {{"value", -1e9}});
  ValueId filled = f.add_op(OpKind::select, {mask, neg, scaled}, F32({b, C(H), l, l}));
  ValueId p = f.add_op(OpKind::softmax, {filled}, F32({b, C(H), l, l}), {{"axis", int64_t{-1}}});
  ValueId o = f.add_op(OpKind::matmul, {p, vh}, F32({b, C(H), l, C(Dk)}));
  ValueId ot = f.add_op(OpKind::transpose, {o}, F32({b, l, C(H), C(Dk)}),
                        {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  ValueId unfused = f.add_op(OpKind::reshape, {ot}, F32({b, l, C(H * Dk)}));
  f.results = {fused, unfused};
  m.functions.push_back(f);
  const int64_t n = Bn * L * H * Dk;
  auto out = run(m, {F({Bn, L, H * Dk}, noise(n, 21)), F({Bn, L, H * Dk}, noise(n, 22)),
                     F({Bn, L, H * Dk}, noise(n, 23)), B({Bn, L}, {0, 0, 1, 0, 0, 0})});
  EXPECT_EQ(out[0].shape, out[1].shape);
  EXPECT_EQ(out[0].f, out[1].f);
}

// ---------------------------------------------------------------------------------
// Input errors

// f(src: i64[B,S], tgt: i64[B,T], x: f32[B,2]) returning x.
Module two_input_module() {
  Module m;
  m.symbols = {{"B", 4}, {"S", 40}, {"T", 40}};
  Function f;
  f.name = "forward";
  f.add_param("src", I64({Sym("B"), Sym("S")}));
  f.add_param("tgt", I64({Sym("B"), Sym("T")}));
  ValueId x = f.add_param("x", F32({Sym("B"), C(2)}));
  f.results.push_back(f.add_op(OpKind::neg, {x}, F32({Sym("B"), C(2)})));
  m.functions.push_back(f);
  return m;
}

Tensor zeros_i64(std::vector<int64_t> shape) { return Tensor::zeros(DType::i64, std::move(shape)); }

TEST(InterpreterErrorTest, ValidInputsRun) {
  Module m = two_input_module();
  auto out = run(m, {zeros_i64({2, 40}), zeros_i64({2, 1}), F({2, 2}, {1, 2, 3, 4})});
  EXPECT_THAT(out[0].f, ElementsAre(-1, -2, -3, -4));
  // i32 ids are accepted for an i64 parameter.
  EXPECT_NO_THROW(
      run(m, {Tensor::zeros(DType::i32, {2, 3}), zeros_i64({2, 1}), F({2, 2}, {1, 2, 3, 4})}));
}

TEST(InterpreterErrorTest, SymbolAboveMaximum) {
  Module m = two_input_module();
  EXPECT_EQ(error_of([&] {
              run(m, {zeros_i64({2, 50}), zeros_i64({2, 1}), F({2, 2}, {1, 2, 3, 4})});
            }),
            "input 'src' has shape [2,50]: dim 1 (S) is 50, above its maximum 40");
}

TEST(InterpreterErrorTest, SymbolZero) {
  Module m = two_input_module();
  EXPECT_EQ(error_of([&] {
              run(m, {zeros_i64({2, 3}), zeros_i64({2, 0}), F({2, 2}, {1, 2, 3, 4})});
            }),
            "input 'tgt' has shape [2,0]: dim 1 (T) is 0, below its minimum 1");
}

TEST(InterpreterErrorTest, InconsistentSymbol) {
  Module m = two_input_module();
  EXPECT_EQ(error_of([&] {
              run(m, {zeros_i64({2, 3}), zeros_i64({3, 1}), F({2, 2}, {1, 2, 3, 4})});
            }),
            "input 'tgt' has shape [3,1]: dim 0 (B) is 3, but B is 2 from dim 0 of input 'src'");
}

TEST(InterpreterErrorTest, ConstantDimMismatch) {
  Module m = two_input_module();
  EXPECT_EQ(error_of([&] {
              run(m, {zeros_i64({2, 3}), zeros_i64({2, 1}), F({2, 3}, {1, 2, 3, 4, 5, 6})});
            }),
            "input 'x' has shape [2,3]: dim 1 is 3, expected 2");
}

TEST(InterpreterErrorTest, WrongRank) {
  Module m = two_input_module();
  EXPECT_EQ(error_of([&] {
              run(m, {zeros_i64({2, 3, 1}), zeros_i64({2, 1}), F({2, 2}, {1, 2, 3, 4})});
            }),
            "input 'src' has shape [2,3,1]: rank 3, expected 2 (i64[B,S])");
}

TEST(InterpreterErrorTest, WrongDtype) {
  Module m = two_input_module();
  EXPECT_EQ(
      error_of([&] {
        run(m, {Tensor::zeros(DType::f32, {2, 3}), zeros_i64({2, 1}), F({2, 2}, {1, 2, 3, 4})});
      }),
      "input 'src' has type f32[2,3], expected i64[B,S]");
  EXPECT_EQ(error_of([&] {
              run(m, {zeros_i64({2, 3}), zeros_i64({2, 1}), I({2, 2}, {1, 2, 3, 4})});
            }),
            "input 'x' has type i64[2,2], expected f32[B,2]");
}

TEST(InterpreterErrorTest, WrongInputCount) {
  Module m = two_input_module();
  EXPECT_EQ(error_of([&] {
              run(m, {zeros_i64({2, 3})});
            }),
            "function 'forward' takes 3 input(s), got 1");
}

TEST(InterpreterErrorTest, BadInputData) {
  Module m = two_input_module();
  Tensor short_data = F({2, 2}, {1, 2, 3, 4});
  short_data.f.pop_back();
  EXPECT_EQ(error_of([&] {
              run(m, {zeros_i64({2, 3}), zeros_i64({2, 1}), short_data});
            }),
            "input 'x' has type f32[2,2] (4 elements) but holds 3 values");
  // An i64 value that does not fit an i32 parameter.
  Module m32;
  m32.symbols = {{"S", 4}};
  Function f;
  f.name = "f";
  ValueId ids = f.add_param("ids", I32({Sym("S")}));
  f.results.push_back(f.add_op(OpKind::neg, {ids}, I32({Sym("S")})));
  m32.functions.push_back(f);
  EXPECT_THAT(run(m32, {I({2}, {1, -2})})[0].ints, ElementsAre(-1, 2));
  EXPECT_EQ(run(m32, {I({2}, {1, -2})})[0].dtype, DType::i32);
  EXPECT_EQ(error_of([&] {
              run(m32, {I({2}, {1, int64_t{1} << 40})});
            }),
            "input 'ids' holds 1099511627776 at [1], which does not fit in i32");
}

TEST(InterpreterErrorTest, BoolInputMustBeZeroOrOne) {
  Tensor mask = B({2}, {1, 0});
  Module m = one_op_module(OpKind::logical_not, {mask}, Bool({C(2)}));
  EXPECT_THAT(run(m, {mask})[0].ints, ElementsAre(0, 1));
  mask.ints[1] = 2;
  EXPECT_EQ(error_of([&] { run(m, {mask}); }), "input 'x0' is bool but holds 2 at [1]");
}

TEST(InterpreterErrorTest, UnverifiedFunctionIsRejected) {
  // matmul declared with the wrong result type: an error, not a crash.
  Module m;
  Function f;
  f.name = "f";
  ValueId a = f.add_param("a", F32({C(2), C(3)}));
  ValueId b = f.add_param("b", F32({C(3), C(2)}));
  f.results.push_back(f.add_op(OpKind::matmul, {a, b}, F32({C(2), C(3)})));
  m.functions.push_back(f);
  EXPECT_THAT(error_of([&] {
                interpret(m, m.functions[0], {},
                          {F({2, 3}, {1, 2, 3, 4, 5, 6}), F({3, 2}, {1, 2, 3, 4, 5, 6})});
              }),
              HasSubstr("function 'f' is not valid (run the verifier): op 0 (matmul)"));
  // An operand that is used before it is defined.
  Module m2;
  Function g;
  g.name = "g";
  g.values.push_back(Value{"x", F32({})});
  g.results.push_back(g.add_op(OpKind::neg, {0}, F32({})));
  m2.functions.push_back(g);
  EXPECT_THAT(error_of([&] { interpret(m2, m2.functions[0], {}, {}); }),
              HasSubstr("uses value 0 before it is defined"));
}

TEST(InterpreterErrorTest, UnboundSymbol) {
  Module m;
  m.symbols = {{"S", 4}};
  Function f;
  f.name = "f";
  f.results.push_back(f.add_op(OpKind::iota, {}, I64({Sym("S")}), {{"axis", int64_t{0}}}));
  m.functions.push_back(f);
  EXPECT_EQ(
      error_of([&] { run(m, {}); }),
      "function 'f', op 0 (%0 = iota): its type i64[S] uses symbol 'S', which no input binds");
}

TEST(InterpreterErrorTest, MissingWeightInModel) {
  Module m = embedding_module();
  EXPECT_EQ(error_of([&] { run(m, {I({1, 1}, {0})}, {}); }), "weight 'emb' was not loaded");
}

// Issue 25: the interpreter's memory limit, over a family of random chains. Each op reads
// the previous value and, at random, one earlier value; the test computes the peak of the
// values live at once (inputs, then each result beside its live operands, every value
// freed after its last reader) by itself. A limit one byte below the peak is refused before
// any op runs, naming the peak op and the total; the peak itself runs and gives the same
// results as an unlimited run.
TEST(InterpreterTest, MemoryLimitIsCheckedBeforeAnyOpRuns) {
  std::mt19937 rng(25);
  for (int round = 0; round < 12; ++round) {
    const int n = std::uniform_int_distribution<int>(1, 8)(rng);
    const int64_t size = std::uniform_int_distribution<int64_t>(1, 5000)(rng);
    std::vector<std::vector<int>> reads(n);
    for (int i = 0; i < n; ++i) {
      reads[i].push_back(i);
      if (i > 0 && rng() % 2) reads[i].push_back(std::uniform_int_distribution<int>(0, i - 1)(rng));
    }
    std::string text =
        fmt::format("module @m {{\n  func @f(%v0: f32[{}]) -> (f32[{}]) {{\n", size, size);
    for (int i = 0; i < n; ++i)
      text += fmt::format("    %v{} = {} : f32[{}]\n", i + 1,
                          reads[i].size() == 1
                              ? fmt::format("exp(%v{})", reads[i][0])
                              : fmt::format("add(%v{}, %v{})", reads[i][0], reads[i][1]),
                          size);
    text += fmt::format("    return %v{}\n  }}\n}}\n", n);
    SCOPED_TRACE(text);
    const Module m = parse_module(text);
    // The peak, computed here independently of the interpreter.
    std::vector<int> last(n + 1, -1);
    for (int i = 0; i < n; ++i)
      for (int v : reads[i]) last[v] = i;
    last[n] = n;
    const int64_t bytes = 4 * size;
    int64_t live = bytes, peak = bytes;
    int peak_op = -1;
    for (int i = 0; i < n; ++i) {
      live += bytes;
      if (live > peak) peak = live, peak_op = i;
      for (int v = 0; v <= i; ++v)
        if (last[v] == i) live -= bytes;
    }
    const std::vector<Tensor> in = {F({size}, noise(static_cast<size_t>(size), round))};
    InterpretOptions limited;
    limited.max_bytes = peak - 1;
    const std::string error = error_of([&] { interpret(m, m.functions[0], {}, in, limited); });
    EXPECT_THAT(error, HasSubstr(fmt::format("the interpreter needs {} bytes for the values live "
                                             "at this op, above its limit of {} bytes",
                                             peak, peak - 1)));
    if (peak_op >= 0)
      EXPECT_THAT(error, HasSubstr(fmt::format("op {} (%v{} = ", peak_op, peak_op + 1)));
    limited.max_bytes = peak;
    const std::vector<Tensor> got = interpret(m, m.functions[0], {}, in, limited);
    const std::vector<Tensor> want = interpret(m, m.functions[0], {}, in, InterpretOptions{});
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].f, want[0].f);
  }
}

// topk as torch.topk(x, k).indices: largest first, ties to the lower index, NaN first; integers
// too.
TEST(InterpreterIndexing, TopkOrderTiesAndNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = F({2, 5}, {1, 3, 3, -1, 2, nan, 0, nan, 5, -2});
  EXPECT_EQ(run_op(OpKind::topk, {x}, I64({C(2), C(3)}), {{"k", int64_t{3}}}).ints,
            (std::vector<int64_t>{1, 2, 4, 0, 2, 3}));
  EXPECT_EQ(
      run_op(OpKind::topk, {I({1, 4}, {7, -3, 7, 9})}, I64({C(1), C(4)}), {{"k", int64_t{4}}}).ints,
      (std::vector<int64_t>{3, 0, 2, 1}));
  // A symbolic last axis shorter than k is refused at run time.
  Module m = one_op_module(OpKind::topk, {x}, I64({C(2), C(3)}), {{"k", int64_t{3}}});
  m.symbols.push_back({"N", 5});
  Function& f = m.functions[0];
  f.values[f.params[0]].type = F32({C(2), Sym("N")});
  EXPECT_THAT(error_of([&] {
                interpret(m, f, {}, {F({2, 2}, {1, 2, 3, 4})});
              }),
              HasSubstr("k = 3 exceeds the last axis of f32[2,2]"));
}

// take_along_axis as torch.gather; scatter_add as torch.scatter_add, in row-major order.
TEST(InterpreterIndexing, TakeAlongAxisAndScatterAdd) {
  Tensor x = F({2, 3}, {10, 11, 12, 20, 21, 22});
  EXPECT_EQ(run_op(OpKind::take_along_axis, {x, I({2, 2}, {2, 0, 1, 1})}, F32({C(2), C(2)}),
                   {{"axis", int64_t{-1}}})
                .f,
            (std::vector<float>{12, 10, 21, 21}));
  EXPECT_EQ(run_op(OpKind::take_along_axis, {x, I({1, 3}, {1, 0, 1})}, F32({C(1), C(3)}),
                   {{"axis", int64_t{0}}})
                .f,
            (std::vector<float>{20, 11, 22}));
  EXPECT_THAT(error_of([&] {
                run_op(OpKind::take_along_axis, {x, I({2, 1}, {0, 3})}, F32({C(2), C(1)}),
                       {{"axis", int64_t{1}}});
              }),
              HasSubstr("index 3 at 'x1'[1,0] is out of range [0, 3)"));
  Tensor base = F({2, 3}, {1, 1, 1, 1, 1, 1});
  EXPECT_EQ(run_op(OpKind::scatter_add, {base, I({2, 2}, {2, 2, 0, 1}), F({2, 2}, {1, 2, 3, 4})},
                   F32({C(2), C(3)}), {{"axis", int64_t{1}}})
                .f,
            (std::vector<float>{1, 1, 4, 4, 5, 1}));
  EXPECT_EQ(run_op(OpKind::scatter_add,
                   {I({2, 2}, {0, 0, 0, 0}), I({3, 2}, {1, 0, 1, 1, 0, 0}),
                    I({3, 2}, {5, 6, 7, 8, 9, 10})},
                   I64({C(2), C(2)}), {{"axis", int64_t{0}}})
                .ints,
            (std::vector<int64_t>{9, 16, 12, 8}));
  EXPECT_THAT(error_of([&] {
                run_op(OpKind::scatter_add, {base, I({2, 1}, {-1, 0}), F({2, 1}, {1, 2})},
                       F32({C(2), C(3)}), {{"axis", int64_t{1}}});
              }),
              HasSubstr("index -1 at 'x1'[0,0] is out of range [0, 3)"));
}

// moe_ffn against its formula written out, with the experts it ran counted: only those chosen.
TEST(InterpreterIndexing, MoeFfnRunsOnlyTheChosenExperts) {
  const int64_t T = 3, D = 2, Fh = 3, E = 4, K = 2;
  std::vector<Tensor> in = {F({T, D}, {0.5f, -1, 2, 0.25f, -0.5f, 1}),
                            I({T, K}, {2, 0, 2, 3, 0, 2}),
                            F({T, K}, {0.75f, 0.25f, 0.5f, 0.5f, 1, 0})};
  for (int64_t e = 0; e < E; ++e) {
    in.push_back(F({Fh, D}, noise(Fh * D, static_cast<int>(3 * e))));
    in.push_back(F({Fh, D}, noise(Fh * D, static_cast<int>(3 * e + 1))));
    in.push_back(F({D, Fh}, noise(D * Fh, static_cast<int>(3 * e + 2))));
  }
  const Module m = one_op_module(OpKind::moe_ffn, in, F32({C(T), C(D)}), {{"experts", E}});
  InterpretCounters counters;
  InterpretOptions options;
  options.counters = &counters;
  const Tensor y = interpret(m, m.functions[0], {}, in, options).at(0);
  EXPECT_EQ(counters.moe_experts_run, 3);  // experts 0, 2, 3; expert 1 never runs
  EXPECT_EQ(counters.moe_expert_rows, T * K);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) {
      double want = 0;
      for (int64_t s = 0; s < K; ++s) {
        const int64_t e = in[1].ints[t * K + s];
        const Tensor &w1 = in[3 + 3 * e], &w3 = in[4 + 3 * e], &w2 = in[5 + 3 * e];
        double yi = 0;
        for (int64_t j = 0; j < Fh; ++j) {
          double a = 0, b = 0;
          for (int64_t q = 0; q < D; ++q) {
            a += w1.f[j * D + q] * in[0].f[t * D + q];
            b += w3.f[j * D + q] * in[0].f[t * D + q];
          }
          yi += w2.f[i * Fh + j] * (a / (1 + std::exp(-a))) * b;
        }
        want += in[2].f[t * K + s] * yi;
      }
      EXPECT_NEAR(y.f[t * D + i], want, 1e-5) << t << "," << i;
    }
  in[1].ints[3] = 4;
  EXPECT_THAT(error_of([&] { interpret(m, m.functions[0], {}, in); }),
              HasSubstr("expert id 4 at 'x1'[1,1] is out of range [0, 4)"));
}

}  // namespace
}  // namespace kiln::ir
