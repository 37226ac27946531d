// fuse-linear: matmul(x, transpose(W)) [+ b] [act] -> linear (see fuse_linear.h).
//
// Algorithm: every matmul is an anchor. can_fuse_linear() checks the transposed rank-2
// right operand; can_absorb_bias() and can_absorb_activation() then extend the match downwards
// one single-use op at a time. The rewrite replaces the last matched op in place with the
// linear (same result value; x and W are defined before the matmul and b before the add,
// so every operand is still defined before it), and remove_dead_code drops the absorbed
// ops. Matches are disjoint (an add absorbs only its single-use matmul operand, an
// activation only its single-use operand), so the def/use facts computed once per function stay
// valid for every anchor.
#include "passes/fuse_linear.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

using ir::DType;
using ir::Function;
using ir::Op;
using ir::OpKind;
using ir::TensorType;
using ir::ValueId;

constexpr const char* kPass = "fuse-linear";

// Def/use facts about one function, computed once per function.
struct Graph : UseInfo {
  using UseInfo::UseInfo;
  std::string label(ValueId v) const { return value_label(f, v); }
};

// What one match becomes: linear(x, w[, bias]) {act} replacing op `last`.
struct LinearMatch {
  int matmul = -1;
  ValueId x = -1, w = -1;
  ValueId bias = -1;  // -1: no bias absorbed
  int add = -1;       // the absorbed bias add, or -1
  int act = -1;       // the absorbed activation (relu, gelu, ...), or -1
  int last() const { return act >= 0 ? act : add >= 0 ? add : matmul; }
};

// Whether the matmul at `pos` multiplies by transpose(W) {perm=[1,0]} of an f32 rank-2 W;
// sets x and w. Logs why not.
bool can_fuse_linear(const Graph& g, int pos, LinearMatch* match) {
  const Op& mm = g.f.ops[pos];
  KILN_ASSERT(mm.kind == OpKind::matmul && mm.operands.size() == 2,
              "can_fuse_linear: not a matmul");
  const ValueId rhs = mm.operands[1];
  const Op* tr = def_op(g.f, g.defs, rhs);
  if (!tr || tr->kind != OpKind::transpose) {
    debug_log(kPass, "matmul {}: rhs {} is not a transpose", g.label(mm.result), g.label(rhs));
    return false;
  }
  const ValueId w = tr->operands[0];
  const TensorType& wt = g.f.type(w);
  if (wt.dtype != DType::f32 || wt.rank() != 2) {
    debug_log(kPass, "matmul {}: rhs {} transposes {}, not an f32 rank-2 tensor",
              g.label(mm.result), g.label(rhs), ir::to_string(wt));
    return false;
  }
  if (tr->ints_attr("perm") != std::vector<int64_t>{1, 0}) {
    debug_log(kPass, "matmul {}: rhs {} is not transpose {{perm=[1,0]}}", g.label(mm.result),
              g.label(rhs));
    return false;
  }
  *match = LinearMatch{};
  match->matmul = pos;
  match->x = mm.operands[0];
  match->w = w;
  return true;
}

// Whether the matched matmul's only use is add(m, b) or add(b, m) with b : f32[N]; sets
// bias and add. Logs why not.
bool can_absorb_bias(const Graph& g, LinearMatch* match) {
  const ValueId m = g.f.ops[match->matmul].result;
  const int user = g.sole_user(m);
  if (user < 0) {
    debug_log(kPass, "matmul {}: bias not absorbed: the product has {} uses{}", g.label(m),
              g.uses[m], g.uses[m] == 1 ? " (a function result)" : "");
    return false;
  }
  const Op& add = g.f.ops[user];
  if (add.kind != OpKind::add) {
    debug_log(kPass, "matmul {}: no bias: its only user is a {}", g.label(m),
              ir::op_name(add.kind));
    return false;
  }
  const ValueId b = add.operands[0] == m ? add.operands[1] : add.operands[0];
  const TensorType want{DType::f32, {g.f.type(match->w).shape[0]}};
  if (!(g.f.type(b) == want)) {
    debug_log(kPass, "matmul {}: add {} is not a bias add: {} is {}, not {}", g.label(m),
              g.label(add.result), g.label(b), ir::to_string(g.f.type(b)), ir::to_string(want));
    return false;
  }
  match->bias = b;
  match->add = user;
  return true;
}

// Whether the pre-activation's only use is an activation the linear kernel applies
// (ir::is_linear_activation: relu, gelu, gelu_tanh, silu, sigmoid, tanh); sets act. Logs
// why not.
bool can_absorb_activation(const Graph& g, LinearMatch* match) {
  const ValueId pre = g.f.ops[match->last()].result;
  const int user = g.sole_user(pre);
  if (user < 0) {
    debug_log(kPass, "{}: act none: the pre-activation has {} uses{}", g.label(pre), g.uses[pre],
              g.uses[pre] == 1 ? " (a function result)" : "");
    return false;
  }
  const OpKind kind = g.f.ops[user].kind;
  if (kind == OpKind::linear || !ir::is_linear_activation(ir::op_name(kind))) {
    debug_log(kPass, "{}: act none: the pre-activation's only user is a {}", g.label(pre),
              ir::op_name(kind));
    return false;
  }
  match->act = user;
  return true;
}

