// Tests of canonicalize: differential tests with the interpreter on the tiny Transformer and
// a hand-made module, plus counts proving that the rewrites fired.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "frontend/models.h"
#include "ir/ir.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/canonicalize.h"
#include "passes/rewrite.h"
#include "support/error.h"
#include "tests/pass_harness.h"

namespace kiln {
namespace {

using testing::count_ops;

using ir::Dim;
using ir::DType;
using ir::OpKind;
using ir::TensorType;

// Lengths the differential tests bind every non-batch symbol to (odd on purpose).
const std::vector<int64_t> kLengths = {1, 7, 33};

// Canonicalize computes nothing differently: CSE, dead code and the table fold leave
// every float identical, and constant folding runs the interpreter itself. The bound is
// stated loosely; in practice the difference is exactly 0.
constexpr double kTolerance = 1e-6;

std::map<std::string, int> histogram(const ir::Function& f) {
  std::map<std::string, int> h;
  for (const ir::Op& op : f.ops) ++h[ir::op_name(op.kind)];
  return h;
}

using testing::c;
using testing::f32;
using testing::projection_module;
using testing::sym;

// --- canonicalize: the tiny Transformer ---------------------------------------------------

TEST(CanonicalizeTest, TinyTransformerKeepsOutputs) {
  const ir::Module before = models::build_model("transformer", "tiny");
  const ir::Module after = testing::after_passes(before, {"shape-inference", "canonicalize"});
  EXPECT_LE(testing::max_difference(before, after, kLengths), kTolerance);

  const ir::Function& fb = *before.find_function("forward");
  const ir::Function& fa = *after.find_function("forward");
  // One constant per scalar: 0 (pad id), sqrt(24), sqrt(8) (the encoder's scale), 1/sqrt(8)
  // (the decoder's, which nn::add_seq2seq writes as a product) and -1e9.
  EXPECT_EQ(count_ops(fb, OpKind::constant), 17);
  EXPECT_EQ(count_ops(fa, OpKind::constant), 5);
  // The position tables are computed for the rows used: no slices, tables [S,24], [T,24].
  EXPECT_EQ(count_ops(fb, OpKind::slice), 2);
  EXPECT_EQ(count_ops(fa, OpKind::slice), 0);
  std::vector<std::string> tables;
  for (const ir::Op& op : fa.ops)
    if (op.kind == OpKind::sinusoid_table) tables.push_back(ir::to_string(fa.type(op.result)));
  EXPECT_EQ(tables, (std::vector<std::string>{"f32[S,24]", "f32[T,24]"}));
  EXPECT_EQ(fb.ops.size() - fa.ops.size(), 17u);
  // Besides: the cross-attentions' source padding mask, which nn::add_seq2seq builds beside the
  // encoder's own (eq, reshape), is merged into it, and the decoder's positions, which the
  // built-in's forward does not read (it slices the table), are removed (iota). Nothing else
  // is touched: every other kind keeps its count.
  std::map<std::string, int> hb = histogram(fb), ha = histogram(fa);
  hb.erase("constant"), ha.erase("constant"), hb.erase("slice");
  --hb["eq"], --hb["reshape"], --hb["iota"];
  EXPECT_EQ(hb, ha);
  // Results keep their names.
  EXPECT_EQ(fa.values[fa.results[0]].name, "logits");
  const ir::Function& ea = *after.find_function("encode");
  EXPECT_EQ(ea.values[ea.results[0]].name, "memory");
  EXPECT_EQ(count_ops(ea, OpKind::constant), 4);
}

TEST(CanonicalizeTest, IsIdempotentAndDeterministic) {
  ir::Module a = models::build_model("transformer", "tiny");
  ir::Module b = a;
  EXPECT_TRUE(passes::canonicalize(a));
  EXPECT_TRUE(passes::canonicalize(b));
  const std::string text = ir::print_module(a);
  EXPECT_EQ(ir::print_module(b), text);
  EXPECT_FALSE(passes::canonicalize(a));
  EXPECT_EQ(ir::print_module(a), text);
  // The printed result parses and verifies again.
  EXPECT_EQ(ir::print_module(ir::parse_and_verify(text)), text);
}

// --- canonicalize: a hand-made module with every rewrite ----------------------------------

constexpr const char* kHandMade = R"(module @hand {
  symbol B max 4
  symbol S max 40
  weight @emb : f32[11,8]
  weight @w : f32[8,8]
  func @f(%ids: i64[B,S], %x: f32[B,S,8]) -> (f32[B,S,8], f32[B,S,8], i32[]) {
    %e = weight() {name = "emb"} : f32[11,8]
    %g = gather(%e, %ids) : f32[B,S,8]
    %table = sinusoid_table() : f32[40,8]
    %pe = slice(%table) {axis = 0, start = 0} : f32[S,8]
    %h = add(%g, %pe) : f32[B,S,8]
    %a = constant() {value = 0.1} : f32[]
    %b = constant() {value = 0.7} : f32[]
    %ab = add(%a, %b) : f32[]
    %three = constant() {value = 3} : f32[]
    %scale = div(%ab, %three) : f32[]
    %s = mul(%h, %scale) : f32[B,S,8]
    %r1 = reshape(%s) : f32[B,S,2,4]
    %r2 = reshape(%r1) : f32[B,S,4,2]
    %r3 = reshape(%r2) : f32[B,S,8]
    %w1 = weight() {name = "w"} : f32[8,8]
    %w2 = weight() {name = "w"} : f32[8,8]
    %t1 = transpose(%w1) {perm = [1, 0]} : f32[8,8]
    %tt = transpose(%t1) {perm = [1, 0]} : f32[8,8]
    %t3 = transpose(%w2) {perm = [1, 0]} : f32[8,8]
    %m1 = matmul(%r3, %t3) : f32[B,S,8]
    %xr = reshape(%x) : f32[B,S,2,2,2]
    %u1 = transpose(%xr) {perm = [0, 1, 3, 4, 2]} : f32[B,S,2,2,2]
    %u2 = transpose(%u1) {perm = [0, 1, 3, 2, 4]} : f32[B,S,2,2,2]
    %xb = reshape(%u2) : f32[B,S,8]
    %m2 = matmul(%xb, %tt) : f32[B,S,8]
    %zero = constant() {value = 0} : i64[]
    %pad = eq(%ids, %zero) : bool[B,S]
    %pad2 = eq(%ids, %zero) : bool[B,S]
    %p3 = reshape(%pad) : bool[B,S,1]
    %p4 = reshape(%p3) : bool[B,S,1,1]
    %p5 = reshape(%p4) : bool[B,S,1]
    %no = constant() {value = 0} : bool[]
    %mask = logical_or(%p5, %no) : bool[B,S,1]
    %yes = constant() {value = 1} : bool[]
    %keep = logical_and(%yes, %mask) : bool[B,S,1]
    %pick = select(%yes, %m1, %x) : f32[B,S,8]
    %big = constant() {value = -1000000000.0} : f32[]
    %out1 = select(%keep, %big, %pick) : f32[B,S,8]
    %pr = reshape(%pad2) : bool[B,S,1]
    %fill = constant() {value = -1e9} : f32[]
    %masked = select(%pr, %fill, %m2) : f32[B,S,8]
    %out2 = select(%pr, %masked, %masked) : f32[B,S,8]
    %i1 = constant() {value = 2147483647} : i32[]
    %i2 = constant() {value = 2} : i32[]
    %wrap = mul(%i1, %i2) : i32[]
    return %out1, %out2, %wrap
  }
}
)";

