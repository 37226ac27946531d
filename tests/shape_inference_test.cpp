// Tests of shape-inference: error messages on inconsistent types, built through the C++
// API since the parser's verifier would reject them first.
#include <gtest/gtest.h>

#include <string>

#include "error_of.h"
#include "frontend/models.h"
#include "ir/ir.h"
#include "ir/printer.h"
#include "passes/shape_inference.h"
#include "support/error.h"

namespace kiln {
namespace {

using ir::Dim;
using ir::DType;
using ir::OpKind;
using ir::TensorType;

using kiln::testing::error_of;

TensorType f32(std::vector<Dim> shape) { return TensorType{DType::f32, std::move(shape)}; }
Dim sym(const char* s) { return Dim::sym(s); }
Dim c(int64_t v) { return Dim::constant(v); }

// A module with one function `forward(x: f32[B,S,24])`: x · transpose(w) with w
// f32[out,24]; the matmul's declared type is `declared`.
ir::Module projection_module(const TensorType& declared) {
  ir::Module m;
  m.name = "m";
  m.symbols = {{"B", 4}, {"S", 16}};
  m.declare_weight("w", f32({c(24), c(24)}));
  ir::Function& f = m.functions.emplace_back();
  f.name = "forward";
  ir::ValueId x = f.add_param("x", f32({sym("B"), sym("S"), c(24)}));
  ir::ValueId w = f.add_op(OpKind::weight, {}, f32({c(24), c(24)}), {{"name", std::string("w")}});
  ir::ValueId wt =
      f.add_op(OpKind::transpose, {w}, f32({c(24), c(24)}), {{"perm", std::vector<int64_t>{1, 0}}});
  ir::ValueId y = f.add_op(OpKind::matmul, {x, wt}, declared);
  f.values[y].name = "y";
  f.results = {y};
  return m;
}

TEST(ShapeInferenceTest, AcceptsTinyTransformerUnchanged) {
  ir::Module m = models::build_model("transformer", "tiny");
  const std::string before = ir::print_module(m);
  EXPECT_FALSE(passes::shape_inference(m));
  EXPECT_EQ(ir::print_module(m), before);
}

TEST(ShapeInferenceTest, AcceptsConsistentHandBuiltModule) {
  ir::Module m = projection_module(f32({sym("B"), sym("S"), c(24)}));
  EXPECT_NO_THROW(passes::shape_inference(m));
}

TEST(ShapeInferenceTest, ReportsWrongResultType) {
  ir::Module m = projection_module(f32({sym("B"), sym("S"), c(7)}));
  EXPECT_EQ(error_of([&] { passes::shape_inference(m); }),
            "shape inference: in function 'forward', op 2 (matmul): result type is "
            "f32[B,S,7], expected f32[B,S,24]");
}

TEST(ShapeInferenceTest, ReportsWrongSymbolAndDtype) {
  // The same op with a symbol swapped (T for S), then with the wrong dtype.
  ir::Module m = projection_module(f32({sym("B"), sym("T"), c(24)}));
  m.symbols.push_back({"T", 16});
  EXPECT_EQ(error_of([&] { passes::shape_inference(m); }),
            "shape inference: in function 'forward', op 2 (matmul): result type is "
            "f32[B,T,24], expected f32[B,S,24]");
  ir::Module m2 = projection_module(TensorType{DType::i64, {sym("B"), sym("S"), c(24)}});
  EXPECT_EQ(error_of([&] { passes::shape_inference(m2); }),
            "shape inference: in function 'forward', op 2 (matmul): result type is "
            "i64[B,S,24], expected f32[B,S,24]");
}

TEST(ShapeInferenceTest, ReportsRuleRejection) {
  ir::Module m = projection_module(f32({sym("B"), sym("S"), c(24)}));
  ir::Function& f = m.functions[0];
  // An add whose operands do not broadcast: the rule's own message is reported.
  ir::ValueId bad = f.add_param("z", f32({sym("B"), sym("S"), c(5)}));
  ir::ValueId sum = f.add_op(OpKind::add, {f.results[0], bad}, f32({sym("B"), sym("S"), c(24)}));
  f.results = {sum};
  EXPECT_EQ(error_of([&] { passes::shape_inference(m); }),
            "shape inference: in function 'forward', op 3 (add): operand shapes [B,S,24] and "
            "[B,S,5] do not broadcast");
}

TEST(ShapeInferenceTest, ReportsStructuralProblems) {
  // An operand defined after its use.
  ir::Module m = projection_module(f32({sym("B"), sym("S"), c(24)}));
  std::swap(m.functions[0].ops[1], m.functions[0].ops[2]);
  EXPECT_EQ(error_of([&] { passes::shape_inference(m); }),
            "shape inference: in function 'forward', op 1 (matmul): operand 2 is not defined "
            "before the op");
  // A symbol the module does not declare.
  ir::Module m2 = projection_module(f32({sym("B"), sym("Q"), c(24)}));
  EXPECT_EQ(error_of([&] { passes::shape_inference(m2); }),
            "shape inference: in function 'forward', op 2 (matmul): type f32[B,Q,24] uses "
            "undeclared symbol 'Q'");
}

}  // namespace
}  // namespace kiln