// Replaces the last matched op with the linear; the other matched ops become dead.
void fuse(Function& f, const Graph& g, const LinearMatch& match) {
  LinearMatch check;
  KILN_ASSERT(can_fuse_linear(g, match.matmul, &check) && check.x == match.x && check.w == match.w,
              "fuse-linear: the matmul does not match");
  KILN_ASSERT(
      match.add < 0 || (match.bias >= 0 && g.sole_user(f.ops[match.matmul].result) == match.add),
      "fuse-linear: the bias add is not the matmul's only use");
  KILN_ASSERT(match.act < 0 || ir::is_linear_activation(ir::op_name(f.ops[match.act].kind)),
              "fuse-linear: the activation is not one the linear kernel applies");
  Op& last = f.ops[match.last()];
  KILN_ASSERT(f.type(last.result) == f.type(f.ops[match.matmul].result),
              "fuse-linear: the epilogue changes the type");
  std::vector<ValueId> operands = {match.x, match.w};
  if (match.bias >= 0) operands.push_back(match.bias);
  const char* act = match.act >= 0 ? ir::op_name(f.ops[match.act].kind) : "none";
  debug_log(kPass, "fused {} = linear({}, {}{}) {{act={}}}", g.label(last.result), g.label(match.x),
            g.label(match.w), match.bias >= 0 ? ", " + g.label(match.bias) : std::string(), act);
  last.kind = OpKind::linear;
  last.operands = std::move(operands);
  last.attrs = {{"act", std::string(act)}};
}

// GPT-2's Conv1D: matmul(x, W) with W a plain weight [K, N] stored [in, out] becomes
// matmul(x, transpose(W.T)) where W.T = transpose(@W) {perm = [1, 0]} is a module weight
// [N, K] derived at load time (it names the same checkpoint tensor): the form fused below.
// Returns whether anything changed.
bool expose_in_out_weights(ir::Module& m, Function& f) {
  const std::vector<int> defs = def_index(f);
  std::vector<std::string> rewrite(f.ops.size());  // the [in, out] weight's name, or empty
  bool any = false;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const Op& mm = f.ops[i];
    if (mm.kind != OpKind::matmul || f.type(mm.operands[0]).rank() < 2) continue;
    const Op* w = def_op(f, defs, mm.operands[1]);
    if (!w || w->kind != OpKind::weight) continue;
    const TensorType& wt = f.type(w->result);
    const ir::Weight* decl = m.find_weight(w->str_attr("name"));
    if (wt.dtype != DType::f32 || wt.rank() != 2 || !decl || decl->derivation) continue;
    const ir::WeightDerivation want{
        "transpose", {decl->name}, {{"perm", std::vector<int64_t>{1, 0}}}};
    const ir::Weight* t = m.find_weight(decl->name + ".T");
    if (t && !(t->derivation && *t->derivation == want)) {
      debug_log(kPass, "matmul {}: weight '{}.T' exists and is not the transpose of '{}'",
                value_label(f, mm.result), decl->name, decl->name);
      continue;
    }
    rewrite[i] = decl->name;  // before the push_back below, which may move *decl
    any = true;
    if (!t)
      m.weights.push_back(
          ir::Weight{rewrite[i] + ".T", TensorType{DType::f32, {wt.shape[1], wt.shape[0]}}, want});
  }
  if (!any) return false;
  std::vector<Op> ops;
  ops.reserve(f.ops.size());
  for (size_t i = 0; i < f.ops.size(); ++i) {
    if (!rewrite[i].empty()) {
      const Op& mm = f.ops[i];
      const TensorType wt = f.type(mm.operands[1]);
      const std::string name = rewrite[i] + ".T";
      Op tw = make_op(f, mm, OpKind::weight, {}, TensorType{DType::f32, {wt.shape[1], wt.shape[0]}},
                      {{"name", name}});
      Op tr = make_op(f, mm, OpKind::transpose, {tw.result}, wt,
                      {{"perm", std::vector<int64_t>{1, 0}}});
      debug_log(kPass, "matmul {}: [in, out] weight '{}' read as transpose(@{})",
                value_label(f, mm.result), rewrite[i], name);
      f.ops[i].operands[1] = tr.result;
      ops.push_back(std::move(tw));
      ops.push_back(std::move(tr));
    }
    ops.push_back(std::move(f.ops[i]));
  }
  f.ops = std::move(ops);
  remove_dead_code(f);  // the [in, out] weight op, when nothing else reads it
  return true;
}

bool fuse_function(Function& f) {
  const Graph g(f);
  bool changed = false;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    LinearMatch match;
    if (f.ops[i].kind != OpKind::matmul || !can_fuse_linear(g, static_cast<int>(i), &match))
      continue;
    can_absorb_bias(g, &match);
    can_absorb_activation(g, &match);
    fuse(f, g, match);
    changed = true;
  }
  if (changed) remove_dead_code(f);
  return changed;
}

}  // namespace

bool fuse_linear(ir::Module& module) {
  return rewrite_functions(module, [&](Function& f) {
    const bool exposed = expose_in_out_weights(module, f);
    return fuse_function(f) || exposed;
  });
}

}  // namespace kiln::passes