TEST(CanonicalizeTest, HandMadeModuleKeepsOutputs) {
  const ir::Module before = ir::parse_and_verify(kHandMade, "hand.kir");
  const ir::Module after = testing::after_passes(before, {"shape-inference", "canonicalize"});
  EXPECT_LE(testing::max_difference(before, after, kLengths), kTolerance);

  const ir::Function& fb = before.functions[0];
  const ir::Function& fa = after.functions[0];
  // Folded and merged: 0.8/3 and 0 (i64), -1e9, the wrapped i32 product remain.
  EXPECT_EQ(count_ops(fb, OpKind::constant), 10);
  EXPECT_EQ(count_ops(fa, OpKind::constant), 4);
  EXPECT_EQ(count_ops(fa, OpKind::add), 1);  // only %h: 0.1 + 0.7 folded
  EXPECT_EQ(count_ops(fa, OpKind::div), 0);
  // Reshape chains: the [B,S,8] round trip is gone, the mask chain is one reshape (the
  // two around the transposes of %x stay).
  EXPECT_EQ(count_ops(fb, OpKind::reshape), 9);
  EXPECT_EQ(count_ops(fa, OpKind::reshape), 3);
  const std::vector<int> defs = passes::def_index(fa);
  for (const ir::Op& op : fa.ops)
    if (op.kind == OpKind::reshape) {
      const ir::Op* src = passes::def_op(fa, defs, op.operands[0]);
      EXPECT_TRUE(src == nullptr || src->kind != OpKind::reshape) << "a reshape chain is left";
    }
  // Transposes: transpose(transpose(w)) is w, the repeated transpose of w merged, and
  // the two on %x are one with perm p[q[i]] = [0,1,4,3,2] (not q[p[i]] = [0,1,2,4,3],
  // which has the same type here, so a wrong order would show in the outputs).
  EXPECT_EQ(count_ops(fb, OpKind::transpose), 5);
  EXPECT_EQ(count_ops(fa, OpKind::transpose), 2);
  bool composed = false;
  for (const ir::Op& op : fa.ops)
    composed |=
        op.kind == OpKind::transpose && op.ints_attr("perm") == std::vector<int64_t>{0, 1, 4, 3, 2};
  EXPECT_TRUE(composed);
  EXPECT_EQ(count_ops(fa, OpKind::weight), 2);
  // select(c, a, a), select(true, a, b), x or false, true and x, the repeated mask and
  // the table slice.
  EXPECT_EQ(count_ops(fb, OpKind::select), 4);
  EXPECT_EQ(count_ops(fa, OpKind::select), 2);
  EXPECT_EQ(count_ops(fa, OpKind::logical_or), 0);
  EXPECT_EQ(count_ops(fa, OpKind::logical_and), 0);
  EXPECT_EQ(count_ops(fa, OpKind::eq), 1);
  EXPECT_EQ(count_ops(fa, OpKind::slice), 0);
  // Results keep their names; the folded i32 product wrapped as the interpreter does.
  EXPECT_EQ(fa.values[fa.results[0]].name, "out1");
  EXPECT_EQ(fa.values[fa.results[1]].name, "out2");
  EXPECT_EQ(fa.values[fa.results[2]].name, "wrap");
  const ir::Op& wrap = fa.ops[passes::def_index(fa)[fa.results[2]]];
  ASSERT_EQ(wrap.kind, OpKind::constant);
  EXPECT_EQ(wrap.int_attr("value"), -2);
}

