// Tests of the IR verifier (ir/verifier.h): one module per invariant V1..V10 that breaks
// exactly that invariant, the type rules of op_types.cpp, and diagnostic formatting.
#include "ir/verifier.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ir/interpreter.h"
#include "ir/parser.h"
#include "support/error.h"

namespace kiln::ir {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string all_messages(const std::vector<Diagnostic>& diags) {
  std::string out;
  for (const Diagnostic& d : diags) out += d.message + "\n";
  return out;
}

// The message of the only diagnostic of `m`, or a description of what was found instead.
std::string only_message(const Module& m) {
  const std::vector<Diagnostic> diags = verify(m);
  if (diags.size() != 1)
    return "expected exactly one diagnostic, got " + std::to_string(diags.size()) + ":\n" +
           all_messages(diags);
  return diags[0].message;
}

std::string only_message(const std::string& text) { return only_message(parse_module(text)); }

TensorType f32(std::vector<int64_t> dims) {
  TensorType t{DType::f32, {}};
  for (int64_t d : dims) t.shape.push_back(Dim::constant(d));
  return t;
}

// A module with one function @f(%x: f32[2]) -> (f32[2]) whose body `%y = relu(%x)`.
Module relu_module() {
  Module m;
  m.name = "m";
  Function f;
  f.name = "f";
  const ValueId x = f.add_param("x", f32({2}));
  f.results.push_back(f.add_op(OpKind::relu, {x}, f32({2})));
  m.functions.push_back(std::move(f));
  return m;
}

TEST(Verifier, AcceptsValidModules) {
  EXPECT_EQ(all_messages(verify(relu_module())), "");
  EXPECT_EQ(all_messages(verify(parse_module(R"(module @m {
  symbol B max 2
  weight @a : f32[2,3]
  weight @b : f32[1,3]
  weight @ab : f32[3,3] = concat(@a, @b) {axis = 0}
  func @f(%x: f32[B,3]) -> (f32[B,3]) {
    %w = weight() {name = "ab"} : f32[3,3]
    %y = matmul(%x, %w) : f32[B,3]
    return %y
  }
}
)"))),
            "");
}

// ---------------------------------------------------------------------------------------
// One test per invariant.

TEST(VerifierInvariants, V1SymbolMaximumAndUniqueness) {
  EXPECT_THAT(only_message("module @m {\n  symbol S max 0\n}\n"),
              AllOf(HasSubstr("[V1]"), HasSubstr("symbol 'S' has maximum 0, expected >= 1")));
  EXPECT_THAT(only_message("module @m {\n  symbol S max 2\n  symbol S max 3\n}\n"),
              AllOf(HasSubstr("[V1]"), HasSubstr("symbol 'S' is declared twice")));
  Module m;
  m.symbols.push_back(Symbol{"2x", 4});
  EXPECT_THAT(only_message(m),
              AllOf(HasSubstr("[V1]"), HasSubstr("symbol name '2x' is not an identifier")));
}

TEST(VerifierInvariants, V2WeightsUniqueAndStatic) {
  EXPECT_THAT(only_message("module @m {\n  symbol S max 4\n  weight @w : f32[S,4]\n}\n"),
              AllOf(HasSubstr("[V2]"), HasSubstr("weight 'w' has symbolic type f32[S,4]")));
  EXPECT_THAT(only_message("module @m {\n  weight @w : f32[4]\n  weight @w : f32[4]\n}\n"),
              AllOf(HasSubstr("[V2]"), HasSubstr("weight 'w' is declared twice")));
}

TEST(VerifierInvariants, V3FunctionsUniqueWithResults) {
  EXPECT_THAT(only_message(R"(module @m {
  func @f(%x: f32[2]) -> (f32[2]) {
    return %x
  }
  func @f(%x: f32[2]) -> (f32[2]) {
    return %x
  }
}
)"),
              AllOf(HasSubstr("[V3]"), HasSubstr("function 'f' is defined twice")));
  Module m = relu_module();
  m.functions[0].results.clear();
  EXPECT_THAT(only_message(m), AllOf(HasSubstr("[V3]"), HasSubstr("function 'f' has no results")));
}

TEST(VerifierInvariants, V4ValueIdsExist) {
  Module m = relu_module();
  m.functions[0].ops[0].operands = {42};
  EXPECT_THAT(only_message(m),
              AllOf(HasSubstr("[V4]"), HasSubstr("relu: operand refers to missing value 42")));

  m = relu_module();
  m.functions[0].results = {7};
  EXPECT_THAT(only_message(m),
              AllOf(HasSubstr("[V4]"), HasSubstr("return refers to missing value 7")));

  m = relu_module();
  m.functions[0].params.push_back(-3);
  EXPECT_THAT(only_message(m),
              AllOf(HasSubstr("[V4]"), HasSubstr("parameter refers to missing value -3")));
}

TEST(VerifierInvariants, V5SingleDefinitionBeforeUse) {
  // %a = relu(%b); %b = relu(%x): %b is used before its definition.
  Module m;
  Function f;
  f.name = "f";
  const ValueId x = f.add_param("x", f32({2}));
  const ValueId a = f.add_value(f32({2}), "a");
  const ValueId b = f.add_value(f32({2}), "b");
  f.ops.push_back(Op{OpKind::relu, a, {b}, {}});
  f.ops.push_back(Op{OpKind::relu, b, {x}, {}});
  f.results = {a};
  m.functions.push_back(f);
  EXPECT_THAT(only_message(m),
              AllOf(HasSubstr("[V5]"), HasSubstr("relu: operand %b is used before it is defined")));

  // Two ops define %y.
  m = relu_module();
  m.functions[0].ops.push_back(m.functions[0].ops[0]);
  EXPECT_THAT(only_message(m), AllOf(HasSubstr("[V5]"), HasSubstr("is defined 2 times")));

  // A value nothing defines.
  m = relu_module();
  m.functions[0].add_value(f32({2}), "orphan");
  EXPECT_THAT(only_message(m),
              AllOf(HasSubstr("[V5]"), HasSubstr("value %orphan is defined 0 times")));
}

TEST(VerifierInvariants, V6ValueNamesUnique) {
  Module m = relu_module();
  m.functions[0].values[1].name = "x";  // the relu result takes the parameter's name
  EXPECT_THAT(only_message(m),
              AllOf(HasSubstr("[V6]"), HasSubstr("value name '%x' is used twice")));
}

TEST(VerifierInvariants, V7SymbolsDeclared) {
  EXPECT_THAT(only_message(R"(module @m {
  func @f(%x: f32[Q,4]) -> (f32[Q,4]) {
    return %x
  }
}
)"),
              AllOf(HasSubstr("[V7]"), HasSubstr("type f32[Q,4] uses undeclared symbol 'Q'")));
  EXPECT_THAT(only_message(R"(module @m {
  symbol S max 8
  func @f() -> (i64[S,T]) {
    %pos = iota() {axis = 1} : i64[S,T]
    return %pos
  }
}
)"),
              AllOf(HasSubstr("[V7]"), HasSubstr("type i64[S,T] uses undeclared symbol 'T'")));
}

