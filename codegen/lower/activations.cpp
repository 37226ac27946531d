// Which activations a bf16 build stores in bf16 (LowerOptions::bf16_activations): a value
// computed by a bf16 kernel (a linear on a bf16 weight, a bf16 attention) whose every reader
// is a bf16 kernel that rounds it to bf16 as it reads it (a bf16 linear's x; a bf16
// attention's q, k or v, directly or through last-axis slices, the views a merged QKV
// projection is split by). The producer then writes it rounded, in half the bytes, and the
// readers skip their rounding: the same numbers, half the memory traffic between the two (the
// FFN's hidden layer, the attention's inputs and output).
#include <utility>
#include <vector>

#include "codegen/lower/lowering.h"

namespace kiln::codegen::lowering {

using ir::OpKind;

void plan_bf16_activations(FunctionLowering& L) {
  const LowerOptions& o = L.module.options;
  if (!o.bf16_weights || !o.bf16_activations || o.gpu) return;
  const ir::Function& f = L.f;
  // Each value's readers: (op index, operand index).
  std::vector<std::vector<std::pair<size_t, size_t>>> readers(f.values.size());
  for (size_t i = 0; i < f.ops.size(); ++i)
    for (size_t j = 0; j < f.ops[i].operands.size(); ++j)
      readers[f.ops[i].operands[j]].push_back({i, j});
  // The same conditions as lower_linear's and lower_attention's choice of their bf16 kernels.
  for (const ir::Op& producer : f.ops) {
    if (!runs_bf16_linear(L, producer) && !runs_bf16_attention(L, producer)) continue;
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
      const auto last_axis = static_cast<int64_t>(f.type(v).shape.size()) - 1;
      for (auto [i, j] : readers[v]) {
        const ir::Op& reader = f.ops[i];
        if (reader.kind == OpKind::slice && !reader.fused &&
            (reader.int_attr("axis") == last_axis || reader.int_attr("axis") == -1)) {
          pending.push_back(reader.result);
        } else if (!((runs_bf16_linear(L, reader) && j == 0 && v == producer.result) ||
                     (runs_bf16_attention(L, reader) && j <= 2))) {
          ok = false;
          break;
        }
      }
    }
    if (ok) L.bf16_values.insert(producer.result);
  }
}

}  // namespace kiln::codegen::lowering