TEST(CanonicalizeTest, ReturnsFalseWhenNothingChanges) {
  ir::Module m = projection_module(f32({sym("B"), sym("S"), c(24)}));
  const std::string text = ir::print_module(m);
  EXPECT_FALSE(passes::canonicalize(m));
  EXPECT_EQ(ir::print_module(m), text);
}

TEST(CanonicalizeTest, DropsAStaleMemoryPlan) {
  // Merging two equal ops makes the first one live longer, so offsets planned before
  // no longer hold: a function that changed loses its plan.
  ir::Module m = projection_module(f32({sym("B"), sym("S"), c(24)}));
  ir::Function& f = m.functions[0];
  ir::ValueId y = f.results[0];
  ir::ValueId r1 = f.add_op(OpKind::relu, {y}, f32({sym("B"), sym("S"), c(24)}));
  ir::ValueId r2 = f.add_op(OpKind::relu, {y}, f32({sym("B"), sym("S"), c(24)}));
  ir::ValueId sum = f.add_op(OpKind::add, {r1, r2}, f32({sym("B"), sym("S"), c(24)}));
  f.values[y].name.clear();
  f.values[sum].name = "y";
  f.results = {sum};
  f.arena_bytes = 4096;
  for (ir::Op& op : f.ops) op.arena_offset = 0;
  EXPECT_TRUE(passes::canonicalize(m));
  EXPECT_EQ(count_ops(f, OpKind::relu), 1);
  EXPECT_EQ(f.arena_bytes, -1);
  for (const ir::Op& op : f.ops) EXPECT_EQ(op.arena_offset, -1);
}

}  // namespace
}  // namespace kiln
