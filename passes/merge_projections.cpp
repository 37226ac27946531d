// merge-projections: linears of one input in one block -> one wider linear and slices
// (see merge_projections.h).
//
// Algorithm, per function: as_projection() turns each eligible linear into a candidate
// (input, act, bias, weight-name prefix and component); candidates are grouped by
// (input, act, bias, prefix) in an ordered map keyed by value ids and strings (no
// pointers, so the result is deterministic). For each group that can_merge_projections()
// accepts, in program order of its first member, the merged module weights are declared
// (or reused) and the rewrite is recorded: new ops before the first member, each member
// turned into a slice in place. The op list is then rebuilt once with the new ops and
// remove_dead_code drops the original `weight` ops left unused.
#include "passes/merge_projections.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

using ir::Dim;
using ir::DType;
using ir::Function;
using ir::Op;
using ir::OpKind;
using ir::TensorType;
using ir::ValueId;

constexpr const char* kPass = "merge-projections";

// A linear that may merge with others.
struct Projection {
  int pos = -1;  // op index
  ValueId x = -1;
  std::string act;
  std::string prefix;       // P in `<P>.<c>.weight`
  std::string component;    // c
  std::string weight;       // W's module weight name (for an [in, out] W: the stored one)
  bool transposed = false;  // W is transpose(@weight), an [in, out] weight stored [K, N]
  std::string bias;         // b's module weight name; empty without a bias
  int64_t n = 0;            // W's rows
  int64_t k = 0;            // W's columns
};

// The name of the underived module weight that `v` is a `weight` op of, or empty (with
// *why set). With `transposed`, a weight derived as the transpose of an underived one (an
// [in, out] weight: GPT-2's Conv1D, an ONNX MatMul by an initializer) is accepted too: the
// stored weight's name is returned and *transposed set.
std::string weight_name_of(const ir::Module& m, const Function& f, const std::vector<int>& defs,
                           ValueId v, std::string* why, bool* transposed = nullptr) {
  const Op* op = def_op(f, defs, v);
  if (!op || op->kind != OpKind::weight) {
    *why = fmt::format("{} is not a weight op", value_label(f, v));
    return {};
  }
  const std::string& name = op->str_attr("name");
  const ir::Weight* w = m.find_weight(name);
  KILN_ASSERT(w, "merge-projections: weight op of an undeclared weight (module not verified)");
  if (transposed && w->derivation && w->derivation->op == "transpose" &&
      w->derivation->inputs.size() == 1) {
    const ir::Weight* src = m.find_weight(w->derivation->inputs[0]);
    if (src && !src->derivation) {
      *transposed = true;
      return src->name;
    }
  }
  if (w->derivation) {
    *why = fmt::format("weight '{}' is derived", name);
    return {};
  }
  return name;
}

// Whether the linear at `pos` can take part in a merge; fills *p. Logs why not.
bool as_projection(const ir::Module& m, const Function& f, const std::vector<int>& defs, int pos,
                   Projection* p) {
  const Op& op = f.ops[pos];
  KILN_ASSERT(op.kind == OpKind::linear && op.operands.size() >= 2, "as_projection: not a linear");
  std::string why;
  bool transposed = false;
  const std::string w = weight_name_of(m, f, defs, op.operands[1], &why, &transposed);
  if (w.empty()) {
    debug_log(kPass, "linear {}: W {}", value_label(f, op.result), why);
    return false;
  }
  std::string b;
  if (op.operands.size() == 3) {
    b = weight_name_of(m, f, defs, op.operands[2], &why);
    if (b.empty()) {
      debug_log(kPass, "linear {}: bias {}", value_label(f, op.result), why);
      return false;
    }
  }
  // `<P>.<c>.weight` (P may be empty: `<c>.weight`); for an [in, out] weight whose name says
  // nothing (ONNX's `onnx::MatMul_687`), the bias's `<P>.<c>.bias`.
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() > suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  std::string stem;
  if (ends_with(w, ".weight"))
    stem = w.substr(0, w.size() - 7);
  else if (transposed && ends_with(b, ".bias"))
    stem = b.substr(0, b.size() - 5);
  else if (transposed && op.src.scope >= 0 &&
           static_cast<size_t>(op.src.scope) < m.sources.size()) {
    // Neither names it (a linear without bias): an imported node's name path,
    // `/encoder/layers.0/self_attn/w_q/MatMul` -> encoder.layers.0.self_attn.w_q.
    const std::string& scope = m.sources[static_cast<size_t>(op.src.scope)];
    const size_t last = scope.rfind('/');
    if (scope.size() > 1 && scope[0] == '/' && last != std::string::npos && last > 1) {
      stem = scope.substr(1, last - 1);
      std::replace(stem.begin(), stem.end(), '/', '.');
    }
  }
  if (stem.empty()) {
    debug_log(kPass, "linear {}: weight '{}' is not named <prefix>.<component>.weight",
              value_label(f, op.result), w);
    return false;
  }
  const size_t dot = stem.rfind('.');
  *p = Projection{};
  p->pos = pos;
  p->x = op.operands[0];
  p->act = op.str_attr("act");
  p->prefix = dot == std::string::npos ? std::string() : stem.substr(0, dot);
  p->component = dot == std::string::npos ? stem : stem.substr(dot + 1);
  p->weight = w;
  p->transposed = transposed;
  p->bias = b;
  const TensorType& wt = f.type(op.operands[1]);
  p->n = wt.shape[0].value;
  p->k = wt.shape[1].value;
  return true;
}

