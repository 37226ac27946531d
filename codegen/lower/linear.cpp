// Lowering of `linear`: the linear kernel on a load-time weight laid out for it (f32
// panels, bf16 or int8), or the general matmul for a weight computed at run time; and of
// `linear_rows`: the linear kernel over the gathered rows of the weight, in f32 on the weight
// as stored, or with bf16 or int8 weights on the full linear's packed weight (the general
// matmul on a GPU).
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "codegen/lower/lowering.h"
#include "passes/rewrite.h"
#include "support/error.h"
#include "support/int8.h"

namespace kiln::codegen::lowering {

using ir::OpKind;
using rt::DimExpr;
using rt::Storage;

namespace {

// The arguments of a linear kernel for its load-time weight `w` laid out as the kernel `k`
// reads it (weight_index lays it out): [K, N], [N/panel, K, panel], for bf16
// [N/64, K/2, 64, 2], for int8 [N/64, K/4, 64, 4] then its scales and row sums.
void push_weight_args(FunctionLowering& L, rt::StepDesc& s, const ir::Op& w,
                      const LinearKernel& k) {
  const int32_t wi = L.module.weight_index(w.str_attr("name"), true, k.panel, k.bf16, k.int8);
  std::vector<ir::Dim> stored;
  int64_t stored_numel = 1;
  for (int64_t d : L.module.out.plan.weights[static_cast<size_t>(wi)].shape) {
    stored.push_back(ir::Dim::constant(d));
    stored_numel *= d;
  }
  if (k.bf16_fma) stored.pop_back();  // the pairs of bf16 as int32: [N/64, K/2, 64]
  View wv = L.dense_view(ir::TensorType{ir::DType::f32, stored}, Storage::weight, wi, 0);
  if (k.bf16) wv.type = k.bf16_fma ? KILN_I32 : KILN_BF16;
  if (k.int8) wv.type = KILN_I8;
  s.args.push_back(wv.halide());
  if (k.int8) {
    const int64_t Np = stored[0].value * 64;
    const ir::TensorType rows{ir::DType::f32, {ir::Dim::constant(Np)}};
    s.args.push_back(L.dense_view(rows, Storage::weight, wi, stored_numel).halide());
    View sums = L.dense_view(rows, Storage::weight, wi, stored_numel + 4 * Np);
    sums.type = KILN_I32;
    s.args.push_back(sums.halide());
  }
}

void check_int8_k(const ir::Op& op, int64_t K) {
  if (K > int8::kMaxK)
    fail("{} %{}: K = {} is more than int8 weights allow ({}: the int32 sums must be exact)",
         ir::op_name(op.kind), op.result, K, int8::kMaxK);
}

}  // namespace

bool runs_bf16_linear(const FunctionLowering& L, const ir::Op& op) {
  if (op.kind != OpKind::linear || !L.module.options.bf16_weights || L.module.options.gpu)
    return false;
  const ir::Op* w = passes::def_op(L.f, L.defs, op.operands[1]);
  return w && w->kind == OpKind::weight;  // else the general matmul
}

void lower_linear(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::Op* w = passes::def_op(f, L.defs, op.operands[1]);
  if (!w || w->kind != OpKind::weight) {
    // A weight computed at run time: the general matmul, reading W[N,K] as Wᵀ.
    lower_general_matmul(L, op, /*transpose_b=*/true);
    return;
  }
  const ir::TensorType& wt = f.type(op.operands[1]);
  const int64_t N = wt.shape[0].value, K = wt.shape[1].value;
  LinearKernel k{K, N, op.str_attr("act"), op.operands.size() == 3, linear_panel_for(N)};
  // An [in, out] weight (fuse-linear's transpose(@W)) is transposed at load time
  // (WeightDesc::source_kn) and takes any layout, as a weight stored [out, in] does.
  if (L.module.options.gpu) {
    k.panel = 0;  // Wᵀ [K, N] (LowerOptions::gpu)
  } else if (runs_bf16_linear(L, op)) {
    k.bf16 = true;
    k.bf16_fma = L.module.options.bf16_fma;
    k.panel = 64;
  } else if (L.module.options.int8_weights) {
    check_int8_k(op, K);
    k.int8 = true;
    k.panel = 64;
  }
  View out = L.output_view(op);
  if (k.bf16) {  // activations stored in bf16 (plan_bf16_activations)
    k.x_bf16 = L.view_of(op.operands[0], op).type == KILN_BF16;
    k.out_bf16 = L.bf16_values.count(op.result) > 0;
    if (k.out_bf16) out.type = KILN_BF16;
  }
  rt::StepDesc s{L.kernel_index(k), fmt::format("linear %{}", op.result), {}};
  s.args.push_back(L.rows_arg(op, 0));
  push_weight_args(L, s, *w, k);
  if (k.has_bias) s.args.push_back(L.view_of(op.operands[2], op).halide());
  s.args.push_back(*L.rows_view(out, op));
  L.fd.steps.push_back(std::move(s));
  L.views[op.result] = out;
}

void lower_linear_rows(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& wt = f.type(op.operands[1]);
  // The ids, where a caller gives them, are checked at the call (the kernels clamp them).
  L.limit_param(op.operands[2], wt.shape[0], "token id");
  if (L.module.options.gpu) {  // the general matmul, reading column n from row ids(n) of W
    lower_general_matmul(L, op, /*transpose_b=*/true);
    return;
  }
  const bool has_bias = op.operands.size() == 4;
  LinearKernel k{wt.shape[1].value, wt.shape[0].value, op.str_attr("act"), has_bias, 0};
  k.rows = true;
  // bf16 and int8 builds: the packed weight the full linear reads (one plan weight for both),
  // in the same product form.
  const ir::Op* w = passes::def_op(f, L.defs, op.operands[1]);
  if (w && w->kind == OpKind::weight) {
    if (L.module.options.bf16_weights) {
      k.bf16 = true;
      k.bf16_fma = L.module.options.bf16_fma;
      k.panel = 64;
    } else if (L.module.options.int8_weights) {
      check_int8_k(op, k.K);
      k.int8 = true;
      k.panel = 64;
    }
  }
  const View out = L.output_view(op);
  rt::StepDesc s{L.kernel_index(k), fmt::format("linear_rows %{}", op.result), {}};
  s.args.push_back(L.rows_arg(op, 0));
  if (k.bf16 || k.int8)
    push_weight_args(L, s, *w, k);
  else  // W as stored, [V, K] (a weight: the checkpoint's pages, mapped, in f32 builds)
    s.args.push_back(L.dense(L.view_of(op.operands[1], op), wt,
                             fmt::format("copy %{} for linear_rows %{}", op.operands[1], op.result))
                         .halide());
  s.args.push_back(L.view_of(op.operands[2], op).halide());
  if (has_bias) s.args.push_back(L.view_of(op.operands[3], op).halide());
  s.args.push_back(*L.rows_view(out, op));
  L.fd.steps.push_back(std::move(s));
  L.views[op.result] = out;
}

}  // namespace kiln::codegen::lowering
