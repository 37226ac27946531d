// fuse-add-layernorm: layernorm(add(x, y)) -> add_layernorm(x, y) (see fuse_add_layernorm.h).
//
// Algorithm: every layernorm is an anchor. can_fuse_add_layernorm() checks that its input
// is a single-use add of two same-typed operands; the rewrite turns the layernorm into
// add_layernorm in place (same result value, and the addends are defined before the add,
// hence before it), and remove_dead_code drops the adds left unused.
#include "passes/fuse_add_layernorm.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

using ir::Function;
using ir::Op;
using ir::OpKind;
using ir::ValueId;

constexpr const char* kPass = "fuse-add-layernorm";

// Whether the layernorm `norm` can absorb the add defining its input; logs why not.
bool can_fuse_add_layernorm(const Function& f, const std::vector<int>& defs,
                            const std::vector<int>& uses, const Op& norm) {
  KILN_ASSERT(norm.kind == OpKind::layernorm && norm.operands.size() == 3,
              "can_fuse_add_layernorm: not a layernorm");
  const ValueId s = norm.operands[0];
  const Op* add = def_op(f, defs, s);
  if (!add || add->kind != OpKind::add) {
    debug_log(kPass, "{}: input {} is not an add", value_label(f, norm.result), value_label(f, s));
    return false;
  }
  if (uses[s] != 1) {
    debug_log(kPass, "{}: add {} has {} uses", value_label(f, norm.result), value_label(f, s),
              uses[s]);
    return false;
  }
  const ValueId x = add->operands[0], y = add->operands[1];
  if (!(f.type(x) == f.type(y))) {
    debug_log(kPass, "{}: add {} broadcasts {} and {}", value_label(f, norm.result),
              value_label(f, s), ir::to_string(f.type(x)), ir::to_string(f.type(y)));
    return false;
  }
  return true;
}

// Rewrites the layernorm at `pos` into add_layernorm; the add becomes dead.
void fuse(Function& f, const std::vector<int>& defs, const std::vector<int>& uses, size_t pos) {
  KILN_ASSERT(can_fuse_add_layernorm(f, defs, uses, f.ops[pos]), "fuse-add-layernorm: no match");
  Op& norm = f.ops[pos];
  const Op& add = f.ops[defs[norm.operands[0]]];
  debug_log(kPass, "fused {} = layernorm(add({}, {}))", value_label(f, norm.result),
            value_label(f, add.operands[0]), value_label(f, add.operands[1]));
  norm.kind = OpKind::add_layernorm;
  norm.operands = {add.operands[0], add.operands[1], norm.operands[1], norm.operands[2]};
}

bool fuse_function(Function& f) {
  const std::vector<int> defs = def_index(f);
  // Use counts stay valid while fusing: each add is absorbed by its only user, and no
  // other anchor looks at it.
  const std::vector<int> uses = use_counts(f);
  bool changed = false;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    if (f.ops[i].kind != OpKind::layernorm || !can_fuse_add_layernorm(f, defs, uses, f.ops[i]))
      continue;
    fuse(f, defs, uses, i);
    changed = true;
  }
  if (changed) remove_dead_code(f);
  return changed;
}

}  // namespace

bool fuse_add_layernorm(ir::Module& module) {
  bool changed = false;
  for (Function& f : module.functions) changed |= fuse_function(f);
  return changed;
}

}  // namespace kiln::passes
