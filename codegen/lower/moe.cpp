// Lowering of moe_ffn: a runtime builtin step (runtime/builtins.h, moe_ffn) that calls the
// generated linear kernels once per chosen expert.
//
// Why a builtin: which rows each expert takes is known only at run time, and a plan's
// shapes are monomials of symbols bound from the inputs, so no step of the plan can be
// sized to "the rows routed to expert e". The builtin groups the rows by expert at run
// time, skips the experts no row chose, gathers each chosen expert's rows and runs the
// expert's SwiGLU over just them through three linear kernels of this plan (x·w1ᵀ with the
// silu epilogue, x·w3ᵀ, then h·w2ᵀ; the kernels take any number of rows, as every linear
// does), then adds gate · y into each row. Work: rows · top_k · 3 · D · F at the linear
// kernels' speed, each expert's weights read once per call (a Halide kernel indexing
// each row's expert instead would read them once per row). The weights are stored as the
// linear kernels read them (f32, panels when F or D is a multiple of 64). The builtin runs
// on the host: a GPU target refuses it (driver/compile.cpp).
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
  const int64_t D = f.type(op.operands[0]).shape.back().value;
  const int64_t F = f.type(op.operands[3]).shape[0].value;
  // Expert ids given as an input are checked when binding (computed ones by the builtin).
  L.limit_param(op.operands[1], ir::Dim::constant(op.int_attr("experts")), "expert id");
  const LinearKernel up_silu{D, F, "silu", false, linear_panel_for(F)};
  const LinearKernel up{D, F, "none", false, linear_panel_for(F)};
  const LinearKernel down{F, D, "none", false, linear_panel_for(D)};
  rt::StepDesc st{-1, fmt::format("moe_ffn %{}", op.result), {}, rt::Builtin::moe_ffn};
  st.calls = {L.kernel_index(up_silu), L.kernel_index(up), L.kernel_index(down)};
  for (size_t i = 0; i < 3; ++i) st.args.push_back(L.rows_arg(op, i));
  for (size_t i = 3; i < op.operands.size(); ++i) {
    const ir::Op* w = passes::def_op(f, L.defs, op.operands[i]);
    if (!w || w->kind != OpKind::weight)
      fail(
          "{}function '{}': moe_ffn {} takes its expert weights from the model's weights; operand "
          "{} ({}) is computed at run time",
          ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result), i,
          passes::value_label(f, op.operands[i]));
    const std::string& name = w->str_attr("name");
    const ir::Weight* mw = L.module.m.find_weight(name);
    if (mw && mw->derivation && mw->derivation->op == "transpose")
      fail(
          "{}function '{}': moe_ffn {} reads weight '{}', stored [in, out]; expert weights are "
          "[out, in] as nn.Linear stores them",
          ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result), name);
    // Stored as its linear kernel reads it (up: F outputs, down: D outputs).
    const int64_t panel = (i - 3) % 3 == 2 ? down.panel : up.panel;
    const int32_t wi = L.module.weight_index(name, /*linear=*/true, panel, false);
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
