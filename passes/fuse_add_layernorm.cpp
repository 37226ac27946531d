// fuse-add-layernorm: layernorm(add(x, y)) -> add_layernorm(x, y) (see fuse_add_layernorm.h).
//
// Algorithm: every layernorm is an anchor. can_fuse_add_layernorm() checks that its input
// is an add of two same-typed operands whose other uses, if any, all come after the
// layernorm; the rewrite turns the layernorm into add_layernorm in place (same result
// value and attributes, so eps and the variant flags carry over; the addends are defined
// before the add, hence before it), inserts an
// add_layernorm_sum right after it for a sum with other uses and moves those uses to it,
// and remove_dead_code drops the adds left unused.
#include "passes/fuse_add_layernorm.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "ir/op_types.h"
#include "passes/notes.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

using ir::Function;
using ir::Op;
using ir::OpKind;
using ir::ValueId;

constexpr const char* kPass = "fuse-add-layernorm";

// Def/use facts, computed once per function: `user` is each value's last user.
struct Graph : UseInfo {
  using UseInfo::UseInfo;
  std::vector<int> first_user;  // the first op using each value (-1: none)
  explicit Graph(const Function& fn) : UseInfo(fn), first_user(fn.values.size(), -1) {
    for (size_t i = fn.ops.size(); i-- > 0;)
      for (ValueId v : fn.ops[i].operands) first_user[v] = static_cast<int>(i);
  }
};

// The add's operands as add_layernorm's (x, y): y of x's type, or broadcast over x's
// leading dims (ir::broadcasts_over_leading_dims: [S,D] or ViT's [1,S,D] positions over
// [B,S,D]; either operand order: float addition commutes); (-1, -1) for any other
// broadcast. x must have the sum's type (y the one repeated).
std::pair<ValueId, ValueId> addend_order(const Function& f, const Op& add) {
  const ValueId a = add.operands[0], b = add.operands[1];
  if (f.type(a) == f.type(b)) return {a, b};
  const ir::TensorType& sum = f.type(add.result);
  if (f.type(a) == sum && ir::broadcasts_over_leading_dims(f.type(b), sum)) return {a, b};
  if (f.type(b) == sum && ir::broadcasts_over_leading_dims(f.type(a), sum)) return {b, a};
  return {-1, -1};
}

// Whether the layernorm at `pos` can absorb the add defining its input; logs why not.
// Sets *keep_sum when the sum has other uses, all after the layernorm (pre-norm): the
// add_layernorm then also gives the sum, as an add_layernorm_sum.
bool can_fuse_add_layernorm(const Graph& g, int pos, bool* keep_sum) {
  const Function& f = g.f;
  const Op& norm = f.ops[pos];
  KILN_ASSERT(norm.kind == OpKind::layernorm && norm.operands.size() >= 2,
              "can_fuse_add_layernorm: not a layernorm");
  const ValueId s = norm.operands[0];
  const Op* add = def_op(f, g.defs, s);
  if (!add || add->kind != OpKind::add) {
    debug_log(kPass, "{}: input {} is not an add", value_label(f, norm.result), value_label(f, s));
    return false;
  }
  const ValueId x = add->operands[0], y = add->operands[1];
  if (!(f.type(x) == f.type(y)) && addend_order(f, *add).first < 0) {
    debug_log(kPass, "{}: add {} broadcasts {} and {} other than over leading dims",
              value_label(f, norm.result), value_label(f, s), ir::to_string(f.type(x)),
              ir::to_string(f.type(y)));
    note_lost_fusion(f, norm, kPass, "norm-shaped subgraph",
                     fmt::format("the residual add of {} and {} broadcasts other than over "
                                 "leading dims",
                                 ir::to_string(f.type(x)), ir::to_string(f.type(y))));
    return false;
  }
  *keep_sum = g.uses[s] != 1;
  if (*keep_sum && g.first_user[s] != pos) {
    // The sum op comes right after the add_layernorm, so every other use must follow it.
    debug_log(kPass, "{}: add {} has {} uses, one of them ({}) before the layernorm",
              value_label(f, norm.result), value_label(f, s), g.uses[s],
              value_label(f, f.ops[g.first_user[s]].result));
    note_lost_fusion(f, norm, kPass, "norm-shaped subgraph",
                     fmt::format("the residual sum is also read before the norm (by {} {}), "
                                 "and add_layernorm gives its sum only to later ops",
                                 ir::op_name(f.ops[g.first_user[s]].kind),
                                 value_label(f, f.ops[g.first_user[s]].result)));
    return false;
  }
  return true;
}

