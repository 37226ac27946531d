// restrict-vocabulary (restrict_vocabulary.h).
#include "passes/restrict_vocabulary.h"

#include "passes/rewrite.h"

namespace kiln::passes {
namespace {

using ir::Function;
using ir::Op;
using ir::OpKind;
using ir::ValueId;

constexpr const char* kPass = "restrict-vocabulary";

// The rank-1 i64 value (linear_rows's ids) that `i` broadcasts along every axis but the last,
// through an expand and a reshape that only adds leading 1s; -1 when `i` is not such a
// broadcast.
ValueId broadcast_vector(const Function& f, const std::vector<int>& defs, ValueId i) {
  const Op* e = def_op(f, defs, i);
  if (!e || e->kind != OpKind::expand) return -1;
  ValueId v = e->operands[0];
  if (const Op* r = def_op(f, defs, v); r && r->kind == OpKind::reshape) {
    const ir::TensorType& t = f.type(v);
    for (size_t d = 0; d + 1 < t.shape.size(); ++d)
      if (!t.shape[d].is_const(1)) return -1;
    v = r->operands[0];
  }
  const ir::TensorType& t = f.type(v);
  if (t.rank() != 1 || t.dtype != ir::DType::i64 || !(t.shape[0] == f.type(i).shape.back()))
    return -1;
  return v;
}

bool is_weight(const Function& f, const std::vector<int>& defs, ValueId v) {
  const Op* w = def_op(f, defs, v);
  return w && w->kind == OpKind::weight;
}

bool rewrite_function(Function& f) {
  const std::vector<int> defs = def_index(f);
  bool changed = false;
  for (Op& op : f.ops) {
    if (op.kind != OpKind::take_along_axis) continue;
    const ir::TensorType& type = f.type(op.result);
    const int64_t axis = op.int_attr("axis");
    if (axis != -1 && axis != type.rank() - 1) continue;
    const Op* lin = def_op(f, defs, op.operands[0]);
    if (!lin || lin->kind != OpKind::linear) continue;
    const ValueId ids = broadcast_vector(f, defs, op.operands[1]);
    if (ids < 0) {
      debug_log(kPass, "{}: the ids are not one vector broadcast along the rows",
                value_label(f, op.result));
      continue;
    }
    if (!is_weight(f, defs, lin->operands[1]) ||
        (lin->operands.size() == 3 && !is_weight(f, defs, lin->operands[2]))) {
      debug_log(kPass, "{}: the linear's weight or bias is not a weight",
                value_label(f, op.result));
      continue;
    }
    std::vector<ValueId> operands = {lin->operands[0], lin->operands[1], ids};
    if (lin->operands.size() == 3) operands.push_back(lin->operands[2]);
    ir::Attrs attrs = {{"act", lin->str_attr("act")}};
    debug_log(kPass, "{} = the rows {} of {}'s weight", value_label(f, op.result),
              value_label(f, ids), value_label(f, lin->result));
    op.kind = OpKind::linear_rows;
    op.operands = std::move(operands);
    op.attrs = std::move(attrs);
    changed = true;
  }
  if (changed) remove_dead_code(f);
  return changed;
}

}  // namespace

bool restrict_vocabulary(ir::Module& module) { return rewrite_functions(module, rewrite_function); }

}  // namespace kiln::passes
