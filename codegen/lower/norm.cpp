// Lowering of layernorm and add_layernorm (whose kernel also writes its
// add_layernorm_sum, when it has one) to the row-wise norm kernel.
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "codegen/lower/lowering.h"
#include "support/error.h"

namespace kiln::codegen::lowering {

using ir::OpKind;
using rt::DimExpr;
using rt::Storage;

void lower_layernorm(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& type = f.type(op.result);
  bool with_add = op.kind == OpKind::add_layernorm;
  auto sum = L.sum_of.find(op.result);
  const bool with_sum = sum != L.sum_of.end();
  const bool broadcast_y = with_add && !(f.type(op.operands[1]) == type);
  LayerNormKernel k{type.shape.back().value, op.float_attr("eps"), with_add, with_sum, broadcast_y};
  k.unbiased = op.has_attr("unbiased") && op.int_attr("unbiased") == 1;
  k.eps_outside = op.has_attr("eps_outside") && op.int_attr("eps_outside") == 1;
  k.rms = op.has_attr("rms") && op.int_attr("rms") == 1;
  View out = L.output_view(op);
  rt::StepDesc s{L.kernel_index(k), fmt::format("{} %{}", ir::op_name(op.kind), op.result), {}};
  s.args.push_back(L.rows_arg(op, 0));
  if (with_add) s.args.push_back(L.rows_arg(op, 1));
  for (size_t i = with_add ? 2 : 1; i < op.operands.size(); ++i)
    s.args.push_back(L.view_of(op.operands[i], op).halide());
  s.args.push_back(*L.rows_view(out, op));
  if (with_sum) {
    const ir::Op& sum_op = f.ops[static_cast<size_t>(sum->second)];
    View sv = L.output_view(sum_op);
    s.args.push_back(*L.rows_view(sv, sum_op));
    L.views[sum_op.result] = sv;
  }
  L.fd.steps.push_back(std::move(s));
  L.views[op.result] = out;
}

void lower_add_layernorm_sum(FunctionLowering& L, const ir::Op& op) {
  // Written by its add_layernorm's kernel (below), which set its view.
  KILN_ASSERT(L.views.count(op.result), "lowering: add_layernorm_sum before its sum");
}

}  // namespace kiln::codegen::lowering