bool fuse_function(Function& f) {
  // Matching first, on the def/use facts of the unchanged function (each add is absorbed by
  // the one layernorm that reads it, so matches never share an add); then one rewrite.
  const Graph g(f);
  std::vector<int> fused;      // layernorm positions
  std::vector<bool> keep_sum;  // per fused layernorm: its sum has other uses
  for (size_t i = 0; i < f.ops.size(); ++i) {
    bool keep = false;
    if (f.ops[i].kind != OpKind::layernorm ||
        !can_fuse_add_layernorm(g, static_cast<int>(i), &keep))
      continue;
    const ValueId sum = f.ops[i].operands[0];
    const auto [x, y] = addend_order(f, f.ops[g.defs[sum]]);
    debug_log(kPass, "fused {} = layernorm(add({}, {})){}", value_label(f, f.ops[i].result),
              value_label(f, x), value_label(f, y),
              keep ? fmt::format(", and {} = its sum ({} uses)", value_label(f, sum), g.uses[sum])
                   : std::string());
    fused.push_back(static_cast<int>(i));
    keep_sum.push_back(keep);
  }
  if (fused.empty()) return false;

  // Each layernorm becomes add_layernorm in place (same result value; the addends are
  // defined before the add, hence before it). A sum with other uses is given by an
  // add_layernorm_sum inserted right after it, which takes the add's name and its uses
  // (all later, checked above); the add is left dead.
  std::vector<ValueId> replace(f.values.size(), -1);  // sum -> add_layernorm_sum
  std::vector<Op> sums(f.ops.size());                 // to insert after each position
  std::vector<bool> has_sum(f.ops.size(), false);
  for (size_t k = 0; k < fused.size(); ++k) {
    bool keep = false;
    KILN_ASSERT(can_fuse_add_layernorm(g, fused[k], &keep) && keep == keep_sum[k],
                "fuse-add-layernorm: no match");
    Op& norm = f.ops[fused[k]];
    const ValueId s = norm.operands[0];
    const int add_pos = g.defs[s];
    const auto [x, y] = addend_order(f, f.ops[add_pos]);
    norm.kind = OpKind::add_layernorm;
    std::vector<ValueId> operands = {x, y};  // then gamma [, beta]
    operands.insert(operands.end(), norm.operands.begin() + 1, norm.operands.end());
    norm.operands = std::move(operands);
    if (!keep) continue;
    Op sum = make_op(f, f.ops[add_pos], OpKind::add_layernorm_sum, {norm.result}, f.type(s));
    f.values[sum.result].name = std::move(f.values[s].name);
    f.values[s].name.clear();
    replace[s] = sum.result;
    sums[fused[k]] = std::move(sum);
    has_sum[fused[k]] = true;
  }
  std::vector<Op> ops;
  ops.reserve(f.ops.size() + fused.size());
  for (size_t i = 0; i < f.ops.size(); ++i) {
    ops.push_back(std::move(f.ops[i]));
    if (has_sum[i]) ops.push_back(std::move(sums[i]));
  }
  f.ops = std::move(ops);
  const auto replaced = [&](ValueId v) {
    return v < static_cast<ValueId>(replace.size()) && replace[v] >= 0 ? replace[v] : v;
  };
  for (Op& op : f.ops)
    if (op.kind != OpKind::add_layernorm_sum)
      for (ValueId& v : op.operands) v = replaced(v);
  for (ValueId& r : f.results) r = replaced(r);
  remove_dead_code(f);
  return true;
}

}  // namespace

bool fuse_add_layernorm(ir::Module& module) { return rewrite_functions(module, fuse_function); }

}  // namespace kiln::passes
