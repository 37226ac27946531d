// Arithmetic on symbolic sizes (ir::Dim: a constant or scale·S + offset of one symbol):
// the dim arithmetic, printing and parsing `T+1`, `2*T`, `T-1`, the verifier's rule that a dim
// is at least 1 (V7), the type rules of concat, slice and reshape on such dims, the refused
// forms (S+T, B*T) with their messages, and the interpreter binding and evaluating them.
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ir/interpreter.h"
#include "ir/op_types.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "support/error.h"

namespace kiln::ir {
namespace {

using ::testing::HasSubstr;

std::string diagnostics(const Module& m) {
  std::string out;
  for (const Diagnostic& d : verify(m)) out += d.message + "\n";
  return out;
}

std::string parse_error(const std::string& text) {
  try {
    parse_module(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(SymbolicDims, ArithmeticAndPrinting) {
  const Dim T = Dim::sym("T"), S = Dim::sym("S");
  EXPECT_EQ(to_string(*add_dims(T, Dim::constant(1))), "T+1");
  EXPECT_EQ(to_string(*add_dims(Dim::constant(1), T)), "T+1");
  EXPECT_EQ(to_string(*add_dims(T, T)), "2*T");
  EXPECT_EQ(to_string(*mul_dims(Dim::constant(64), T)), "64*T");
  EXPECT_EQ(to_string(*mul_dims(*add_dims(T, Dim::constant(1)), Dim::constant(2))), "2*T+2");
  EXPECT_EQ(to_string(*sub_dims(T, Dim::constant(1))), "T-1");
  EXPECT_EQ(to_string(*sub_dims(*add_dims(T, Dim::constant(1)), T)), "1");
  EXPECT_EQ(*sub_dims(*add_dims(T, Dim::constant(1)), T), Dim::constant(1));
  EXPECT_EQ(*mul_dims(T, Dim::constant(0)), Dim::constant(0));
  EXPECT_EQ(*add_dims(T, Dim::constant(0)), T);
  EXPECT_TRUE(T.is_bare_symbol());
  EXPECT_FALSE(add_dims(T, Dim::constant(1))->is_bare_symbol());
  EXPECT_EQ(Dim::affine("T", 2, 1).at(5), 11);
  EXPECT_EQ(Dim::constant(7).at(5), 7);

  std::string why;
  EXPECT_FALSE(add_dims(S, T, &why));
  EXPECT_EQ(why, "the sum of dims S and T: sums of different symbols are not supported");
  EXPECT_FALSE(mul_dims(Dim::sym("B"), T, &why));
  EXPECT_EQ(why,
            "the product of dims B and T: a dim is an affine function of one symbol, and "
            "products of symbolic dims are not supported");
  EXPECT_FALSE(sub_dims(T, Dim::affine("T", 2, 0), &why));
  EXPECT_EQ(why,
            "the difference of dims T and 2*T is not a dim of one symbol with a positive scale");
  EXPECT_FALSE(sub_dims(Dim::constant(4), T, &why));
  EXPECT_FALSE(mul_dims(T, Dim::constant(-1), &why));
  EXPECT_EQ(why, "the product of dims T and -1 has a negative scale");
}

TEST(SymbolicDims, ParseAndPrintRoundTrip) {
  const std::string text = R"(module @m {
  symbol B max 4
  symbol T max 8
  func @f(%x: f32[B,T+1,64], %y: f32[B,2*T,3], %z: f32[B,2*T-1], %w: f32[B,64*T]) -> (f32[B,T+1,64]) {
    %r = relu(%x) : f32[B,T+1,64]
    return %r
  }
}
)";
  const Module m = parse_module(text);
  EXPECT_EQ(diagnostics(m), "");
  const Function& f = m.functions.at(0);
  EXPECT_EQ(f.type(f.params[0]).shape[1], Dim::affine("T", 1, 1));
  EXPECT_EQ(f.type(f.params[1]).shape[1], Dim::affine("T", 2, 0));
  EXPECT_EQ(f.type(f.params[2]).shape[1], Dim::affine("T", 2, -1));
  EXPECT_EQ(f.type(f.params[3]).shape[1], Dim::affine("T", 64, 0));
  EXPECT_EQ(print_module(m), text);
  // Spaces and a separate minus parse the same.
  const Module spaced = parse_module(R"(module @m {
  symbol T max 8
  func @f(%x: f32[T + 1, 2 * T - 1]) -> (f32[T+1,2*T-1]) {
    return %x
  }
}
)");
  EXPECT_EQ(spaced.functions[0].type(0).shape,
            (std::vector<Dim>{Dim::affine("T", 1, 1), Dim::affine("T", 2, -1)}));
}

TEST(SymbolicDims, ParserErrors) {
  EXPECT_EQ(parse_error("module @m {\n  func @f(%x: f32[T*T]) -> (f32[1]) {\n    return %x\n"
                        "  }\n}\n"),
            "<input>:2:20: error: expected ',' or ']' in shape, got '*'");
  EXPECT_EQ(parse_error("module @m {\n  func @f(%x: f32[0*T]) -> (f32[1]) {\n    return %x\n"
                        "  }\n}\n"),
            "<input>:2:19: error: the scale of a symbolic dimension must be >= 1, got 0");
  EXPECT_EQ(parse_error("module @m {\n  func @f(%x: f32[2*3]) -> (f32[1]) {\n    return %x\n"
                        "  }\n}\n"),
            "<input>:2:21: error: expected symbol after '2*', got '3'");
  EXPECT_EQ(parse_error("module @m {\n  func @f(%x: f32[T+S]) -> (f32[1]) {\n    return %x\n"
                        "  }\n}\n"),
            "<input>:2:21: error: expected integer after 'T+', got 'S'");
}

// V7: a dim is at least 1 for every value of its symbol (T-1 is 0 at T = 1).
TEST(SymbolicDims, VerifierRefusesDimsThatCanBeZero) {
  const Module m = parse_module(R"(module @m {
  symbol T max 8
  func @f(%x: f32[T-1]) -> (f32[T-1]) {
    return %x
  }
}
)");
  EXPECT_EQ(diagnostics(m),
            "[V7] type f32[T-1] has dim T-1, which is 0 when T = 1 (a dim is at least 1)\n");
  // 2*T-1 is at least 1.
  EXPECT_EQ(diagnostics(parse_module(R"(module @m {
  symbol T max 8
  func @f(%x: f32[2*T-1]) -> (f32[2*T-1]) {
    return %x
  }
}
)")),
            "");
}

// The maximum of a dim follows from its symbol's: the byte limit sees 4096·T + 1 rows at T's
// maximum.
TEST(SymbolicDims, MaximaFollowTheSymbol) {
  Module m = parse_module(R"(module @m {
  symbol T max 8
  func @f(%x: f32[T+1,64], %y: f32[3*T]) -> (f32[T+1,64]) {
    return %x
  }
}
)");
  const Function& f = m.functions[0];
  EXPECT_EQ(dim_max(m, f.type(f.params[0]).shape[0]), 9);
  EXPECT_EQ(dim_max(m, f.type(f.params[1]).shape[0]), 24);
  EXPECT_EQ(dim_min(f.type(f.params[1]).shape[0]), 3);
  EXPECT_EQ(max_numel(m, f.type(f.params[0])), 9 * 64);
  EXPECT_THAT(diagnostics(parse_module(R"(module @m {
  symbol T max 16777216
  func @f(%x: f32[4096*T+1,4096]) -> (f32[4096*T+1,4096]) {
    return %x
  }
}
)")),
              HasSubstr("[V7] type f32[4096*T+1,4096] is larger than"));
}

