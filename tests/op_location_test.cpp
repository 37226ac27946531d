// Every pass keeps op locations (ir::Op::loc): each pass of passes::all_passes(), alone and
// in default-pipeline order, runs on the tiny Transformer (printed and parsed back, so every
// op has a location) and on a hand-written module with reorderings and merges. An op whose
// result survives (by value name) keeps its location; a new op has the line of an input op
// (for the hand-written module: the op the rule in ir.h names). The verifier's diagnostic
// about an op broken after the passes names that op's original line and column.
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/ir.h"
#include "ir/op_types.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/pipeline.h"
#include "tests/pass_harness.h"

namespace kiln {
namespace {

using ir::OpKind;

// The locations of an input module's ops, by (function, result name), and their lines.
struct Origins {
  std::map<std::pair<std::string, std::string>, ir::Loc> by_name;
  std::set<int> lines;
};

Origins origins_of(const ir::Module& m) {
  Origins o;
  for (const ir::Function& f : m.functions)
    for (const ir::Op& op : f.ops) {
      const std::string& name = f.values[op.result].name;
      EXPECT_FALSE(name.empty()) << "every input op needs a named result";
      EXPECT_GT(op.loc.line, 0) << "%" << name << " has no location";
      o.by_name[{f.name, name}] = op.loc;
      o.lines.insert(op.loc.line);
    }
  return o;
}

// The op defining the value named `name` in function `fn`, or nullptr.
const ir::Op* op_named(const ir::Module& m, const std::string& fn, const std::string& name) {
  const ir::Function* f = m.find_function(fn);
  if (!f) return nullptr;
  for (const ir::Op& op : f->ops)
    if (f->values[op.result].name == name) return &op;
  return nullptr;
}

struct Counts {
  int kept = 0;     // ops whose result name was in the input
  int created = 0;  // ops made by a pass
};

// Every op of `after` that defines a value named in the input has that op's location; every
// other op has the line of some input op.
Counts expect_locations_kept(const Origins& o, const ir::Module& after, const std::string& run) {
  Counts c;
  for (const ir::Function& f : after.functions)
    for (const ir::Op& op : f.ops) {
      const std::string& name = f.values[op.result].name;
      auto it = o.by_name.find({f.name, name});
      if (!name.empty() && it != o.by_name.end()) {
        ++c.kept;
        EXPECT_EQ(op.loc.line, it->second.line) << run << ": @" << f.name << " %" << name;
        EXPECT_EQ(op.loc.col, it->second.col) << run << ": @" << f.name << " %" << name;
      } else {
        ++c.created;
        EXPECT_TRUE(o.lines.count(op.loc.line))
            << run << ": @" << f.name << " new " << ir::op_name(op.kind) << " has line "
            << op.loc.line << ", not the line of an input op";
      }
    }
  return c;
}

// Breaks every surviving op whose type is inferred (flips its result's dtype between f32
// and i64) and checks that the verifier's first diagnostic about it starts with
// FILE:LINE:COL of the op in the input and its [V8] type-rule violation. An op is broken
// only in a round where none of its operands is (else its rule could agree with the broken
// type); rounds repeat until every op was broken once. Returns how many were checked.
int expect_diagnostics_name_lines(const Origins& o, const ir::Module& module,
                                  const std::string& file, const std::string& run) {
  using Key = std::pair<std::string, int>;  // function, op index
  std::set<Key> pending;
  for (const ir::Function& f : module.functions)
    for (size_t i = 0; i < f.ops.size(); ++i)
      if (o.by_name.count({f.name, f.values[f.ops[i].result].name}) &&
          !ir::needs_declared_type(f.ops[i].kind))
        pending.insert({f.name, static_cast<int>(i)});
  const int checked = static_cast<int>(pending.size());
  while (!pending.empty()) {
    ir::Module m = module;
    std::map<Key, std::string> want;  // the prefix of each broken op's diagnostic
    for (ir::Function& f : m.functions) {
      std::vector<bool> broken(f.values.size(), false);
      for (size_t i = 0; i < f.ops.size(); ++i) {
        const ir::Op& op = f.ops[i];
        const Key key{f.name, static_cast<int>(i)};
        bool operand_broken = false;
        for (ir::ValueId v : op.operands) operand_broken |= broken[v];
        if (!pending.count(key) || operand_broken) continue;
        broken[op.result] = true;
        ir::TensorType& t = f.values[op.result].type;
        t.dtype = t.dtype == ir::DType::f32 ? ir::DType::i64 : ir::DType::f32;
        const ir::Loc loc = o.by_name.at({f.name, f.values[op.result].name});
        want[key] =
            fmt::format("{}:{}:{}: error: [V8] {}", file, loc.line, loc.col, ir::op_name(op.kind));
      }
    }
    std::map<Key, std::string> got;
    for (const ir::Diagnostic& d : ir::verify(m))
      if (d.op_index >= 0 && !got.count({d.function, d.op_index}))
        got[{d.function, d.op_index}] = ir::format_diagnostic(d, file);
    for (const auto& [key, prefix] : want) {
      pending.erase(key);
      auto it = got.find(key);
      if (it == got.end()) {
        ADD_FAILURE() << run << ": no diagnostic for @" << key.first << " op " << key.second;
        continue;
      }
      EXPECT_EQ(it->second.rfind(prefix, 0), 0u) << run << ": " << it->second;
    }
  }
  return checked;
}

// Runs each pass alone on `input`, then each pass in default-pipeline order, checking
// locations and diagnostics after every run; returns the module after the whole pipeline.
ir::Module check_every_pass(const ir::Module& input, const std::string& file) {
  const Origins o = origins_of(input);
  auto check = [&](const ir::Module& m, const std::string& run) {
    const Counts c = expect_locations_kept(o, m, run);
    const int broken = expect_diagnostics_name_lines(o, m, file, run);
    std::printf(
        "[ locations ] %s %-36s %3d ops kept their location, %2d new, %3d diagnostics checked\n",
        file.c_str(), run.c_str(), c.kept, c.created, broken);
    EXPECT_GT(c.kept, 0) << run;
    EXPECT_GT(broken, 0) << run;
  };
  for (const passes::PassInfo& pass : passes::all_passes())
    check(testing::after_passes(input, {pass.name}), std::string(pass.name) + " alone");
  ir::Module m = input;
  for (const passes::PassInfo& pass : passes::all_passes()) {
    m = testing::after_passes(std::move(m), {pass.name});
    check(m, std::string("pipeline through ") + pass.name);
  }
  return m;
}

TEST(OpLocations, TinyTransformerKeepsThemThroughEveryPass) {
  // Names for the DSL's unnamed values, so that ops can be followed by name.
  ir::Module built = models::build_model("transformer", "tiny");
  for (ir::Function& f : built.functions)
    for (size_t v = 0; v < f.values.size(); ++v)
      if (f.values[v].name.empty()) f.values[v].name = "v" + std::to_string(v);
  const ir::Module input = ir::parse_and_verify(ir::print_module(built), "tiny.kir");
  const ir::Module after = check_every_pass(input, "tiny.kir");
  // The whole pipeline fused: the locations checked include attention, linear and
  // add_layernorm ops.
  int fused = 0;
  for (const ir::Op& op : after.find_function("forward")->ops)
    fused += op.kind == OpKind::attention || op.kind == OpKind::linear ||
             op.kind == OpKind::add_layernorm;
  EXPECT_GT(fused, 30);
}

// Every pass changes something here: canonicalize folds %quarter, merges %a2 into %a and
// %m2 into %m (CSE) and drops %wqt2; fuse-attention, fuse-rmsnorm (@h), fuse-add-layernorm
// and fuse-linear fuse; merge-projections merges the q/k/v linears; schedule reorders @g's
// interleaved chains; plan-memory plans both functions.
constexpr const char* kHand = R"(module @hand {
  symbol B max 2
  symbol S max 8
  symbol N max 1024
  weight @blk.w_q.weight : f32[8,8]
  weight @blk.w_q.bias : f32[8]
  weight @blk.w_k.weight : f32[8,8]
  weight @blk.w_k.bias : f32[8]
  weight @blk.w_v.weight : f32[8,8]
  weight @blk.w_v.bias : f32[8]
  weight @norm.weight : f32[8]
  weight @norm.bias : f32[8]
  weight @ffn.w_1.weight : f32[16,8]
  weight @ffn.w_1.bias : f32[16]
  func @f(%x: f32[B,S,8], %pad: bool[B,S]) -> (f32[B,S,16]) {
    %wq = weight() {name = "blk.w_q.weight"} : f32[8,8]
    %wqt = transpose(%wq) {perm = [1, 0]} : f32[8,8]
    %wqt2 = transpose(%wq) {perm = [1, 0]} : f32[8,8]
    %mq = matmul(%x, %wqt) : f32[B,S,8]
    %bq = weight() {name = "blk.w_q.bias"} : f32[8]
    %q = add(%mq, %bq) : f32[B,S,8]
    %wk = weight() {name = "blk.w_k.weight"} : f32[8,8]
    %wkt = transpose(%wk) {perm = [1, 0]} : f32[8,8]
    %mk = matmul(%x, %wkt) : f32[B,S,8]
    %bk = weight() {name = "blk.w_k.bias"} : f32[8]
    %k = add(%mk, %bk) : f32[B,S,8]
    %wv = weight() {name = "blk.w_v.weight"} : f32[8,8]
    %wvt = transpose(%wv) {perm = [1, 0]} : f32[8,8]
    %mv = matmul(%x, %wvt) : f32[B,S,8]
    %bv = weight() {name = "blk.w_v.bias"} : f32[8]
    %v = add(%mv, %bv) : f32[B,S,8]
    %m = reshape(%pad) : bool[B,1,1,S]
    %m2 = reshape(%pad) : bool[B,1,1,S]
    %qr = reshape(%q) : f32[B,S,2,4]
    %qh = transpose(%qr) {perm = [0, 2, 1, 3]} : f32[B,2,S,4]
    %kr = reshape(%k) : f32[B,S,2,4]
    %kt = transpose(%kr) {perm = [0, 2, 3, 1]} : f32[B,2,4,S]
    %vr = reshape(%v) : f32[B,S,2,4]
    %vh = transpose(%vr) {perm = [0, 2, 1, 3]} : f32[B,2,S,4]
    %s = matmul(%qh, %kt) : f32[B,2,S,S]
    %c = constant() {value = 0.5} : f32[]
    %sc = mul(%c, %s) : f32[B,2,S,S]
    %fill = constant() {value = -1000000000.0} : f32[]
    %sm = select(%m2, %fill, %sc) : f32[B,2,S,S]
    %p = softmax(%sm) {axis = 3} : f32[B,2,S,S]
    %pv = matmul(%p, %vh) : f32[B,2,S,4]
    %t = transpose(%pv) {perm = [0, 2, 1, 3]} : f32[B,S,2,4]
    %att = reshape(%t) : f32[B,S,8]
    %res = add(%x, %att) : f32[B,S,8]
    %g = weight() {name = "norm.weight"} : f32[8]
    %be = weight() {name = "norm.bias"} : f32[8]
    %n = layernorm(%res, %g, %be) {eps = 1e-05} : f32[B,S,8]
    %w1 = weight() {name = "ffn.w_1.weight"} : f32[16,8]
    %w1t = transpose(%w1) {perm = [1, 0]} : f32[8,16]
    %m1 = matmul(%n, %w1t) : f32[B,S,16]
    %b1 = weight() {name = "ffn.w_1.bias"} : f32[16]
    %y1 = add(%m1, %b1) : f32[B,S,16]
    %r = relu(%y1) : f32[B,S,16]
    %half = constant() {value = 0.5} : f32[]
    %quarter = mul(%half, %half) : f32[]
    %out = mul(%r, %quarter) : f32[B,S,16]
    return %out
  }
  func @g(%x: f32[N], %y: f32[N]) -> (f32[]) {
    %a = exp(%x) : f32[N]
    %b = exp(%y) : f32[N]
    %a2 = exp(%x) : f32[N]
    %sa = reduce_sum(%a) {axes = [0], keepdims = 0} : f32[]
    %sb = reduce_sum(%b) {axes = [0], keepdims = 0} : f32[]
    %sa2 = reduce_sum(%a2) {axes = [0], keepdims = 0} : f32[]
    %s1 = add(%sa, %sb) : f32[]
    %sum = add(%s1, %sa2) : f32[]
    return %sum
  }
  func @h(%x: f32[B,8], %w: f32[8]) -> (f32[B,8]) {
    %sq = mul(%x, %x) : f32[B,8]
    %ms = reduce_mean(%sq) {axes = [-1], keepdims = 1} : f32[B,1]
    %eps = constant() {value = 1e-06} : f32[]
    %me = add(%ms, %eps) : f32[B,1]
    %inv = rsqrt(%me) : f32[B,1]
    %xn = mul(%x, %inv) : f32[B,8]
    %rms = mul(%xn, %w) : f32[B,8]
    return %rms
  }
}
)";

