// Lowering of attention (the fused kernel) and of incremental decoding's ops: the cache
// write (a runtime builtin, in place) and the one-row cache and memory attentions.
#include <optional>
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

// With bf16 or int8 weights both products in bf16 (AttentionKernel::bf16), where dk is even,
// unless the products run on FMAs (LowerOptions::bf16_fma: attention stays f32). An int8 build
// runs its linears on vpdpbusd either way; its attention in bf16 took W4 (1024 positions, AMD Zen
// 5, 2 threads) from 53.8–56.5 to 40.0–40.8 ms per encode, the attention from 5.06–5.16 to
// 2.89–2.93 ms per layer.
bool runs_bf16_attention(const FunctionLowering& L, const ir::Op& op) {
  const LowerOptions& o = L.module.options;
  if (op.kind != OpKind::attention || !(o.bf16_weights || o.int8_weights) || o.bf16_fma)
    return false;
  const int64_t heads = op.int_attr("heads");
  return heads > 0 && L.f.type(op.operands[0]).shape[2].value / heads % 2 == 0;
}

void lower_attention(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& q = f.type(op.operands[0]);
  const ir::TensorType& v = f.type(op.operands[2]);
  const int64_t heads = op.int_attr("heads");
  const int64_t kv_heads = op.has_attr("kv_heads") ? op.int_attr("kv_heads") : heads;
  auto flag = [&](const char* name) { return op.has_attr(name) && op.int_attr(name) == 1; };
  const ir::AttentionOperands at = ir::attention_operands(op.attrs, op.operands.size());
  AttentionKernel k;
  k.heads = heads;
  k.dk = q.shape[2].value / heads;
  k.dv = v.shape[2].value / kv_heads;
  k.causal = flag("causal");
  k.key_padding = at.key_pad >= 0;
  k.scale = op.float_attr("scale");
  k.fill_inf = flag("fill_inf");
  k.query_padding = at.query_pad >= 0;
  k.kv_heads = kv_heads == heads ? 0 : kv_heads;
  k.bias = at.bias >= 0;
  k.window = op.has_attr("window") ? op.int_attr("window") : 0;
  k.softcap = op.has_attr("softcap") ? op.float_attr("softcap") : 0;
  k.bf16 = runs_bf16_attention(L, op);
  View out = L.output_view(op);
  if (k.bf16) {  // activations stored in bf16 (plan_bf16_activations)
    auto bf16_operand = [&](int i) { return L.view_of(op.operands[i], op).type == KILN_BF16; };
    k.q_bf16 = bf16_operand(0);
    k.k_bf16 = bf16_operand(1);
    k.v_bf16 = bf16_operand(2);
    k.out_bf16 = L.bf16_values.count(op.result) > 0;
    if (k.out_bf16) out.type = KILN_BF16;
  }
  rt::StepDesc s{L.kernel_index(k), fmt::format("attention %{}", op.result), {}};
  for (ir::ValueId operand : op.operands) s.args.push_back(L.view_of(operand, op).halide());
  s.args.push_back(out.halide());
  L.fd.steps.push_back(std::move(s));
  L.views[op.result] = out;
}

void lower_cache_write(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  // In place: the cache is a parameter read only here, and the result is returned,
  // so the caller's cache buffer serves as both (the runtime insists on it).
  const ir::ValueId cache = op.operands[0];
  auto p = L.param_index.find(cache);
  auto r = L.result_index.find(op.result);
  if (p == L.param_index.end() || L.uses[cache] != 1 || r == L.result_index.end())
    fail(
        "{}function '{}': cache_write {} must update a parameter that nothing else "
        "reads and be a result of the function (compiled code writes the cache in place)",
        ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result));
  const bool at_pos = op.operands.size() == 3;
  if (at_pos && L.param_index.find(op.operands[2]) == L.param_index.end())
    fail("{}function '{}': cache_write {} must take its position from a parameter",
         ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result));
  const View& x = L.view_of(op.operands[1], op);
  if (x.storage != Storage::param && x.storage != Storage::arena)
    fail("{}function '{}': cache_write {} writes rows of a weight or table",
         ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result));
  const ir::TensorType& ct = f.type(cache);
  L.fd.results[static_cast<size_t>(r->second)].updates_param = p->second;
  const ir::TensorType& xt = f.type(op.operands[1]);
  const std::string& x_name = f.values[op.operands[1]].name;
  const std::string x_label = x_name.empty() ? passes::value_label(f, op.operands[1]) : x_name;
  if (at_pos)
    L.limit_param(op.operands[2], ct.shape[0], "position");
  else
    L.check_le(
        xt.shape[1], ct.shape[0],
        fmt::format("the positions of '{}' must fit in cache '{}'", x_label, f.values[cache].name));
  L.check_le(xt.shape[0], ct.shape[1],
             fmt::format("the rows of '{}' must fit in the slots of cache '{}'", x_label,
                         f.values[cache].name));
  View out = L.output_view(op);
  rt::StepDesc st{-1, fmt::format("cache_write %{}", op.result), {}, rt::Builtin::cache_write};
  // x's rows (d, n·L) seen as (d, l, n): rows_arg keeps a uniform row stride.
  rt::BufferDesc rows = L.rows_arg(op, 1);
  const rt::DimExpr len = L.dim(xt.shape[1]), row = rows.strides[1];
  rows.extents = {rows.extents[0], len, L.dim(xt.shape[0])};
  rows.strides = {rows.strides[0], row, row * len};
  st.args.push_back(std::move(rows));
  if (at_pos) st.args.push_back(L.view_of(op.operands[2], op).halide());
  st.args.push_back(out.halide());
  L.fd.steps.push_back(std::move(st));
  L.views[op.result] = out;
}

void lower_step_attention(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const bool memory = op.kind == OpKind::memory_attention;
  const ir::TensorType& q = f.type(op.operands[0]);
  const ir::TensorType& kt = f.type(op.operands[1]);
  const ir::TensorType& vt = f.type(op.operands[2]);
  const int64_t heads = op.int_attr("heads");
  const int64_t groups = op.has_attr("kv_heads") ? op.int_attr("kv_heads") : heads;
  StepAttentionKernel k{heads,
                        q.shape[2].value / heads,
                        vt.shape[2].value / groups,
                        memory,
                        op.float_attr("scale"),
                        groups == heads ? 0 : groups,
                        op.has_attr("window") ? op.int_attr("window") : 0,
                        !memory && op.operands.size() == 5};
  const ir::ValueId index = op.operands[3];
  if (memory) {
    L.limit_param(index, kt.shape[0], "source row");
  } else {
    L.limit_param(index, kt.shape[1], "cache slot", /*allow_minus_one=*/true);
    L.check_le(f.type(index).shape[1], kt.shape[0],
               fmt::format("the positions of '{}' must fit in the cache", f.values[index].name));
  }
  View out = L.output_view(op);
  rt::StepDesc st{L.kernel_index(k), fmt::format("{} %{}", ir::op_name(op.kind), op.result), {}};
  st.args.push_back(L.rows_arg(op, 0));
  for (size_t i = 1; i < op.operands.size(); ++i)
    st.args.push_back(L.view_of(op.operands[i], op).halide());
  st.args.push_back(*L.rows_view(out, op));
  L.fd.steps.push_back(std::move(st));
  L.views[op.result] = out;
}

}  // namespace kiln::codegen::lowering