TensorType f32(std::vector<Dim> shape) { return TensorType{DType::f32, std::move(shape)}; }

TEST(SymbolicDims, ConcatAddsExtents) {
  Module m = parse_module("module @m {\n  symbol B max 4\n  symbol S max 8\n  symbol T max 8\n}\n");
  const Dim B = Dim::sym("B"), T = Dim::sym("T"), S = Dim::sym("S"), D = Dim::constant(16);
  const Attrs axis1 = {{"axis", int64_t{1}}};
  TypeResult r = infer_type(m, OpKind::concat, {f32({B, Dim::constant(1), D}), f32({B, T, D})},
                            axis1, nullptr);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(to_string(r.type), "f32[B,T+1,16]");
  r = infer_type(m, OpKind::concat, {f32({B, T, D}), f32({B, Dim::constant(2), D}), f32({B, T, D})},
                 axis1, nullptr);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(to_string(r.type), "f32[B,2*T+2,16]");
  r = infer_type(m, OpKind::concat, {f32({B, S, D}), f32({B, T, D})}, axis1, nullptr);
  EXPECT_EQ(r.error,
            "cannot concat f32[B,S,16], f32[B,T,16] along axis 1: the sum of dims S and T: sums "
            "of different symbols are not supported");
}

TEST(SymbolicDims, SliceWithinAffineExtents) {
  Module m = parse_module("module @m {\n  symbol B max 4\n  symbol T max 8\n}\n");
  const Dim B = Dim::sym("B"), T = Dim::sym("T"), D = Dim::constant(16);
  const Dim T1 = Dim::affine("T", 1, 1);
  auto slice = [&](const TensorType& in, int64_t start, const TensorType& out) {
    const Attrs attrs = {{"axis", int64_t{1}}, {"start", start}};
    return infer_type(m, OpKind::slice, {in}, attrs, &out).error;
  };
  EXPECT_EQ(slice(f32({B, T1, D}), 1, f32({B, T, D})), "");  // drop the class token
  EXPECT_EQ(slice(f32({B, T1, D}), 0, f32({B, T, D})), "");
  EXPECT_EQ(slice(f32({B, T1, D}), 0, f32({B, Dim::constant(1), D})), "");
  EXPECT_EQ(slice(f32({B, Dim::affine("T", 2, 0), D}), 1, f32({B, T, D})), "");
  EXPECT_EQ(slice(f32({B, T1, D}), 2, f32({B, T, D})),
            "slice [2, 2+T) exceeds extent T+1 of axis 1");
  // At T's maximum 3 + 8 <= 16, but at T = 1, 3 + 1 > 2.
  EXPECT_EQ(slice(f32({B, Dim::affine("T", 2, 0), D}), 3, f32({B, T, D})),
            "slice [3, 3+T) exceeds extent 2*T of axis 1");
}