TEST(VerifierInvariants, V8TypeRules) {
  EXPECT_THAT(only_message(R"(module @m {
  func @f(%x: f32[2]) -> (f32[3]) {
    %y = relu(%x) : f32[3]
    return %y
  }
}
)"),
              AllOf(HasSubstr("[V8]"), HasSubstr("relu: result type is f32[3], expected f32[2]")));
  EXPECT_THAT(only_message(R"(module @m {
  func @f(%x: f32[2]) -> (f32[2]) {
    %y = add(%x) : f32[2]
    return %y
  }
}
)"),
              AllOf(HasSubstr("[V8]"), HasSubstr("add: expects 2 operand(s), got 1")));
}

TEST(VerifierInvariants, V9WeightDerivations) {
  EXPECT_THAT(only_message(R"(module @m {
  weight @a : f32[2,3]
  weight @w : f32[4,3] = stack(@a, @a) {axis = 0}
}
)"),
              AllOf(HasSubstr("[V9]"), HasSubstr("weight 'w' has an unknown derivation 'stack'")));
  EXPECT_THAT(
      only_message(R"(module @m {
  weight @a : f32[2,3]
  weight @w : f32[4,3] = concat(@a, @zz) {axis = 0}
}
)"),
      AllOf(HasSubstr("[V9]"),
            HasSubstr("weight 'w' derives from 'zz', which is not a declared plain weight")));
  EXPECT_THAT(
      only_message(R"(module @m {
  weight @a : f32[2,3]
  weight @aa : f32[4,3] = concat(@a, @a) {axis = 0}
  weight @w : f32[6,3] = concat(@aa, @a) {axis = 0}
}
)"),
      AllOf(HasSubstr("[V9]"), HasSubstr("derives from 'aa', which is not a declared plain")));
  EXPECT_THAT(only_message(R"(module @m {
  weight @a : f32[2,3]
  weight @b : f32[2,3]
  weight @w : f32[5,3] = concat(@a, @b) {axis = 0}
}
)"),
              AllOf(HasSubstr("[V9]"),
                    HasSubstr("weight 'w' has type f32[5,3], its derivation gives f32[4,3]")));
  EXPECT_THAT(only_message(R"(module @m {
  weight @a : f32[2,3]
  weight @w : f32[4,3] = concat(@a, @a) {axis = 2}
}
)"),
              AllOf(HasSubstr("[V9]"), HasSubstr("weight 'w': concat axis 2 out of range")));
  // transpose(@W) {perm = [1, 0]}: an [in, out] weight read as a linear's [out, in].
  EXPECT_EQ(only_message(R"(module @m {
  weight @a : f32[2,3]
  weight @a.T : f32[3,2] = transpose(@a) {perm = [1, 0]}
}
)"),
            "expected exactly one diagnostic, got 0:\n");
  EXPECT_THAT(only_message(R"(module @m {
  weight @a : f32[2,3]
  weight @a.T : f32[2,3] = transpose(@a) {perm = [1, 0]}
}
)"),
              AllOf(HasSubstr("[V9]"),
                    HasSubstr("weight 'a.T' has type f32[2,3], its derivation gives f32[3,2]")));
  EXPECT_THAT(only_message(R"(module @m {
  weight @a : f32[2,3,4]
  weight @a.T : f32[3,2,4] = transpose(@a) {perm = [1, 0, 2]}
}
)"),
              AllOf(HasSubstr("[V9]"),
                    HasSubstr("weight 'a.T': transpose of a weight of rank other than 2")));
}

