// fuse-elementwise: marks the pointwise ops computed inside their user's elementwise kernel
// (see fuse_elementwise.h).
#include "passes/fuse_elementwise.h"

#include <algorithm>
#include <vector>

#include "passes/rewrite.h"

namespace kiln::passes {
namespace {

using ir::OpKind;

constexpr const char* kPass = "fuse-elementwise";

// Facts about the readers of each value, computed once per function.
struct Readers {
  explicit Readers(const ir::Function& f)
      : count(f.values.size(), 0), outside(f.values.size(), -1) {
    const std::vector<int> defs = def_index(f);
    for (size_t i = 0; i < f.ops.size(); ++i) {
      const ir::Op& u = f.ops[i];
      for (ir::ValueId v : u.operands) {
        ++count[v];
        const int d = defs[v];
        const bool scalar_constant =
            d >= 0 && f.ops[d].kind == OpKind::constant && f.type(v).rank() == 0;
        const bool inside = ir::is_elementwise(u.kind) &&
                            (f.type(v).shape == f.type(u.result).shape || scalar_constant);
        if (!inside && outside[v] < 0) outside[v] = static_cast<int>(i);
      }
    }
  }
  std::vector<int> count;    // reads of each value (once per operand occurrence)
  std::vector<int> outside;  // the first op reading it that cannot compute it inside (-1: none)
};

// Whether op `k` (defining `v`) can be computed inside its readers' kernel, `depth` levels of
// fused ops below its group's root; logs why not.
bool can_fuse(const ir::Function& f, size_t k, const Readers& r, const std::vector<bool>& is_result,
              int depth) {
  const ir::Op& op = f.ops[k];
  const ir::ValueId v = op.result;
  if (!ir::is_elementwise_fusable(op.kind) || r.count[v] == 0) return false;  // nothing to say
  const char* kind = ir::op_name(op.kind);
  if (is_result[v]) {
    debug_log(kPass, "{} {}: a result of @{}, written to its buffer", kind, value_label(f, v),
              f.name);
    return false;
  }
  if (r.outside[v] >= 0) {
    const ir::Op& u = f.ops[r.outside[v]];
    debug_log(kPass, "{} {}: read by {} {}, {}", kind, value_label(f, v), ir::op_name(u.kind),
              value_label(f, u.result),
              ir::is_elementwise(u.kind) ? "of another shape (a broadcast)" : "not elementwise");
    return false;
  }
  const bool cheap = op.kind == OpKind::constant || op.kind == OpKind::iota;
  if (r.count[v] > 1 && !cheap) {
    debug_log(kPass, "{} {}: read {} times (only a constant or iota is computed in each reader)",
              kind, value_label(f, v), r.count[v]);
    return false;
  }
  if (depth >= ir::kMaxFusedDepth) {
    debug_log(kPass, "{} {}: {} levels below its kernel's root already; it starts a kernel", kind,
              value_label(f, v), depth);
    return false;
  }
  return true;
}

bool fuse_function(ir::Function& f) {
  const Readers readers(f);
  std::vector<bool> is_result(f.values.size(), false);
  for (ir::ValueId r : f.results) is_result[r] = true;
  // Levels of fused ops from each value up to its group's root, known for a value once
  // every reader (all later ops) is decided.
  std::vector<int> depth(f.values.size(), 0);
  bool changed = false;
  for (size_t k = f.ops.size(); k-- > 0;) {
    ir::Op& op = f.ops[k];
    const bool fuse = can_fuse(f, k, readers, is_result, depth[op.result]);
    changed |= op.fused != fuse;
    op.fused = fuse;
    const int d = fuse ? depth[op.result] + 1 : 0;
    for (ir::ValueId o : op.operands) depth[o] = std::max(depth[o], d);
  }
  return changed;
}

}  // namespace

bool fuse_elementwise(ir::Module& module) {
  bool changed = false;
  for (ir::Function& f : module.functions) changed |= fuse_function(f);
  return changed;
}

}  // namespace kiln::passes
