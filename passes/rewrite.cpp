// Def/use queries and rewrites shared by the passes (see rewrite.h).
#include "passes/rewrite.h"

#include <cstdlib>
#include <cstring>

#include "support/error.h"

namespace kiln::passes {

std::vector<int> def_index(const ir::Function& f) {
  std::vector<int> defs(f.values.size(), -1);
  for (size_t i = 0; i < f.ops.size(); ++i)
    if (f.ops[i].result >= 0 && static_cast<size_t>(f.ops[i].result) < defs.size())
      defs[f.ops[i].result] = static_cast<int>(i);
  return defs;
}

UseInfo::UseInfo(const ir::Function& fn)
    : f(fn), defs(def_index(fn)), uses(use_counts(fn)), user(fn.values.size(), -1) {
  for (size_t i = 0; i < fn.ops.size(); ++i)
    for (ir::ValueId v : fn.ops[i].operands) user[v] = static_cast<int>(i);
}

std::string value_label(const ir::Function& f, ir::ValueId v) {
  return f.values[v].name.empty() ? fmt::format("%{}", v) : "%" + f.values[v].name;
}

const ir::Op* def_op(const ir::Function& f, const std::vector<int>& defs, ir::ValueId v) {
  if (v < 0 || static_cast<size_t>(v) >= defs.size() || defs[v] < 0) return nullptr;
  return &f.ops[defs[v]];
}

void replace_all_uses(ir::Function& f, ir::ValueId from, ir::ValueId to) {
  for (ir::Op& op : f.ops)
    for (ir::ValueId& v : op.operands)
      if (v == from) v = to;
  for (ir::ValueId& r : f.results)
    if (r == from) {
      // Keep the result's name: names live on values, so move it over.
      if (f.values[to].name.empty()) f.values[to].name = f.values[from].name;
      f.values[from].name.clear();
      r = to;
    }
}

ir::Op make_op(ir::Function& f, const ir::Op& origin, ir::OpKind kind,
               std::vector<ir::ValueId> operands, ir::TensorType type, ir::Attrs attrs) {
  ir::Op op{kind, f.add_value(std::move(type)), std::move(operands), std::move(attrs)};
  op.loc = origin.loc;
  op.src = origin.src;
  return op;
}

ir::ValueId insert_op(ir::Function& f, size_t pos, size_t origin, ir::OpKind kind,
                      std::vector<ir::ValueId> operands, ir::TensorType type, ir::Attrs attrs) {
  KILN_ASSERT(pos <= f.ops.size(), "insert_op position out of range");
  KILN_ASSERT(origin < f.ops.size(), "insert_op origin out of range");
  ir::Op op =
      make_op(f, f.ops[origin], kind, std::move(operands), std::move(type), std::move(attrs));
  const ir::ValueId id = op.result;
  f.ops.insert(f.ops.begin() + pos, std::move(op));
  return id;
}

namespace {

// The passes debug_log prints for, as ",name,name," (",all," for all); empty: none.
// Starts from the environment variable KILN_DEBUG_PASSES.
std::string& debug_list() {
  static std::string list = [] {
    const char* env = std::getenv("KILN_DEBUG_PASSES");
    return env && *env ? std::string(",") + env + "," : std::string();
  }();
  return list;
}

}  // namespace

bool debug_enabled(const char* pass) {
  const std::string& list = debug_list();
  if (list.empty()) return false;
  return list.find(",all,") != std::string::npos ||
         list.find("," + std::string(pass) + ",") != std::string::npos;
}

void set_debug_passes(std::string_view list) {
  debug_list() = list.empty() ? std::string() : "," + std::string(list) + ",";
}

void drop_fused_marks(ir::Function& f) {
  for (ir::Op& op : f.ops) op.fused = false;
}

std::optional<double> f32_scalar(const ir::Function& f, const std::vector<int>& defs,
                                 ir::ValueId v) {
  const ir::Op* d = def_op(f, defs, v);
  if (!d || d->kind != ir::OpKind::constant || f.type(v).rank() != 0 ||
      f.type(v).dtype != ir::DType::f32)
    return std::nullopt;
  return d->float_attr("value");
}

std::vector<std::set<int>> readers_by_value(const ir::Function& f) {
  std::vector<std::set<int>> readers(f.values.size());
  for (size_t i = 0; i < f.ops.size(); ++i)
    for (ir::ValueId v : f.ops[i].operands) readers[v].insert(static_cast<int>(i));
  for (ir::ValueId r : f.results) readers[r].insert(-1);
  return readers;
}

}  // namespace kiln::passes