TEST(SymbolicDims, ReshapeMergesAndSplitsASymbolicAxis) {
  Module m = parse_module("module @m {\n  symbol B max 4\n  symbol T max 8\n}\n");
  const Dim B = Dim::sym("B"), T = Dim::sym("T");
  auto reshape = [&](const TensorType& in, const TensorType& out) {
    return infer_type(m, OpKind::reshape, {in}, {}, &out).error;
  };
  const auto c = [](int64_t v) { return Dim::constant(v); };
  EXPECT_EQ(reshape(f32({B, T, c(4), c(16)}), f32({B, Dim::affine("T", 64, 0)})), "");
  EXPECT_EQ(reshape(f32({B, Dim::affine("T", 64, 0)}), f32({B, T, c(4), c(16)})), "");
  EXPECT_EQ(reshape(f32({B, Dim::affine("T", 1, 1), c(64)}), f32({B, Dim::affine("T", 64, 64)})),
            "");
  EXPECT_EQ(reshape(f32({B, Dim::affine("T", 2, 2)}), f32({B, Dim::affine("T", 1, 1), c(2)})), "");
  EXPECT_EQ(reshape(f32({B, T, c(64)}), f32({B, Dim::affine("T", 64, 1)})),
            "cannot reshape [B,T,64] to [B,64*T+1]: element counts differ");
  EXPECT_EQ(reshape(f32({B, Dim::affine("T", 1, 1), c(2)}), f32({B, Dim::affine("T", 2, 1)})),
            "cannot reshape [B,T+1,2] to [B,2*T+1]: element counts differ");
}

// The interpreter binds T from T+1 and checks every other dim against it.
TEST(SymbolicDims, InterpreterBindsAffineDims) {
  const Module m = parse_and_verify(R"(module @m {
  symbol B max 4
  symbol T max 8
  func @f(%x: f32[B,T+1,2], %y: f32[B,T,2]) -> (f32[B,T,2], f32[B,2*T+2]) {
    %s = slice(%x) {axis = 1, start = 1} : f32[B,T,2]
    %a = add(%s, %y) : f32[B,T,2]
    %r = reshape(%x) : f32[B,2*T+2]
    return %a, %r
  }
}
)");
  const Function& f = m.functions[0];
  std::vector<float> xs(2 * 4 * 2), ys(2 * 3 * 2, 1.0f);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(i);
  const Tensor x = Tensor::from_f32({2, 4, 2}, xs), y = Tensor::from_f32({2, 3, 2}, ys);
  std::vector<Tensor> out = interpret(m, f, {}, {x, y});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].shape, (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(out[0].f[0], 3.0f);  // x[0,1,0] + 1
  EXPECT_EQ(out[1].shape, (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(out[1].f[15], 15.0f);
  try {
    interpret(m, f, {}, {x, Tensor::from_f32({2, 2, 2}, std::vector<float>(8))});
    FAIL() << "inconsistent T accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("dim 1 (T) is 2, but T is 3 from dim 1 of input 'x'"));
  }
  try {
    interpret(m, f, {}, {Tensor::from_f32({2, 10, 2}, std::vector<float>(40)), y});
    FAIL() << "T+1 above its maximum accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("dim 1 (T+1) is 10, above its maximum 9"));
  }
  try {
    interpret(m, f, {}, {Tensor::from_f32({2, 1, 2}, std::vector<float>(4)), y});
    FAIL() << "T+1 = 1 accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("dim 1 (T+1) is 1, below its minimum 2"));
  }
}

}  // namespace
}  // namespace kiln::ir
