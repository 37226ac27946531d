// Lowering of the elementwise ops, gathers, constants and iotas: one elementwise kernel
// per group that fuse-elementwise marked, built as an expression tree from its root.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "codegen/lower/lowering.h"
#include "ir/op_types.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::codegen::lowering {

using ir::OpKind;
using rt::DimExpr;
using rt::Storage;

// A group's root (an unfused op) computes the ops marked fused below it; a fused op is
// skipped where it stands (its root's kernel computes it), as is an unread one.
void lower_elementwise(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& type = f.type(op.result);
  if (L.inlined(op.result)) return;  // evaluated inside its user's kernel
  if (L.uses[op.result] == 0) return;

  // A group root: build its expression tree.
  ElementwiseKernel k;
  k.out_rank = static_cast<int>(type.rank());
  std::vector<ir::ValueId> inputs;
  std::function<int(ir::ValueId, bool)> node = [&](ir::ValueId v, bool is_root) -> int {
    const ir::Op* d = passes::def_op(f, L.defs, v);
    const ir::TensorType& t = f.type(v);
    ElementwiseKernel::Node n;
    n.dtype = node_dtype(t.dtype);
    n.rank = static_cast<int>(t.rank());
    if (is_root || (d && L.inlined(v))) {
      n.op = d->kind;
      if (d->kind == OpKind::constant) {
        n.kind = ElementwiseKernel::Node::Kind::constant;
        n.value = d->float_attr("value");
      }
      if (d->kind == OpKind::iota) n.axis = d->int_attr("axis");
      if (d->kind == OpKind::take_along_axis)
        n.axis = ir::normalize_axis(d->int_attr("axis"), t.rank());
      if (d->kind == OpKind::gather) n.table_rows = f.type(d->operands[0]).shape[0].value;
      for (ir::ValueId o : d->operands) n.operands.push_back(node(o, false));
    } else {
      n.kind = ElementwiseKernel::Node::Kind::input;
      auto it = std::find(inputs.begin(), inputs.end(), v);
      n.input = static_cast<int>(it - inputs.begin());
      if (it == inputs.end()) inputs.push_back(v);
      // Broadcast flags: a size-1 dim under a larger output dim (right-aligned).
      n.broadcast.assign(t.rank(), false);
      for (int64_t dd = 0; dd < t.rank(); ++dd) {
        int64_t od = type.rank() - t.rank() + dd;
        if (od >= 0 && t.shape[dd].is_const(1) && !type.shape[od].is_const(1))
          n.broadcast[dd] = true;
      }
    }
    k.nodes.push_back(std::move(n));
    return static_cast<int>(k.nodes.size() - 1);
  };
  node(op.result, true);
  View out = L.output_view(op);
  rt::StepDesc s{L.kernel_index(k), fmt::format("{} %{}", ir::op_name(op.kind), op.result), {}};
  for (ir::ValueId in : inputs) s.args.push_back(L.view_of(in, op).halide());
  s.args.push_back(out.halide());
  L.fd.steps.push_back(std::move(s));
  L.views[op.result] = out;
}

}  // namespace kiln::codegen::lowering