// Whether `group` (same input, act, bias-ness and prefix, in program order) can merge:
// at least two members with distinct components and one K. Logs why not.
bool can_merge_projections(const Function& f, const std::vector<Projection>& group) {
  if (group.size() < 2) {
    if (!group.empty())
      debug_log(kPass, "linear {}: no other linear of {} in block '{}' with act {} and {}",
                value_label(f, f.ops[group[0].pos].result), value_label(f, group[0].x),
                group[0].prefix, group[0].act, group[0].bias.empty() ? "no bias" : "a bias");
    return false;
  }
  std::set<std::string> components;
  for (const Projection& p : group) {
    if (!components.insert(p.component).second) {
      debug_log(kPass, "linear {}: component '{}' of block '{}' appears twice",
                value_label(f, f.ops[p.pos].result), p.component, p.prefix);
      return false;
    }
    if (p.k != group[0].k) {
      debug_log(kPass, "linear {}: K {} differs from {}", value_label(f, f.ops[p.pos].result), p.k,
                group[0].k);
      return false;
    }
  }
  return true;
}

// The merged component name (see merge_projections.h).
std::string merged_component(const std::vector<Projection>& group) {
  bool all_w = true;
  for (const Projection& p : group)
    all_w &= p.component.size() > 2 && p.component.rfind("w_", 0) == 0;
  std::string out = all_w ? "w_" : "";
  for (size_t i = 0; i < group.size(); ++i) {
    if (all_w)
      out += group[i].component.substr(2);
    else
      out += (i ? "_" : "") + group[i].component;
  }
  return out;
}

// Whether `name` is free in `m` or already declared exactly as `want`.
bool fits(const ir::Module& m, const std::string& name, const ir::Weight& want) {
  const ir::Weight* w = m.find_weight(name);
  return !w || (w->type == want.type && w->derivation == want.derivation);
}

// Declares (or reuses) the merged weight and bias of `group`; returns their names (the
// bias name empty without biases).
std::pair<std::string, std::string> declare_merged(ir::Module& m,
                                                   const std::vector<Projection>& group) {
  int64_t rows = 0;
  std::vector<std::string> ws, bs;
  for (const Projection& p : group) {
    rows += p.n;
    ws.push_back(p.weight);
    if (!p.bias.empty()) bs.push_back(p.bias);
  }
  const bool has_bias = !group[0].bias.empty();
  const ir::Attrs axis0 = {{"axis", int64_t{0}}};
  ir::Attrs w_attrs = axis0;
  if (group[0].transposed) w_attrs["transpose"] = int64_t{1};  // [in, out] weights
  ir::Weight w{{},
               TensorType{DType::f32, {Dim::constant(rows), Dim::constant(group[0].k)}},
               ir::WeightDerivation{"concat", ws, w_attrs}};
  ir::Weight b{
      {}, TensorType{DType::f32, {Dim::constant(rows)}}, ir::WeightDerivation{"concat", bs, axis0}};
  const std::string base =
      (group[0].prefix.empty() ? "" : group[0].prefix + ".") + merged_component(group);
  for (int attempt = 1;; ++attempt) {
    const std::string stem = attempt == 1 ? base : fmt::format("{}_{}", base, attempt);
    w.name = stem + ".weight";
    b.name = has_bias ? stem + ".bias" : std::string();
    if (fits(m, w.name, w) && (!has_bias || fits(m, b.name, b))) break;
  }
  if (!m.find_weight(w.name)) m.weights.push_back(w);
  if (has_bias && !m.find_weight(b.name)) m.weights.push_back(b);
  return {w.name, b.name};
}