// The line of `%name = ` in kHand.
int line_of(const std::string& name) {
  const std::string text = kHand;
  const size_t at = text.find("    %" + name + " = ");
  EXPECT_NE(at, std::string::npos) << name;
  int line = 1;
  for (size_t i = 0; i < at; ++i) line += text[i] == '\n';
  return line;
}

TEST(OpLocations, HandWrittenModuleKeepsThemThroughReorderingsAndMerges) {
  const ir::Module input = ir::parse_and_verify(kHand, "hand.kir");
  // Each pass (shape-inference only checks) changes the module the pipeline hands it, the
  // first time it runs.
  ir::Module m = input;
  // The patterns of kiln import's passes (sequence-first merged-head attention, LayerNorm and
  // GELU written out) are not in this module; their rewrites keep the rule by construction
  // (the root rewritten in place, new ops made by insert_op from it); nor is
  // restrict-vocabulary's (the columns of a linear taken by a vector of ids), which rewrites
  // the take_along_axis in place.
  std::set<std::string> seen = {"shape-inference", "unmerge-heads", "fuse-layernorm", "fuse-gelu",
                                "restrict-vocabulary"};
  for (const passes::PassInfo& pass : passes::all_passes()) {
    const bool changed = pass.run(m);
    if (seen.insert(pass.name).second) EXPECT_TRUE(changed) << pass.name;
  }
  const ir::Module after = check_every_pass(input, "hand.kir");

  // The fused and merged ops have the lines the rule in ir.h gives them.
  const ir::Function& f = *after.find_function("f");
  int attention = 0, add_layernorm = 0, merged = 0, relu_linear = 0;
  for (const ir::Op& op : f.ops) {
    if (op.kind == OpKind::attention) {
      ++attention;
      EXPECT_EQ(op.loc.line, line_of("att"));  // the head-merging reshape
    } else if (op.kind == OpKind::add_layernorm) {
      ++add_layernorm;
      EXPECT_EQ(op.loc.line, line_of("n"));
    } else if (op.kind == OpKind::linear && f.type(op.result).shape.back().is_const(24)) {
      ++merged;
      EXPECT_EQ(op.loc.line, line_of("q"));  // the first merged projection (its bias add)
    } else if (op.kind == OpKind::linear && op.str_attr("act") == "relu") {
      ++relu_linear;
      EXPECT_EQ(op.loc.line, line_of("r"));
    } else if (op.kind == OpKind::weight && f.values[op.result].name.empty()) {
      EXPECT_EQ(op.loc.line, line_of("q"));  // the merged weight and bias
    }
  }
  EXPECT_EQ(attention, 1);
  EXPECT_EQ(add_layernorm, 1);
  EXPECT_EQ(merged, 1);
  EXPECT_EQ(relu_linear, 1);
  // %k and %v became slices of the merged linear, in place.
  ASSERT_NE(op_named(after, "f", "k"), nullptr);
  EXPECT_EQ(op_named(after, "f", "k")->kind, OpKind::slice);
  EXPECT_EQ(op_named(after, "f", "k")->loc.line, line_of("k"));
  // Folded in place, and the survivors of CSE are the first of each pair.
  ASSERT_NE(op_named(after, "f", "quarter"), nullptr);
  EXPECT_EQ(op_named(after, "f", "quarter")->kind, OpKind::constant);
  EXPECT_EQ(op_named(after, "f", "quarter")->loc.line, line_of("quarter"));
  EXPECT_EQ(op_named(after, "f", "m2"), nullptr);
  EXPECT_EQ(op_named(after, "g", "a2"), nullptr);
  ASSERT_NE(op_named(after, "g", "a"), nullptr);
  EXPECT_EQ(op_named(after, "g", "a")->loc.line, line_of("a"));
  // The RMSNorm is its final product, in place.
  ASSERT_NE(op_named(after, "h", "rms"), nullptr);
  EXPECT_EQ(op_named(after, "h", "rms")->kind, OpKind::layernorm);
  EXPECT_EQ(op_named(after, "h", "rms")->loc.line, line_of("rms"));
  // schedule moved %sa up to %a: @g's ops are no longer in line order.
  const ir::Function& g = *after.find_function("g");
  ASSERT_GE(g.ops.size(), 2u);
  EXPECT_EQ(g.values[g.ops[1].result].name, "sa");
  EXPECT_EQ(g.ops[1].loc.line, line_of("sa"));
}

}  // namespace
}  // namespace kiln
