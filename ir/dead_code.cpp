// Dead-code removal (see dead_code.h).
#include "ir/dead_code.h"

#include <utility>

#include "support/error.h"

namespace kiln::ir {

std::vector<int> use_counts(const Function& f) {
  std::vector<int> uses(f.values.size(), 0);
  for (const Op& op : f.ops)
    for (ValueId v : op.operands) ++uses[v];
  for (ValueId r : f.results) ++uses[r];
  return uses;
}

bool remove_dead_code(Function& f) {
  bool changed = false;
  std::vector<int> uses = use_counts(f);
  std::vector<bool> keep(f.ops.size(), true);
  for (size_t i = f.ops.size(); i-- > 0;) {
    if (uses[f.ops[i].result] == 0) {
      keep[i] = false;
      changed = true;
      for (ValueId v : f.ops[i].operands) --uses[v];
    }
  }
  if (!changed) return false;
  std::vector<Op> ops;
  for (size_t i = 0; i < f.ops.size(); ++i)
    if (keep[i]) ops.push_back(std::move(f.ops[i]));
  f.ops = std::move(ops);
  compact_values(f);
  return true;
}

void compact_values(Function& f) {
  std::vector<ValueId> remap(f.values.size(), -1);
  std::vector<Value> values;
  auto take = [&](ValueId v) {
    if (remap[v] < 0) {
      remap[v] = static_cast<ValueId>(values.size());
      values.push_back(std::move(f.values[v]));
    }
  };
  for (ValueId p : f.params) take(p);
  for (const Op& op : f.ops) take(op.result);
  for (ValueId& p : f.params) p = remap[p];
  for (Op& op : f.ops) {
    op.result = remap[op.result];
    for (ValueId& v : op.operands) {
      KILN_ASSERT(remap[v] >= 0, "operand refers to a removed value");
      v = remap[v];
    }
  }
  for (ValueId& r : f.results) {
    KILN_ASSERT(remap[r] >= 0, "result refers to a removed value");
    r = remap[r];
  }
  f.values = std::move(values);
}

}  // namespace kiln::ir