// New ops to insert before existing ops, by the position of the op they precede.
using Insertions = std::map<int, std::vector<Op>>;

// Records the merge of `group`: the weight ops and the merged linear before the first
// member, and each member turned into a slice of the merged result.
void merge(ir::Module& m, Function& f, const std::vector<Projection>& group, Insertions* inserts) {
  KILN_ASSERT(can_merge_projections(f, group), "merge-projections: group cannot merge");
  const auto [w_name, b_name] = declare_merged(m, group);
  const ir::Weight* w = m.find_weight(w_name);
  std::vector<Op>& before = (*inserts)[group[0].pos];
  // The new ops are created for the first member: they take its location.
  auto add_op = [&](OpKind kind, std::vector<ValueId> operands, TensorType type, ir::Attrs attrs) {
    before.push_back(make_op(f, f.ops[group[0].pos], kind, std::move(operands), std::move(type),
                             std::move(attrs)));
    return before.back().result;
  };
  std::vector<ValueId> operands = {group[0].x,
                                   add_op(OpKind::weight, {}, w->type, {{"name", w_name}})};
  if (!b_name.empty())
    operands.push_back(add_op(OpKind::weight, {}, m.find_weight(b_name)->type, {{"name", b_name}}));
  TensorType merged_type = f.type(f.ops[group[0].pos].result);
  const int64_t axis = merged_type.rank() - 1;
  merged_type.shape[axis] = w->type.shape[0];
  const ValueId merged =
      add_op(OpKind::linear, std::move(operands), merged_type, {{"act", group[0].act}});
  std::vector<std::string> names;
  int64_t start = 0;
  for (const Projection& p : group) {
    Op& op = f.ops[p.pos];
    names.push_back(value_label(f, op.result));
    op.kind = OpKind::slice;
    op.operands = {merged};
    op.attrs = {{"axis", axis}, {"start", start}};
    start += p.n;
  }
  debug_log(kPass, "merged {} into linear with '{}'", fmt::join(names, ", "), w_name);
}

// Rebuilds f's op list with the recorded insertions.
void apply(Function& f, Insertions inserts) {
  std::vector<Op> ops;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    auto it = inserts.find(static_cast<int>(i));
    if (it != inserts.end())
      for (Op& op : it->second) ops.push_back(std::move(op));
    ops.push_back(std::move(f.ops[i]));
  }
  f.ops = std::move(ops);
}

bool merge_function(ir::Module& m, Function& f) {
  const std::vector<int> defs = def_index(f);
  // x, act, bias, prefix, [in, out] weights
  using Key = std::tuple<ValueId, std::string, bool, std::string, bool>;
  std::map<Key, std::vector<Projection>> groups;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    Projection p;
    if (f.ops[i].kind != OpKind::linear || !as_projection(m, f, defs, static_cast<int>(i), &p))
      continue;
    groups[Key{p.x, p.act, !p.bias.empty(), p.prefix, p.transposed}].push_back(std::move(p));
  }
  // Program order of first members: weights are declared in a reproducible order.
  std::vector<const std::vector<Projection>*> order;
  for (const auto& [key, group] : groups)
    if (can_merge_projections(f, group)) order.push_back(&group);
  std::sort(order.begin(), order.end(),
            [](const auto* a, const auto* b) { return (*a)[0].pos < (*b)[0].pos; });
  if (order.empty()) return false;
  Insertions inserts;
  for (const std::vector<Projection>* group : order) merge(m, f, *group, &inserts);
  apply(f, std::move(inserts));
  remove_dead_code(f);
  return true;
}

}  // namespace

bool merge_projections(ir::Module& module) {
  return rewrite_functions(module, [&](Function& f) { return merge_function(module, f); });
}

}  // namespace kiln::passes
