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
#include "tests/pass_harness.h"

namespace kiln {
namespace {

using ir::Dim;
using ir::DType;
using ir::OpKind;
using ir::TensorType;

using kiln::testing::error_of;

using testing::c;
using testing::f32;
using testing::projection_module;
using testing::sym;

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