// materialize_weights builds a transpose(@W) weight from the loaded W.
TEST(VerifierInvariants, TransposedWeightsMaterialize) {
  const ir::Module m = parse_and_verify(R"(module @m {
  weight @a : f32[2,3]
  weight @a.T : f32[3,2] = transpose(@a) {perm = [1, 0]}
}
)");
  ir::WeightMap w;
  w["a"] = ir::Tensor::from_f32({2, 3}, {1, 2, 3, 4, 5, 6});
  ir::materialize_weights(m, w);
  EXPECT_EQ(w.at("a.T").shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(w.at("a.T").f, (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

// The message of the only diagnostic of a module with weight @w : f32[2,4] and one function
// @f`signature` whose body is `op_line` (defining %y) and `return %y`.
std::string one_op_message(const std::string& signature, const std::string& op_line) {
  return only_message("module @m {\n  weight @w : f32[2,4]\n  func @f" + signature + " {\n    " +
                      op_line + "\n    return %y\n  }\n}\n");
}

TEST(VerifierInvariants, V10AttributeTypesAndRanges) {
  // Each case: an op whose attributes break V10 in one way, and the message expected.
  const std::string x = "(%x: f32[2,4]) -> (f32[2,4])";
  const std::string none = "() -> (f32[2,4])";
  const std::string qkv = "(%x: f32[2,4,8]) -> (f32[2,4,8])";
  const std::string lin = "(%x: f32[2,4]) -> (f32[2,2])";
  const std::string red = "(%x: f32[2,4]) -> (f32[2])";
  const std::string sliced = "(%x: f32[2,4]) -> (f32[2,2])";
  const std::string norm = "(%x: f32[2,4], %g: f32[4]) -> (f32[2,4])";
  struct Case {
    std::string signature, op, message;
  };
  const std::vector<Case> cases = {
      {x, "%y = relu(%x) {axis = 0} : f32[2,4]", "relu: unexpected attribute 'axis'"},
      {qkv, "%y = attention(%x, %x, %x) {causal = \"yes\", heads = 2, scale = 0.5} : f32[2,4,8]",
       "attention: attribute 'causal' must be an integer, got string \"yes\""},
      {qkv, "%y = attention(%x, %x, %x) {causal = 1.0, heads = 2, scale = 0.5} : f32[2,4,8]",
       "attention: attribute 'causal' must be an integer, got number 1"},
      {qkv, "%y = attention(%x, %x, %x) {heads = 2.5, scale = 0.5} : f32[2,4,8]",
       "attention: attribute 'heads' must be an integer, got number 2.5"},
      {qkv, "%y = attention(%x, %x, %x) {heads = 0, scale = 0.5} : f32[2,4,8]",
       "attention: attribute 'heads' must be >= 1, got 0"},
      {qkv, "%y = attention(%x, %x, %x) {heads = 2, scale = nan} : f32[2,4,8]",
       "attention: attribute 'scale' must be finite, got nan"},
      {qkv, "%y = attention(%x, %x, %x) {heads = 2, scale = \"big\"} : f32[2,4,8]",
       "attention: attribute 'scale' must be a number, got string \"big\""},
      {qkv, "%y = attention(%x, %x, %x) {heads = 2} : f32[2,4,8]",
       "attention: needs attribute 'scale' (a number)"},
      {x, "%y = softmax(%x) {axis = [1]} : f32[2,4]",
       "softmax: attribute 'axis' must be an integer, got integer list [1]"},
      {x, "%y = softmax(%x) : f32[2,4]", "softmax: needs attribute 'axis' (an integer)"},
      {"(%x: f32[2,4]) -> (i64[2])", "%y = argmax(%x) {axis = \"last\"} : i64[2]",
       "argmax: attribute 'axis' must be an integer, got string \"last\""},
      {"(%x: f32[2,4]) -> (f32[4,2])", "%y = transpose(%x) {perm = 1} : f32[4,2]",
       "transpose: attribute 'perm' must be an integer list, got integer 1"},
      {red, "%y = reduce_sum(%x) {axes = [1], keepdims = 2} : f32[2]",
       "reduce_sum: attribute 'keepdims' must be 0 or 1, got 2"},
      {red, "%y = reduce_max(%x) {axes = [1], keepdims = \"no\"} : f32[2]",
       "reduce_max: attribute 'keepdims' must be an integer, got string \"no\""},
      {red, "%y = reduce_mean(%x) {axes = 1} : f32[2]",
       "reduce_mean: attribute 'axes' must be an integer list, got integer 1"},
      {sliced, "%y = slice(%x) {axis = 1, start = -1} : f32[2,2]",
       "slice: attribute 'start' must be >= 0, got -1"},
      {sliced, "%y = slice(%x) {axis = 1} : f32[2,2]",
       "slice: needs attribute 'start' (an integer)"},
      {"(%x: f32[2,4]) -> (f32[4,4])", "%y = concat(%x, %x) {axis = 0.0} : f32[4,4]",
       "concat: attribute 'axis' must be an integer, got number 0"},
      {"() -> (i64[2,4])", "%y = iota() {axis = \"0\"} : i64[2,4]",
       "iota: attribute 'axis' must be an integer, got string \"0\""},
      {none, "%y = weight() {name = 3} : f32[2,4]",
       "weight: attribute 'name' must be a string, got integer 3"},
      {none, "%y = constant() {value = \"one\"} : f32[2,4]",
       "constant: attribute 'value' must be a number, got string \"one\""},
      {none, "%y = constant() : f32[2,4]", "constant: needs attribute 'value' (a number)"},
      {lin, "%w = weight() {name = \"w\"} : f32[2,4]\n    %y = linear(%x, %w) {act = 1} : f32[2,2]",
       "linear: attribute 'act' must be a string, got integer 1"},
      {lin, "%w = weight() {name = \"w\"} : f32[2,4]\n    %y = linear(%x, %w) : f32[2,2]",
       "linear: needs attribute 'act' (a string)"},
      {norm, "%y = layernorm(%x, %g, %g) {eps = inf} : f32[2,4]",
       "layernorm: attribute 'eps' must be positive and finite, got inf"},
      {norm, "%y = layernorm(%x, %g, %g) {eps = -1} : f32[2,4]",
       "layernorm: attribute 'eps' must be positive and finite, got -1"},
      {norm, "%y = add_layernorm(%x, %x, %g, %g) {eps = \"small\"} : f32[2,4]",
       "add_layernorm: attribute 'eps' must be a number, got string \"small\""},
      {norm, "%y = layernorm(%x, %g, %g) {eps = 1e-06, unbiased = 2} : f32[2,4]",
       "layernorm: attribute 'unbiased' must be 0 or 1, got 2"},
      {norm, "%y = add_layernorm(%x, %x, %g, %g) {eps = 1e-06, unbiased = -1} : f32[2,4]",
       "add_layernorm: attribute 'unbiased' must be 0 or 1, got -1"},
      {norm, "%y = layernorm(%x, %g, %g) {eps = 1e-06, unbiased = 1.0} : f32[2,4]",
       "layernorm: attribute 'unbiased' must be an integer, got number 1"},
      {norm, "%y = layernorm(%x, %g, %g) {eps = 1e-06, eps_outside = 2} : f32[2,4]",
       "layernorm: attribute 'eps_outside' must be 0 or 1, got 2"},
      {norm, "%y = add_layernorm(%x, %x, %g, %g) {eps = 1e-06, eps_outside = \"yes\"} : f32[2,4]",
       "add_layernorm: attribute 'eps_outside' must be an integer, got string \"yes\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    EXPECT_THAT(one_op_message(c.signature, c.op), HasSubstr("[V10] " + c.message));
  }
  // The same ops with the attribute fixed verify: the table tests V10 and nothing else.
  const std::string valid = "expected exactly one diagnostic, got 0:\n";
  EXPECT_EQ(one_op_message(qkv,
                           "%y = attention(%x, %x, %x) {causal = 1, heads = 2, scale = 0.5} : "
                           "f32[2,4,8]"),
            valid);
  EXPECT_EQ(one_op_message(red, "%y = reduce_sum(%x) {axes = [1], keepdims = 0} : f32[2]"), valid);
  EXPECT_EQ(one_op_message(lin,
                           "%w = weight() {name = \"w\"} : f32[2,4]\n    %y = linear(%x, %w) "
                           "{act = \"relu\"} : f32[2,2]"),
            valid);
  EXPECT_EQ(one_op_message(norm, "%y = layernorm(%x, %g, %g) {eps = 1e-05} : f32[2,4]"), valid);
  EXPECT_EQ(one_op_message(norm,
                           "%y = add_layernorm(%x, %x, %g, %g) {eps = 1e-06, eps_outside = 1, "
                           "unbiased = 1} : f32[2,4]"),
            valid);
}

// An i32 constant's value must fit i32 (the interpreter and the kernels store it as one).
TEST(VerifierTypeRules, I32ConstantRange) {
  EXPECT_THAT(one_op_message("() -> (i32[])", "%y = constant() {value = 2147483648} : i32[]"),
              AllOf(HasSubstr("[V8] constant"), HasSubstr("value 2147483648 does not fit i32")));
  EXPECT_EQ(one_op_message("() -> (i32[])", "%y = constant() {value = -2147483648} : i32[]"),
            "expected exactly one diagnostic, got 0:\n");
}

// A wrong attribute reaches no assertion: parse_and_verify reports it with its location.
TEST(VerifierFormatting, AttributeErrorsCarryTheirLocation) {
  const std::string text = R"(module @m {
  func @f(%q: f32[2,4,8]) -> (f32[2,4,8]) {
    %o = attention(%q, %q, %q) {causal = "yes", heads = 2, scale = 0.5} : f32[2,4,8]
    return %o
  }
}
)";
  try {
    parse_and_verify(text, "bad.kir");
    FAIL() << "parse_and_verify accepted causal = \"yes\"";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "bad.kir:3:5: error: [V10] attention: attribute 'causal' must be an integer, got "
              "string \"yes\"");
  }
}

// ---------------------------------------------------------------------------------------
// Type rules (op_types.cpp), each reported as a [V8] diagnostic.

// A module with symbols B, S, T, the given weights and one function @f.
std::string function_module(const std::string& signature, const std::string& body,
                            const std::string& weights = "") {
  return "module @m {\n  symbol B max 2\n  symbol S max 8\n  symbol T max 8\n" + weights +
         "  func @f" + signature + " {\n" + body + "  }\n}\n";
}

TEST(VerifierTypeRules, MatmulContractionMismatch) {
  EXPECT_THAT(
      only_message(function_module("(%a: f32[2,3], %b: f32[4,5]) -> (f32[2,5])",
                                   "    %c = matmul(%a, %b) : f32[2,5]\n"
                                   "    return %c\n")),
      AllOf(HasSubstr("[V8] matmul"), HasSubstr("contraction dims differ: f32[2,3] x f32[4,5]")));
  EXPECT_THAT(only_message(function_module("(%a: f32[2,3,4], %b: f32[5,4,6]) -> (f32[2,3,6])",
                                           "    %c = matmul(%a, %b) : f32[2,3,6]\n"
                                           "    return %c\n")),
              AllOf(HasSubstr("[V8] matmul"),
                    HasSubstr("batch dims of f32[2,3,4] and f32[5,4,6] do not broadcast")));
}

TEST(VerifierTypeRules, BroadcastFailure) {
  EXPECT_THAT(
      only_message(function_module("(%a: f32[2,3], %b: f32[4]) -> (f32[2,3])",
                                   "    %c = add(%a, %b) : f32[2,3]\n"
                                   "    return %c\n")),
      AllOf(HasSubstr("[V8] add"), HasSubstr("operand shapes [2,3] and [4] do not broadcast")));
  EXPECT_THAT(only_message(function_module("(%a: f32[B,S,4], %b: f32[B,T,4]) -> (bool[B,S,4])",
                                           "    %c = lt(%a, %b) : bool[B,S,4]\n"
                                           "    return %c\n")),
              AllOf(HasSubstr("[V8] lt"),
                    HasSubstr("operand shapes [B,S,4] and [B,T,4] do not broadcast")));
  EXPECT_THAT(only_message(function_module("(%a: f32[2], %b: i64[2]) -> (f32[2])",
                                           "    %c = mul(%a, %b) : f32[2]\n"
                                           "    return %c\n")),
              AllOf(HasSubstr("[V8] mul"), HasSubstr("operand dtypes differ: f32 and i64")));
}

TEST(VerifierTypeRules, ReshapeElementCountMismatch) {
  EXPECT_THAT(only_message(function_module("(%a: f32[2,3]) -> (f32[4,2])",
                                           "    %c = reshape(%a) : f32[4,2]\n"
                                           "    return %c\n")),
              AllOf(HasSubstr("[V8] reshape"),
                    HasSubstr("cannot reshape [2,3] to [4,2]: element counts differ")));
  EXPECT_THAT(only_message(function_module("(%a: f32[B,S,4]) -> (f32[B,T,4])",
                                           "    %c = reshape(%a) : f32[B,T,4]\n"
                                           "    return %c\n")),
              AllOf(HasSubstr("[V8] reshape"),
                    HasSubstr("cannot reshape [B,S,4] to [B,T,4]: element counts differ")));
}

TEST(VerifierTypeRules, TransposeBadPerm) {
  EXPECT_THAT(only_message(function_module("(%a: f32[2,3]) -> (f32[2,2])",
                                           "    %c = transpose(%a) {perm = [0, 0]} : f32[2,2]\n"
                                           "    return %c\n")),
              AllOf(HasSubstr("[V8] transpose"), HasSubstr("perm is not a permutation")));
  EXPECT_THAT(only_message(function_module("(%a: f32[2,3]) -> (f32[3,2])",
                                           "    %c = transpose(%a) {perm = [1, 0, 2]} : f32[3,2]\n"
                                           "    return %c\n")),
              AllOf(HasSubstr("[V8] transpose"), HasSubstr("perm has 3 entries for rank 2")));
}

TEST(VerifierTypeRules, LayernormGammaShape) {
  EXPECT_THAT(
      only_message(function_module("(%x: f32[B,4], %g: f32[3], %b: f32[4]) -> (f32[B,4])",
                                   "    %y = layernorm(%x, %g, %b) {eps = 1e-05} : f32[B,4]\n"
                                   "    return %y\n")),
      AllOf(HasSubstr("[V8] layernorm"), HasSubstr("gamma f32[3] and beta f32[4] must be f32[4]")));
  EXPECT_THAT(only_message(function_module("(%x: f32[B,4], %g: f32[4], %b: f32[4]) -> (f32[B,4])",
                                           "    %y = layernorm(%x, %g, %b) {eps = 0.0} : f32[B,4]\n"
                                           "    return %y\n")),
              AllOf(HasSubstr("[V10] layernorm"),
                    HasSubstr("attribute 'eps' must be positive and finite, got 0")));
}

// RMSNorm (rms = 1) takes x [, y] and gamma, no beta, and none of the variance variants; y
// may repeat over x's leading dims after leading 1s (ViT's [1, S, D] positions).
TEST(VerifierTypeRules, RmsNormOperandsAndBroadcast) {
  const auto message = [](const std::string& sig, const std::string& op) {
    return only_message(function_module(sig, "    " + op + "\n    return %y\n"));
  };
  const std::string sig = "(%x: f32[B,4], %g: f32[4]) -> (f32[B,4])";
  const std::string fine = "expected exactly one diagnostic, got 0:\n";
  EXPECT_EQ(message(sig, "%y = layernorm(%x, %g) {eps = 1e-06, rms = 1} : f32[B,4]"), fine);
  EXPECT_EQ(message(sig, "%y = add_layernorm(%x, %x, %g) {eps = 1e-06, rms = 1} : f32[B,4]"), fine);
  EXPECT_THAT(message(sig, "%y = layernorm(%x, %g, %g) {eps = 1e-06, rms = 1} : f32[B,4]"),
              AllOf(HasSubstr("[V8] layernorm"), HasSubstr("expects 2 operand(s), got 3")));
  EXPECT_THAT(message(sig, "%y = layernorm(%x, %g) {eps = 1e-06} : f32[B,4]"),
              AllOf(HasSubstr("[V8] layernorm"), HasSubstr("expects 3 operand(s), got 2")));
  EXPECT_THAT(message(sig, "%y = add_layernorm(%x, %x, %g) {eps = 1e-06} : f32[B,4]"),
              AllOf(HasSubstr("[V8] add_layernorm"), HasSubstr("expects 4 operand(s), got 3")));
  EXPECT_THAT(
      message(sig, "%y = layernorm(%x, %g) {eps = 1e-06, rms = 1, unbiased = 1} : f32[B,4]"),
      AllOf(HasSubstr("[V8] layernorm"), HasSubstr("rms takes neither unbiased nor eps_outside")));
  EXPECT_THAT(message("(%x: f32[B,4], %g: f32[3]) -> (f32[B,4])",
                      "%y = layernorm(%x, %g) {eps = 1e-06, rms = 1} : f32[B,4]"),
              AllOf(HasSubstr("[V8] layernorm"), HasSubstr("gamma f32[3] must be f32[4]")));
  EXPECT_THAT(message(sig, "%y = layernorm(%x, %g) {eps = 1e-06, rms = 2} : f32[B,4]"),
              HasSubstr("[V10] layernorm: attribute 'rms' must be 0 or 1, got 2"));
  const std::string three =
      "(%x: f32[B,S,4], %p: f32[1,S,4], %q: f32[B,1,4], %g: f32[4]) -> "
      "(f32[B,S,4])";
  EXPECT_EQ(message(three, "%y = add_layernorm(%x, %p, %g, %g) {eps = 1e-06} : f32[B,S,4]"), fine);
  EXPECT_THAT(message(three, "%y = add_layernorm(%x, %q, %g, %g) {eps = 1e-06} : f32[B,S,4]"),
              AllOf(HasSubstr("[V8] add_layernorm"),
                    HasSubstr("addends differ: f32[B,S,4] and f32[B,1,4]")));
}

// The unbiased variance of a row of one value divides by D - 1 = 0: a type error naming the
// op (V8), where the biased one is fine.
TEST(VerifierTypeRules, LayernormUnbiasedNeedsTwoFeatures) {
  EXPECT_THAT(
      only_message(function_module("(%x: f32[B,1], %g: f32[1]) -> (f32[B,1])",
                                   "    %y = layernorm(%x, %g, %g) {eps = 1e-06, unbiased = 1} : "
                                   "f32[B,1]\n"
                                   "    return %y\n")),
      AllOf(HasSubstr("[V8] layernorm"),
            HasSubstr("unbiased variance over a last dim of 1 divides by zero (D - 1 = 0)")));
  EXPECT_THAT(only_message(function_module("(%x: f32[B,1], %g: f32[1]) -> (f32[B,1])",
                                           "    %y = add_layernorm(%x, %x, %g, %g) {eps = 1e-06, "
                                           "unbiased = 1} : f32[B,1]\n"
                                           "    return %y\n")),
              AllOf(HasSubstr("[V8] add_layernorm"), HasSubstr("divides by zero")));
  EXPECT_EQ(only_message(function_module("(%x: f32[B,1], %g: f32[1]) -> (f32[B,1])",
                                         "    %y = layernorm(%x, %g, %g) {eps = 1e-06, "
                                         "eps_outside = 1} : f32[B,1]\n"
                                         "    return %y\n")),
            "expected exactly one diagnostic, got 0:\n");
}

// Issue 26's attention attributes and expand: each misuse a type error naming the op (V8).
TEST(VerifierTypeRules, AttentionVariantsAndExpand) {
  auto attention = [](const std::string& operands, const std::string& attrs,
                      const std::string& params =
                          "%q: f32[B,S,8], %k: f32[B,S,4], %pad: bool[B,S], "
                          "%bias: f32[1,4,S,S]") {
    return only_message(function_module(
        "(" + params + ") -> (f32[B,S,8])",
        "    %o = attention(" + operands + ") {" + attrs + "} : f32[B,S,8]\n    return %o\n"));
  };
  EXPECT_THAT(
      attention("%q, %k, %k", "causal = 0, heads = 4, kv_heads = 3, scale = 0.5"),
      AllOf(HasSubstr("[V8] attention"), HasSubstr("4 heads are not a multiple of 3 kv_heads")));
  EXPECT_THAT(attention("%q, %k, %k", "causal = 0, heads = 4, kv_heads = 4, scale = 0.5"),
              AllOf(HasSubstr("[V8] attention"), HasSubstr("q f32[B,S,8], k f32[B,S,4], v "
                                                           "f32[B,S,4] do not agree")));
  EXPECT_THAT(
      attention("%q, %k, %k", "causal = 0, heads = 4, kv_heads = 2, scale = 0.5, window = 2"),
      AllOf(HasSubstr("[V8] attention"), HasSubstr("a sliding window needs causal = 1")));
  EXPECT_THAT(attention("%q, %k, %k, %pad",
                        "causal = 1, fill_inf = 1, heads = 4, kv_heads = 2, "
                        "scale = 0.5, window = 2"),
              AllOf(HasSubstr("[V8] attention"),
                    HasSubstr("a sliding window with key padding needs the -1e9 fill, not "
                              "fill_inf")));
  EXPECT_THAT(attention("%q, %k, %k, %q",
                        "bias = 1, causal = 0, heads = 4, kv_heads = 2, "
                        "scale = 0.5"),
              AllOf(HasSubstr("[V8] attention"),
                    HasSubstr("score bias f32[B,S,8] must be f32 of rank 4 broadcasting to the "
                              "scores f32[B,4,S,S]")));
  EXPECT_THAT(attention("%q, %k, %k, %bias",
                        "bias = 1, causal = 0, heads = 2, kv_heads = 1, "
                        "scale = 0.5"),
              AllOf(HasSubstr("[V8] attention"),
                    HasSubstr("score bias f32[1,4,S,S] must be f32 of rank 4 broadcasting to "
                              "the scores f32[B,2,S,S]")));
  EXPECT_EQ(attention("%q, %k, %k, %pad, %bias",
                      "bias = 1, causal = 1, heads = 4, kv_heads = 2, "
                      "scale = 0.5, softcap = 20.0, window = 3"),
            "expected exactly one diagnostic, got 0:\n");
  EXPECT_THAT(attention("%q, %k, %k",
                        "causal = 0, heads = 4, kv_heads = 2, scale = 0.5, "
                        "softcap = 0.0"),
              AllOf(HasSubstr("[V10] attention"), HasSubstr("attribute 'softcap' must be")));
  EXPECT_THAT(only_message(function_module("(%x: f32[B,3,1]) -> (f32[B,2,4])",
                                           "    %y = expand(%x) : f32[B,2,4]\n"
                                           "    return %y\n")),
              AllOf(HasSubstr("[V8] expand"),
                    HasSubstr("operand f32[B,3,1] does not broadcast to f32[B,2,4]")));
  EXPECT_THAT(only_message(function_module("(%x: f32[B,3,1]) -> (i64[B,3,4])",
                                           "    %y = expand(%x) : i64[B,3,4]\n"
                                           "    return %y\n")),
              AllOf(HasSubstr("[V8] expand"),
                    HasSubstr("result i64[B,3,4] must have the operand's dtype (f32[B,3,1])")));
}

TEST(VerifierTypeRules, AttentionMaskShape) {
  EXPECT_THAT(only_message(function_module(
                  "(%q: f32[B,S,8], %k: f32[B,S,8], %pad: bool[B,T]) -> (f32[B,S,8])",
                  "    %o = attention(%q, %k, %k, %pad) {causal = 0, heads = 2, scale = 0.5} : "
                  "f32[B,S,8]\n"
                  "    return %o\n")),
              AllOf(HasSubstr("[V8] attention"),
                    HasSubstr("key padding mask bool[B,T] must be bool[B,S]")));
  EXPECT_THAT(only_message(function_module(
                  "(%q: f32[B,S,8]) -> (f32[B,S,8])",
                  "    %o = attention(%q, %q, %q) {causal = 1, heads = 3, scale = 0.5} : "
                  "f32[B,S,8]\n"
                  "    return %o\n")),
              AllOf(HasSubstr("[V8] attention"),
                    HasSubstr("feature size of f32[B,S,8] is not divisible by 3 heads")));
  EXPECT_THAT(
      only_message(
          function_module("(%q: f32[B,S,8]) -> (f32[B,S,8])",
                          "    %o = attention(%q, %q, %q) {causal = 2, heads = 2, scale = 0.5} : "
                          "f32[B,S,8]\n"
                          "    return %o\n")),
      AllOf(HasSubstr("[V10] attention"), HasSubstr("attribute 'causal' must be 0 or 1, got 2")));
}

TEST(VerifierTypeRules, SliceOutOfRange) {
  EXPECT_THAT(
      only_message(function_module("(%a: f32[2,6]) -> (f32[2,3])",
                                   "    %c = slice(%a) {axis = 1, start = 4} : f32[2,3]\n"
                                   "    return %c\n")),
      AllOf(HasSubstr("[V8] slice"), HasSubstr("slice [4, 4+3) exceeds extent 6 of axis 1")));
  EXPECT_THAT(
      only_message(function_module("(%a: f32[B,S]) -> (f32[B,S])",
                                   "    %c = slice(%a) {axis = -1, start = 1} : f32[B,S]\n"
                                   "    return %c\n")),
      AllOf(HasSubstr("[V8] slice"), HasSubstr("slice [1, 1+S) exceeds extent S of axis 1")));
  EXPECT_THAT(only_message(function_module("(%a: f32[2,6]) -> (f32[2,3])",
                                           "    %c = slice(%a) {axis = 2, start = 0} : f32[2,3]\n"
                                           "    return %c\n")),
              AllOf(HasSubstr("[V8] slice"), HasSubstr("axis 2 out of range for rank 2")));
}

TEST(VerifierTypeRules, WeightAndConstantOps) {
  EXPECT_THAT(only_message(function_module("() -> (f32[4,3])",
                                           "    %w = weight() {name = \"w\"} : f32[4,3]\n"
                                           "    return %w\n",
                                           "  weight @w : f32[3,4]\n")),
              AllOf(HasSubstr("[V8] weight"),
                    HasSubstr("weight 'w' is declared as f32[3,4], used as f32[4,3]")));
  EXPECT_THAT(only_message(function_module("() -> (f32[3])",
                                           "    %w = weight() {name = \"nope\"} : f32[3]\n"
                                           "    return %w\n")),
              AllOf(HasSubstr("[V8] weight"), HasSubstr("refers to undeclared weight 'nope'")));
  EXPECT_THAT(
      only_message(function_module("() -> (i64[])",
                                   "    %c = constant() {value = 0.5} : i64[]\n"
                                   "    return %c\n")),
      AllOf(HasSubstr("[V8] constant"), HasSubstr("integer constant has a non-integer value")));
}

TEST(VerifierTypeRules, GatherAndLinear) {
  EXPECT_THAT(only_message(function_module("(%t: f32[10,4], %ids: f32[B,S]) -> (f32[B,S,4])",
                                           "    %e = gather(%t, %ids) : f32[B,S,4]\n"
                                           "    return %e\n")),
              AllOf(HasSubstr("[V8] gather"), HasSubstr("indices must be integers, got f32")));
  EXPECT_THAT(
      only_message(function_module("(%x: f32[B,4], %w: f32[6,4], %b: f32[4]) -> (f32[B,6])",
                                   "    %y = linear(%x, %w, %b) {act = \"none\"} : f32[B,6]\n"
                                   "    return %y\n")),
      AllOf(HasSubstr("[V8] linear"), HasSubstr("bias f32[4] must be f32[6]")));
  EXPECT_THAT(only_message(function_module("(%x: f32[B,4], %w: f32[6,4]) -> (f32[B,6])",
                                           "    %y = linear(%x, %w) {act = \"erf\"} : f32[B,6]\n"
                                           "    return %y\n")),
              AllOf(HasSubstr("[V10] linear"),
                    HasSubstr("attribute 'act' must be \"none\", \"relu\", \"gelu\", "
                              "\"gelu_tanh\", \"silu\", \"sigmoid\" or \"tanh\", got \"erf\"")));
}

// ---------------------------------------------------------------------------------------
// Diagnostic locations and formatting.

// V11: an add_layernorm_sum reads an add_layernorm's result, one sum per add_layernorm.
TEST(VerifierInvariants, AddLayernormSum) {
  const std::string sig =
      "(%x: f32[B,4], %y: f32[B,4], %g: f32[4], %b: f32[4]) -> (f32[B,4], f32[B,4])";
  const std::string norm = "    %n = add_layernorm(%x, %y, %g, %b) {eps = 1e-05} : f32[B,4]\n";
  EXPECT_TRUE(
      verify(parse_module(function_module(
                 sig, norm + "    %s = add_layernorm_sum(%n) : f32[B,4]\n    return %n, %s\n")))
          .empty());
  EXPECT_THAT(only_message(function_module(
                  sig,
                  "    %n = layernorm(%x, %g, %b) {eps = 1e-05} : f32[B,4]\n"
                  "    %s = add_layernorm_sum(%n) : f32[B,4]\n    return %n, %s\n")),
              HasSubstr("[V11] add_layernorm_sum: operand %n is not an add_layernorm's result"));
  EXPECT_THAT(only_message(function_module(
                  sig, "    %s = add_layernorm_sum(%x) : f32[B,4]\n    return %x, %s\n")),
              HasSubstr("[V11] add_layernorm_sum: operand %x is not an add_layernorm's result"));
  EXPECT_THAT(only_message(function_module(sig, norm + "    %s = add_layernorm_sum(%n) : f32[B,4]\n"
                                                       "    %t = add_layernorm_sum(%n) : f32[B,4]\n"
                                                       "    return %s, %t\n")),
              HasSubstr("[V11] add_layernorm_sum: the add_layernorm of %n has a sum already"));
}

TEST(VerifierFormatting, ParsedModulesCarryFileLineAndColumn) {
  const std::string text = R"(module @m {
  func @f(%a: f32[2,3], %b: f32[4,5]) -> (f32[2,5]) {
    %x = relu(%a) : f32[2,3]
      %c = matmul(%x, %b) : f32[2,5]
    return %c
  }
}
)";
  const Module m = parse_module(text, "model.kir");
  const std::vector<Diagnostic> diags = verify(m);
  ASSERT_EQ(diags.size(), 1u) << all_messages(diags);
  EXPECT_EQ(diags[0].function, "f");
  EXPECT_EQ(diags[0].op_index, 1);
  EXPECT_EQ(diags[0].loc.line, 4);
  EXPECT_EQ(diags[0].loc.col, 7);
  const std::string expected =
      "model.kir:4:7: error: [V8] matmul: contraction dims differ: f32[2,3] x f32[4,5]";
  EXPECT_EQ(format_diagnostic(diags[0], "model.kir"), expected);
  try {
    parse_and_verify(text, "model.kir");
    FAIL() << "parse_and_verify accepted an ill-typed module";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), expected);
  }
}

