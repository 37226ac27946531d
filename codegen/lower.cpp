// Lowering of an optimized module to an execution plan (see lower.h): each function's ops
// in order, each by the lowering function of its kind (codegen/lower/*.cpp, one file per
// op family), found in a table indexed by ir::OpKind.
#include "codegen/lower.h"

#include <array>

#include <fmt/format.h>

#include "codegen/lower/lowering.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::codegen {
namespace {

using ir::OpKind;
using lowering::FunctionLowering;
using lowering::LowerFn;

// An op kind that no lowering takes.
void lower_unsupported(FunctionLowering& L, const ir::Op& op) {
  fail(
      "{}function '{}': op {} ({}) has no kernel in compiled code; run the default "
      "pipeline, which fuses it, or extend codegen",
      ir::line_prefix(op.loc), L.f.name, ir::op_name(op.kind), passes::value_label(L.f, op.result));
}

constexpr size_t kOpKinds = ir::kNumOpKinds;

// The lowering of each op kind.
std::array<LowerFn, kOpKinds> make_table() {
  namespace l = lowering;
  std::array<LowerFn, kOpKinds> t;
  t.fill(lower_unsupported);
  auto set = [&](OpKind kind, LowerFn fn) { t[static_cast<size_t>(kind)] = fn; };
  for (size_t k = 0; k < kOpKinds; ++k)
    if (ir::is_elementwise_fusable(static_cast<OpKind>(k))) t[k] = l::lower_elementwise;
  // views.cpp
  set(OpKind::weight, l::lower_weight);
  set(OpKind::sinusoid_table, l::lower_sinusoid_table);
  set(OpKind::reshape, l::lower_reshape);
  set(OpKind::slice, l::lower_slice);
  // linear.cpp
  set(OpKind::linear, l::lower_linear);
  set(OpKind::linear_rows, l::lower_linear_rows);
  // attention.cpp
  set(OpKind::attention, l::lower_attention);
  set(OpKind::cache_write, l::lower_cache_write);
  set(OpKind::cache_attention, l::lower_step_attention);
  set(OpKind::memory_attention, l::lower_step_attention);
  // norm.cpp
  set(OpKind::layernorm, l::lower_layernorm);
  set(OpKind::add_layernorm, l::lower_layernorm);
  set(OpKind::add_layernorm_sum, l::lower_add_layernorm_sum);
  // general.cpp
  set(OpKind::matmul, l::lower_matmul);
  set(OpKind::transpose, l::lower_transpose);
  set(OpKind::concat, l::lower_concat);
  set(OpKind::softmax, l::lower_softmax);
  set(OpKind::reduce_sum, l::lower_reduce);
  set(OpKind::reduce_mean, l::lower_reduce);
  set(OpKind::reduce_max, l::lower_reduce);
  set(OpKind::argmax, l::lower_reduce);
  set(OpKind::topk, l::lower_topk);
  set(OpKind::scatter_add, l::lower_scatter_add);
  // moe.cpp
  set(OpKind::moe_ffn, l::lower_moe_ffn);
  return t;
}

// Compiled code has no i32 kernels: an op that takes or makes one is an error.
void check_no_i32(const ir::Function& f, const ir::Op& op) {
  bool i32 = f.type(op.result).dtype == ir::DType::i32;
  for (ir::ValueId v : op.operands) i32 = i32 || f.type(v).dtype == ir::DType::i32;
  if (i32)
    fail(
        "{}function '{}': {} {} takes or makes an i32 tensor; compiled code supports f32, "
        "i64 and bool",
        ir::line_prefix(op.loc), f.name, ir::op_name(op.kind), passes::value_label(f, op.result));
}

void lower_function(lowering::ModuleLowering& module, const ir::Function& f) {
  static const std::array<LowerFn, kOpKinds> table = make_table();
  FunctionLowering L(module, f);
  lowering::plan_bf16_activations(L);
  for (const ir::Op& op : f.ops) {
    check_no_i32(f, op);
    table[static_cast<size_t>(op.kind)](L, op);
  }
  L.finish();
}

}  // namespace

LoweredModel lower_module(const ir::Module& module, const LowerOptions& options) {
  lowering::ModuleLowering lowering(module, options);
  for (const ir::Function& f : module.functions) lower_function(lowering, f);
  return std::move(lowering.out);
}

}  // namespace kiln::codegen
