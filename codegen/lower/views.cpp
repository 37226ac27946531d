// Lowering of the ops that bind memory without computing: weights, the sinusoid table,
// and reshape and slice as views of their operand (a copy only where strides require).
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "codegen/lower/lowering.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::codegen::lowering {

using ir::OpKind;
using rt::DimExpr;
using rt::Storage;

// A load-time weight, as declared.
void lower_weight(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& type = f.type(op.result);
  const ir::Weight* w = L.module.m.find_weight(op.str_attr("name"));
  auto transposed_concat = [](const ir::WeightDerivation& d) {
    auto it = d.attrs.find("transpose");
    return d.op == "concat" && it != d.attrs.end() && std::get<int64_t>(it->second) == 1;
  };
  if (w && w->derivation &&
      (w->derivation->op == "transpose" || transposed_concat(*w->derivation))) {
    // An [in, out] weight read as W.T (fuse-linear), or a concatenation of such
    // (merge-projections): only linears read it, laying out the stored tensors themselves
    // (lower_linear); the transposed tensor itself never exists.
    for (const ir::Op& user : f.ops)
      for (size_t i = 0; i < user.operands.size(); ++i)
        if (user.operands[i] == op.result && !(user.kind == OpKind::linear && i == 1))
          fail(
              "{}function '{}': weight '{}' (the transpose of an [in, out] weight) is read by "
              "{} {}, and only a linear's weight operand can read it",
              ir::line_prefix(user.loc), f.name, w->name, ir::op_name(user.kind),
              passes::value_label(f, user.result));
    return;
  }
  L.views[op.result] =
      L.dense_view(type, Storage::weight, L.module.weight_index(op.str_attr("name"), false), 0);
}

// A table computed at load time, for the rows the symbols' maxima allow.
void lower_sinusoid_table(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& type = f.type(op.result);
  View v =
      L.dense_view(type, Storage::table,
                   L.module.table_index(L.module.dim_max(type.shape[0]), type.shape[1].value), 0);
  L.views[op.result] = v;
}

void lower_reshape(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& type = f.type(op.result);
  // A view of the operand's memory when its strides allow (always when it is
  // dense), else of a dense copy of it.
  const View& src = L.view_of(op.operands[0], op);
  std::vector<DimExpr> to;
  for (const ir::Dim& d : type.shape) to.push_back(L.dim(d));
  std::optional<View> v;
  if (src.dense()) {
    v = L.dense_view(type, src.storage, src.index, src.byte_offset);
    v->elem_offset = src.elem_offset;
  } else {
    v = src.reshaped(to);
  }
  if (!v) {
    const View c = L.dense(src, f.type(op.operands[0]),
                           fmt::format("copy %{} for reshape %{}", op.operands[0], op.result));
    v = L.dense_view(type, c.storage, c.index, c.byte_offset);
  }
  L.views[op.result] = *v;
  L.copy_if_result(op);
}

void lower_slice(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& type = f.type(op.result);
  // A view of the operand: offset += start · stride[axis], extent from the type.
  // Offsets stay monomials, so a nonzero start needs a constant stride and offset.
  // Where the offset is not one monomial, a view of a dense copy of the operand.
  View v = L.view_of(op.operands[0], op);
  int64_t axis = op.int_attr("axis");
  if (axis < 0) axis += static_cast<int64_t>(v.extents.size());
  const int64_t start = op.int_attr("start");
  if (start != 0) {
    std::optional<DimExpr> offset =
        add_offsets(v.elem_offset, DimExpr::constant(start) * v.strides[axis]);
    if (!offset) {
      v = L.scratch(f.type(op.operands[0]));
      L.copy(L.view_of(op.operands[0], op), v,
             fmt::format("copy %{} for slice %{}", op.operands[0], op.result));
      offset = DimExpr::constant(start) * v.strides[axis];
    }
    v.elem_offset = *offset;
  }
  v.extents[axis] = L.dim(type.shape[axis]);
  L.views[op.result] = v;
  L.copy_if_result(op);
}

}  // namespace kiln::codegen::lowering