TEST(VerifierFormatting, WithoutLocations) {
  Module m = relu_module();
  m.functions[0].ops[0].operands = {42};
  std::vector<Diagnostic> diags = verify(m);
  ASSERT_EQ(diags.size(), 1u);
  EXPECT_EQ(format_diagnostic(diags[0], "built.kir"),
            "built.kir: error: in function 'f', op 0: [V4] relu: operand refers to missing "
            "value 42");

  m = relu_module();
  m.functions[0].results.clear();
  diags = verify(m);
  ASSERT_EQ(diags.size(), 1u);
  EXPECT_EQ(format_diagnostic(diags[0]),
            "<input>: error: in function 'f': [V3] function 'f' has no results");

  diags = verify(parse_module("module @m {\n  symbol S max 0\n}\n"));
  ASSERT_EQ(diags.size(), 1u);
  EXPECT_EQ(format_diagnostic(diags[0]),
            "<input>: error: [V1] symbol 'S' has maximum 0, expected >= 1");
}

TEST(VerifierFormatting, VerifyOrThrowListsAtMostTenDiagnostics) {
  std::string text = "module @m {\n";
  for (int i = 0; i < 12; ++i) text += "  symbol S" + std::to_string(i) + " max 0\n";
  text += "}\n";
  const Module m = parse_module(text);
  EXPECT_NO_THROW(verify_or_throw(relu_module()));
  try {
    verify_or_throw(m, "many.kir");
    FAIL() << "verify_or_throw accepted an invalid module";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, StartsWith("many.kir: error: [V1] symbol 'S0' has maximum 0"));
    EXPECT_THAT(what, HasSubstr("symbol 'S9' has maximum 0"));
    EXPECT_THAT(what, testing::Not(HasSubstr("'S10'")));
    EXPECT_THAT(what, testing::EndsWith("\n... and 2 more"));
  }
}

}  // namespace
}  // namespace kiln::ir

