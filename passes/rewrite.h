// Helpers shared by the passes: def/use queries and in-place rewrites of a Function
// that keep it valid (SSA order, every value defined once).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "ir/dead_code.h"
#include "ir/ir.h"

namespace kiln::passes {

// Index of the op defining each value (-1 for parameters and undefined values).
std::vector<int> def_index(const ir::Function& f);
// use_counts, remove_dead_code and compact_values (ir/dead_code.h).
using ir::compact_values;
using ir::remove_dead_code;
using ir::use_counts;
// The op defining `v`, or nullptr for a parameter.
const ir::Op* def_op(const ir::Function& f, const std::vector<int>& defs, ir::ValueId v);

// Def/use facts of one function, computed once, for passes that match patterns.
struct UseInfo {
  explicit UseInfo(const ir::Function& fn);

  const ir::Function& f;
  std::vector<int> defs;  // def_index()
  std::vector<int> uses;  // use_counts()
  std::vector<int> user;  // index of the last op using each value (-1: no op uses it)

  // Index of the only op using `v`, or -1 when `v` has another use (or is a result).
  int sole_user(ir::ValueId v) const { return uses[v] == 1 ? user[v] : -1; }
};

// How diagnostics name `v`: `%name`, or `%id` for an unnamed value.
std::string value_label(const ir::Function& f, ir::ValueId v);

// Replaces every use of `from` (operands and results) by `to`.
void replace_all_uses(ir::Function& f, ir::ValueId from, ir::ValueId to);

// A new op created for `origin` (the op it replaces or is derived from), defining a new
// value of `type`; it takes origin's locations (loc and src: the rule at ir::Op::loc). The caller
// places it in f.ops.
ir::Op make_op(ir::Function& f, const ir::Op& origin, ir::OpKind kind,
               std::vector<ir::ValueId> operands, ir::TensorType type, ir::Attrs attrs = {});

// Inserts make_op(f, f.ops[origin], ...) before position `pos`; returns its value.
ir::ValueId insert_op(ir::Function& f, size_t pos, size_t origin, ir::OpKind kind,
                      std::vector<ir::ValueId> operands, ir::TensorType type, ir::Attrs attrs = {});

// Clears fuse-elementwise's marks (ir::Op::fused) in a function a pass rewrote: they were
// decided for the old readers and may break verifier V12 now (fuse-elementwise, later in the
// default pipeline, marks the function again).
void drop_fused_marks(ir::Function& f);

// The value of `v` when it is a rank-0 f32 `constant`, else nullopt.
std::optional<double> f32_scalar(const ir::Function& f, const std::vector<int>& defs,
                                 ir::ValueId v);

// The operand of the binary `op` that is not `v`.
inline ir::ValueId other_operand(const ir::Op& op, ir::ValueId v) {
  return op.operands[0] == v ? op.operands[1] : op.operands[0];
}

// A fusion pass's driver: runs `rewrite(f)` (true when it changed f) on every function of the
// module, dropping the fused marks of each it changed; whether any changed.
template <typename Rewrite>
bool rewrite_functions(ir::Module& module, Rewrite rewrite) {
  bool changed = false;
  for (ir::Function& f : module.functions) {
    if (!rewrite(f)) continue;
    changed = true;
    drop_fused_marks(f);  // readers changed
  }
  return changed;
}

// The ops reading each value, each once (an op reading a value twice, like mul(%d, %d), is one
// reader), and -1 for a function result: patterns whose intermediates may be read twice by
// one op count readers with it.
std::vector<std::set<int>> readers_by_value(const ir::Function& f);

// Whether a debug log is enabled for `pass`: `pass` or "all" is in the comma list last
// given to set_debug_passes, or else in the environment variable KILN_DEBUG_PASSES.
bool debug_enabled(const char* pass);

// Replaces the list of passes that debug_log prints for (`kiln opt --debug-passes`): a
// comma list of pass names, or "all"; empty: none. Not thread-safe: call it before
// running passes.
void set_debug_passes(std::string_view list);

// Logs why a pass did not fire (or what it did) when debugging is enabled for it.
template <typename... Args>
void debug_log(const char* pass, fmt::format_string<Args...> format, Args&&... args) {
  if (debug_enabled(pass))
    fmt::print(stderr, "[{}] {}\n", pass, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kiln::passes
