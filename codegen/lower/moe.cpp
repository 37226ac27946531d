// Lowering of moe_ffn: a runtime builtin step (runtime/builtins.h, moe_ffn) over the
// expert weights as stored for linear kernels (Wᵀ).
//
// Why a builtin and not a Halide kernel: which rows each expert takes is known only at run
// time, and a plan's shapes are monomials of symbols bound from the inputs, so no kernel
// call can be sized to "the rows routed to expert e". A Halide kernel indexing each row's
// expert weights (a gathered GEMV per row and slot) would do rows · top_k products but read
// each expert's weights once per row, not once per expert. The builtin groups the rows by
// expert at run time, skips the experts no row chose, and runs one small GEMM per chosen
// expert over just its rows (x rows gathered, up and gate projections, silu · up, the down
// projection, scattered back scaled by the gate): work rows · top_k · 3 · D · F, each
// expert's weights read once per call. It runs on the host: a GPU target refuses it
// (driver/compile.cpp).
#include <string>

#include <fmt/format.h>

#include "codegen/lower/lowering.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::codegen::lowering {

using ir::OpKind;
using rt::Storage;

void lower_moe_ffn(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  // Expert ids given as an input are checked when binding (computed ones by the builtin).
  L.limit_param(op.operands[1], ir::Dim::constant(op.int_attr("experts")), "expert id");
  rt::StepDesc st{-1, fmt::format("moe_ffn %{}", op.result), {}, rt::Builtin::moe_ffn};
  for (size_t i = 0; i < 3; ++i) st.args.push_back(L.rows_arg(op, i));
  for (size_t i = 3; i < op.operands.size(); ++i) {
    const ir::Op* w = passes::def_op(f, L.defs, op.operands[i]);
    if (!w || w->kind != OpKind::weight)
      fail(
          "{}function '{}': moe_ffn {} takes its expert weights from the model's weights; operand "
          "{} ({}) is computed at run time",
          ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result), i,
          passes::value_label(f, op.operands[i]));
    // Stored as a linear kernel reads it: W[N, K] as Wᵀ [K, N] (n fastest).
    const int32_t wi = L.module.weight_index(w->str_attr("name"), /*linear=*/true, 0, false);
    std::vector<ir::Dim> stored;
    for (int64_t d : L.module.out.plan.weights[static_cast<size_t>(wi)].shape)
      stored.push_back(ir::Dim::constant(d));
    st.args.push_back(
        L.dense_view(ir::TensorType{ir::DType::f32, stored}, Storage::weight, wi, 0).halide());
  }
  View out = L.output_view(op);
  st.args.push_back(*L.rows_view(out, op));
  L.fd.steps.push_back(std::move(st));
  L.views[op.result] = out;
}

}  // namespace kiln::codegen::lowering
