// Which activations a bf16 build stores in bf16 (LowerOptions::bf16_activations): a value
// computed by a bf16 kernel (a linear on a bf16 weight, a bf16 attention) whose every reader
// is a bf16 kernel that rounds it to bf16 as it reads it (a bf16 linear's x; a bf16
// attention's q, k or v, directly or through last-axis slices, the views a merged QKV
// projection is split by). The producer then writes it rounded, in half the bytes, and the
// readers skip their rounding: the same numbers, half the memory traffic between the two (the
// FFN's hidden layer, the attention's inputs and output).
#include "codegen/lower/lowering.h"
#include "passes/rewrite.h"

namespace kiln::codegen::lowering {

using ir::OpKind;

namespace {

// A linear that the bf16 kernel (not linear_rows, not the general matmul) computes.
bool bf16_linear(const FunctionLowering& L, const ir::Op& op) {
  if (op.kind != OpKind::linear) return false;
  const ir::Op* w = passes::def_op(L.f, L.defs, op.operands[1]);
  return w && w->kind == OpKind::weight;
}

// An attention that the bf16 attention kernel computes (lower_attention's condition).
bool bf16_attention(const FunctionLowering& L, const ir::Op& op) {
  if (op.kind != OpKind::attention || L.module.options.bf16_fma) return false;
  const int64_t heads = op.int_attr("heads");
  return heads > 0 && L.f.type(op.operands[0]).shape[2].value / heads % 2 == 0;
}

}  // namespace

void plan_bf16_activations(FunctionLowering& L) {
  const LowerOptions& o = L.module.options;
  if (!o.bf16_weights || !o.bf16_activations || o.gpu) return;
  const ir::Function& f = L.f;
  // Each value's readers: (op index, operand index).
  std::vector<std::vector<std::pair<size_t, size_t>>> readers(f.values.size());
  for (size_t i = 0; i < f.ops.size(); ++i)
    for (size_t j = 0; j < f.ops[i].operands.size(); ++j)
      readers[f.ops[i].operands[j]].push_back({i, j});
  for (const ir::Op& producer : f.ops) {
    if (!bf16_linear(L, producer) && !bf16_attention(L, producer)) continue;
    if (f.type(producer.result).dtype != ir::DType::f32) continue;
    bool ok = true;
    std::vector<ir::ValueId> pending = {producer.result};
    while (ok && !pending.empty()) {
      const ir::ValueId v = pending.back();
      pending.pop_back();
      // A result leaves in f32; a value nothing reads is not worth it.
      if (L.result_index.count(v) || readers[v].empty()) {
        ok = false;
        break;
      }
      for (auto [i, j] : readers[v]) {
        const ir::Op& reader = f.ops[i];
        const size_t rank = f.type(v).shape.size();
        if (reader.kind == OpKind::slice && !reader.fused &&
            (reader.int_attr("axis") == static_cast<int64_t>(rank) - 1 ||
             reader.int_attr("axis") == -1)) {
          pending.push_back(reader.result);
        } else if (!((bf16_linear(L, reader) && j == 0 && v == producer.result) ||
                     (bf16_attention(L, reader) && j <= 2))) {
          ok = false;
          break;
        }
      }
    }
    if (ok) L.bf16_values.insert(producer.result);
  }
}

}  // namespace kiln::codegen::lowering