namespace kiln::ir {
namespace {
// Sizes are bounded so that no element or byte count can overflow int64 anywhere.
TEST(VerifierInvariants, HugeTypesAreRejectedWithoutOverflow) {
  Module m = parse_module(R"(module @m {
  weight @w : f32[4294967296,4294967296]
  func @f(%x: f32[4]) -> (f32[4]) {
    %0 = reshape(%x) : f32[4]
    return %0
  }
})");
  auto diags = verify(m);
  ASSERT_EQ(diags.size(), 1u);
  EXPECT_THAT(diags[0].message,
              ::testing::HasSubstr("[V2] weight 'w' of type f32[4294967296,4294967296] "
                                   "has a negative dim or more than"));
  Module r = parse_module(R"(module @m {
  func @f(%x: f32[9223372036854775807,4]) -> (f32[4,9223372036854775807]) {
    %0 = reshape(%x) : f32[4,9223372036854775807]
    return %0
  }
})");
  std::string all;
  for (const auto& d : verify(r)) all += d.message + "\n";
  EXPECT_THAT(all, ::testing::HasSubstr("[V7] type f32[9223372036854775807,4] is larger than"));
}
// topk, take_along_axis, scatter_add and moe_ffn: each rule's refusals name the values.
TEST(VerifierTypeRules, IndexingAndMoE) {
  const auto message = [](const std::string& sig, const std::string& op) {
    return only_message("module @m {\n  symbol T max 8\n  func @f" + sig + " {\n    " + op +
                        "\n    return %y\n  }\n}\n");
  };
  const std::string fine = "expected exactly one diagnostic, got 0:\n";
  const std::string p = "(%p: f32[T,5]) -> (i64[T,2])";
  EXPECT_EQ(message(p, "%y = topk(%p) {k = 2} : i64[T,2]"), fine);
  EXPECT_THAT(message(p, "%y = topk(%p) {k = 6} : i64[T,2]"),
              HasSubstr("[V8] topk: k = 6 exceeds the last axis of f32[T,5]"));
  EXPECT_THAT(message(p, "%y = topk(%p) {k = 0} : i64[T,2]"),
              HasSubstr("[V10] topk: attribute 'k' must be >= 1, got 0"));
  EXPECT_THAT(message("(%p: bool[T,5]) -> (i64[T,2])", "%y = topk(%p) {k = 2} : i64[T,2]"),
              HasSubstr("[V8] topk: operand must be a number tensor of rank >= 1, got bool[T,5]"));

  const std::string t = "(%x: f32[T,5], %i: i64[T,2]) -> (f32[T,2])";
  EXPECT_EQ(message(t, "%y = take_along_axis(%x, %i) {axis = 1} : f32[T,2]"), fine);
  EXPECT_THAT(message(t, "%y = take_along_axis(%x, %i) {axis = 0} : f32[T,2]"),
              HasSubstr("[V8] take_along_axis: indices i64[T,2] differ from f32[T,5] outside "
                        "axis 0"));
  EXPECT_THAT(message("(%x: f32[T,5], %i: f32[T,2]) -> (f32[T,2])",
                      "%y = take_along_axis(%x, %i) {axis = 1} : f32[T,2]"),
              HasSubstr("[V8] take_along_axis: indices must be integers, got f32"));
  EXPECT_THAT(message("(%x: f32[T,5], %i: i64[2]) -> (f32[2])",
                      "%y = take_along_axis(%x, %i) {axis = 1} : f32[2]"),
              HasSubstr("[V8] take_along_axis: indices i64[2] must have the rank of f32[T,5]"));
  EXPECT_THAT(message(t, "%y = take_along_axis(%x, %i) {axis = 2} : f32[T,2]"),
              HasSubstr("[V8] take_along_axis: axis 2 out of range for rank 2"));

  const std::string sa = "(%b: f32[T,5], %i: i64[T,2], %s: f32[T,2]) -> (f32[T,5])";
  EXPECT_EQ(message(sa, "%y = scatter_add(%b, %i, %s) {axis = -1} : f32[T,5]"), fine);
  EXPECT_THAT(message(sa, "%y = scatter_add(%b, %i, %s) {axis = 0} : f32[T,5]"),
              HasSubstr("[V8] scatter_add: source f32[T,2] differs from f32[T,5] outside axis 0"));
  EXPECT_THAT(message("(%b: f32[T,5], %i: i64[T,3], %s: f32[T,2]) -> (f32[T,5])",
                      "%y = scatter_add(%b, %i, %s) {axis = 1} : f32[T,5]"),
              HasSubstr("[V8] scatter_add: indices i64[T,3] must have the shape of the source "
                        "f32[T,2]"));
  EXPECT_THAT(message("(%b: f32[T,5], %i: i64[T,2], %s: i64[T,2]) -> (f32[T,5])",
                      "%y = scatter_add(%b, %i, %s) {axis = 1} : f32[T,5]"),
              HasSubstr("[V8] scatter_add: source i64[T,2] must have the dtype of f32[T,5]"));

  const std::string moe =
      "(%x: f32[T,4], %i: i64[T,2], %g: f32[T,2], %a: f32[3,4], %d: f32[4,3]) -> (f32[T,4])";
  EXPECT_EQ(message(moe, "%y = moe_ffn(%x, %i, %g, %a, %a, %d) {experts = 1} : f32[T,4]"), fine);
  EXPECT_THAT(message(moe, "%y = moe_ffn(%x, %i, %g, %a, %a, %d) {experts = 2} : f32[T,4]"),
              HasSubstr("[V8] moe_ffn: expects 9 operand(s), got 6"));
  EXPECT_THAT(message(moe, "%y = moe_ffn(%x, %i, %g, %a, %d, %d) {experts = 1} : f32[T,4]"),
              HasSubstr("[V8] moe_ffn: expert 0's w3 f32[4,3] must be f32[3,4]"));
  EXPECT_THAT(message(moe, "%y = moe_ffn(%x, %i, %i, %a, %a, %d) {experts = 1} : f32[T,4]"),
              HasSubstr("[V8] moe_ffn: gates i64[T,2] must be f32 of the ids' shape [T,2]"));
  EXPECT_THAT(message(moe, "%y = moe_ffn(%x, %g, %g, %a, %a, %d) {experts = 1} : f32[T,4]"),
              HasSubstr("[V8] moe_ffn: expert ids f32[T,2] must be integers [..., K] with the "
                        "leading dims of x f32[T,4]"));
  EXPECT_THAT(message(moe, "%y = moe_ffn(%x, %i, %g, %d, %a, %d) {experts = 1} : f32[T,4]"),
              HasSubstr("[V8] moe_ffn: expert 0's w1 f32[4,3] must be f32[F, 4]"));
}

}  // namespace
}  // namespace kiln::ir
