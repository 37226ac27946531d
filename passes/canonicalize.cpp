// canonicalize: dead code, CSE, constant folding and reshape/transpose chains (see
// canonicalize.h).
//
// Algorithm: rounds until nothing changes, per function. A round walks the ops once in
// order. Each op is first simplified locally (folded to a constant, rewritten in place
// to skip a reshape/transpose it reads, or found equal to an existing value); an op
// that survives is looked up in a table of the ops seen so far, keyed by its kind,
// operands, attributes and result type, and merged into an earlier equal op. Since
// operands are always defined earlier, a replacement is visible to every later op of
// the same walk. The round ends with dead-code removal.
//
// A value that is a function result keeps its name: a replacement by a parameter or by
// another result, which have names of their own, is skipped.
#include "passes/canonicalize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ir/interpreter.h"
#include "ir/op_types.h"
#include "ir/printer.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

using ir::Function;
using ir::Op;
using ir::OpKind;
using ir::TensorType;
using ir::ValueId;

constexpr const char* kPass = "canonicalize";

// A constant's value as the interpreter reads it, in a form equal for equal values:
// the float's bits for f32 (so 0 and 0.0 agree, while 0.0 and -0.0 do not), the wrapped
// integer for i32/i64, 0 or 1 for bool.
std::string constant_value_key(const Op& op, ir::DType dtype) {
  const ir::AttrValue& v = op.attrs.at("value");
  if (dtype == ir::DType::f32) {
    const float x = static_cast<float>(op.float_attr("value"));
    return fmt::format("f{:08x}", std::bit_cast<uint32_t>(x));
  }
  if (dtype == ir::DType::boolean) return op.float_attr("value") != 0 ? "1" : "0";
  const int64_t* i = std::get_if<int64_t>(&v);
  if (!i) return ir::print_attr_value(v);  // rejected by the type rule; keep it distinct
  if (dtype == ir::DType::i32)
    return std::to_string(static_cast<int32_t>(static_cast<uint32_t>(*i)));
  return std::to_string(*i);
}

class Canonicalizer {
 public:
  explicit Canonicalizer(Function& f) : f_(f) {}

  // Rounds until a fixed point; returns whether anything changed.
  bool run() {
    bool changed = false;
    for (int round = 0;; ++round) {
      // Every round that changes something removes an op or shortens a chain, so the
      // number of rounds is bounded by the size of the function.
      KILN_ASSERT(round <= static_cast<int>(f_.ops.size()) + 1,
                  fmt::format("canonicalize does not converge on function '{}'", f_.name));
      bool round_changed = run_round();
      round_changed |= remove_dead_code(f_);
      if (!round_changed) break;
      changed = true;
    }
    return changed;
  }

 private:
  // One walk over the ops; returns whether it changed anything (dead ops stay).
  bool run_round() {
    bool changed = false;
    std::map<std::string, ValueId> seen;  // CSE table: key -> first value with that key
    defs_ = def_index(f_);
    forward_.assign(f_.values.size(), -1);
    for (size_t i = 0; i < f_.ops.size(); ++i) {
      // Replacements reach an op's operands when the walk gets to it (one pass over the
      // operands, instead of one over the function per replacement).
      for (ValueId& v : f_.ops[i].operands)
        while (forward_[v] >= 0) v = forward_[v];
      changed |= simplify_in_place(i);
      const ValueId result = f_.ops[i].result;
      if (std::optional<ValueId> same = equal_value(i)) {
        if (replace(i, *same)) {
          changed = true;
          continue;
        }
      }
      auto [it, inserted] = seen.emplace(cse_key(f_.ops[i]), result);
      if (inserted)
        debug_log(kPass, "{}: {} kept: no earlier op has its CSE key {}", where(i), label(result),
                  it->first);
      if (!inserted && replace(i, it->second)) changed = true;
    }
    return changed;
  }

  // --- Queries -----------------------------------------------------------------

  const Op* def(ValueId v) const { return def_op(f_, defs_, v); }
  const TensorType& type(ValueId v) const { return f_.type(v); }

  std::string label(ValueId v) const {
    return f_.values[v].name.empty() ? fmt::format("value {}", v) : "%" + f_.values[v].name;
  }
  std::string where(size_t i) const {
    return fmt::format("function '{}', op {} ({})", f_.name, i, ir::op_name(f_.ops[i].kind));
  }

  // A rank-0 `constant` op defining v, or nullptr.
  const Op* scalar_constant(ValueId v) const {
    const Op* d = def(v);
    return d && d->kind == OpKind::constant && type(v).rank() == 0 ? d : nullptr;
  }

  // The truth value of a bool `constant` op (of any rank: constants are splats).
  std::optional<bool> bool_constant(ValueId v) const {
    const Op* d = def(v);
    if (!d || d->kind != OpKind::constant || type(v).dtype != ir::DType::boolean) return {};
    return d->float_attr("value") != 0;
  }

  std::string cse_key(const Op& op) const {
    std::string key = ir::op_name(op.kind);
    key += '(';
    for (ValueId v : op.operands) key += fmt::format("{},", v);
    key += "){";
    for (const auto& [name, value] : op.attrs) {
      key += name + '=';
      key += op.kind == OpKind::constant && name == "value"
                 ? constant_value_key(op, type(op.result).dtype)
                 : ir::print_attr_value(value);
      key += ',';
    }
    return key + "}:" + ir::to_string(type(op.result));
  }

  // --- Rewrites in place ----------------------------------------------------------

  // Folds constants and shortens chains by rewriting op i; returns whether it did.
  bool simplify_in_place(size_t i) {
    Op& op = f_.ops[i];
    if (op.kind == OpKind::add && add_of_infinite_mask(i)) return true;
    if (ir::is_elementwise(op.kind)) return fold_constant(i);
    switch (op.kind) {
      case OpKind::slice:
        return fold_sinusoid_slice(i);
      case OpKind::reshape:
        return skip_inner_reshape(i);
      case OpKind::transpose:
        return compose_transposes(i);
      default:
        return false;
    }
  }

  // add(s, select(m, -inf, 0)) -> select(m, -inf, s), either operand order, the -inf and
  // the 0 f32 constants (splats of any shape): an additive mask of -inf and 0 is exactly a
  // masked select (s + -inf = -inf, s + 0 = s), the form fuse-attention reads (PyTorch's
  // float masks, e.g. nn.Transformer.generate_square_subsequent_mask, as imported).
  bool add_of_infinite_mask(size_t i) {
    Op& op = f_.ops[i];
    auto splat = [&](ValueId v, double* value) {
      const Op* c = def(v);
      if (!c || c->kind != OpKind::constant || type(v).dtype != ir::DType::f32) return false;
      *value = c->float_attr("value");
      return true;
    };
    for (int k = 0; k < 2; ++k) {
      const Op* sel = def(op.operands[k]);
      if (!sel || sel->kind != OpKind::select) continue;
      double fill = 0, zero = 1;
      if (!splat(sel->operands[1], &fill) || !splat(sel->operands[2], &zero)) continue;
      if (!(std::isinf(fill) && fill < 0) || zero != 0) continue;
      const ValueId s = op.operands[1 - k];
      ir::TypeResult a =
          ir::broadcast_types(type(sel->operands[0]), type(sel->operands[1]), ir::DType::f32);
      if (!a.ok()) continue;
      ir::TypeResult b = ir::broadcast_types(a.type, type(s), ir::DType::f32);
      if (!b.ok() || !(b.type == type(op.result))) continue;
      debug_log(kPass, "{}: the add of a -inf/0 mask {} is a select", where(i),
                label(op.operands[k]));
      op.kind = OpKind::select;
      op.operands = {sel->operands[0], sel->operands[1], s};
      return true;
    }
    return false;
  }

  // elementwise(constant[], ...) -> constant[]: evaluated by the reference interpreter,
  // so the folded value is exactly what the op computes (dtype, rounding, wrap-around).
  bool fold_constant(size_t i) {
    Op& op = f_.ops[i];
    if (type(op.result).rank() != 0) {  // only scalars; never symbolic shapes
      if (std::all_of(op.operands.begin(), op.operands.end(),
                      [&](ValueId v) { return def(v) && def(v)->kind == OpKind::constant; }))
        debug_log(kPass, "{}: not folded: {} is {}, not a scalar", where(i), label(op.result),
                  ir::to_string(type(op.result)));
      return false;
    }
    for (ValueId v : op.operands)
      if (!scalar_constant(v)) {
        debug_log(kPass, "{}: not folded: operand {} is not a rank-0 constant", where(i), label(v));
        return false;
      }
    ir::Module scratch;
    ir::Function& g = scratch.functions.emplace_back();
    g.name = "fold";
    std::vector<ValueId> operands;
    for (ValueId v : op.operands)
      operands.push_back(g.add_op(OpKind::constant, {}, type(v), def(v)->attrs));
    g.results.push_back(g.add_op(op.kind, operands, type(op.result), op.attrs));
    ir::Tensor value;
    try {
      value = ir::interpret(scratch, g, {}, {}).at(0);
    } catch (const Error& e) {
      debug_log(kPass, "{}: not folded: {}", where(i), e.what());
      return false;
    }
    ir::AttrValue folded;
    if (value.dtype == ir::DType::f32)
      folded = static_cast<double>(value.f.at(0));
    else
      folded = value.ints.at(0);
    debug_log(kPass, "{}: folded to constant {}", where(i), ir::print_attr_value(folded));
    op.kind = OpKind::constant;
    op.operands.clear();
    op.attrs = {{"value", folded}};
    return true;
  }

  // slice(sinusoid_table[R,D]) {axis = 0, start = 0} : [S,D] -> sinusoid_table : [S,D].
  // Row r of the table depends only on r and D, so the first S rows are the table of S rows.
  bool fold_sinusoid_slice(size_t i) {
    Op& op = f_.ops[i];
    const Op* src = def(op.operands[0]);
    if (!src || src->kind != OpKind::sinusoid_table) return false;
    if (ir::normalize_axis(op.int_attr("axis"), 2) != 0) {
      debug_log(kPass, "{}: slice of sinusoid_table not folded: axis {} is not the rows", where(i),
                op.int_attr("axis"));
      return false;
    }
    if (op.int_attr("start") != 0) {
      debug_log(kPass, "{}: slice of sinusoid_table not folded: starts at row {}, not 0", where(i),
                op.int_attr("start"));
      return false;
    }
    debug_log(kPass, "{}: slice of sinusoid_table folded into a table of type {}", where(i),
              ir::to_string(type(op.result)));
    op.kind = OpKind::sinusoid_table;
    op.operands.clear();
    op.attrs.clear();
    return true;
  }

  // reshape(reshape(x)) -> reshape(x): a reshape depends only on its operand's elements.
  bool skip_inner_reshape(size_t i) {
    Op& op = f_.ops[i];
    const Op* inner = def(op.operands[0]);
    if (inner && inner->kind == OpKind::transpose)
      debug_log(kPass, "{}: not a reshape chain: operand {} is a transpose", where(i),
                label(op.operands[0]));
    if (!inner || inner->kind != OpKind::reshape) return false;
    debug_log(kPass, "{}: reads the reshape's operand {} directly", where(i),
              label(inner->operands[0]));
    op.operands[0] = inner->operands[0];
    return true;
  }

  // transpose(transpose(x, p), q) -> transpose(x, r) with r[i] = p[q[i]].
  bool compose_transposes(size_t i) {
    Op& op = f_.ops[i];
    const Op* inner = def(op.operands[0]);
    if (!inner || inner->kind != OpKind::transpose) return false;
    const std::vector<int64_t>& p = inner->ints_attr("perm");
    const std::vector<int64_t> q = op.ints_attr("perm");
    std::vector<int64_t> r(q.size());
    for (size_t k = 0; k < q.size(); ++k) r[k] = p[q[k]];
    debug_log(kPass, "{}: composed with the transpose of {}: perm [{}]", where(i),
              label(inner->operands[0]), fmt::join(r, ", "));
    op.operands[0] = inner->operands[0];
    op.attrs["perm"] = r;
    return true;
  }

  // --- Values equal to an existing one ------------------------------------------------

  // A value (an operand of op i) that op i's result always equals, if one is known.
  std::optional<ValueId> equal_value(size_t i) const {
    const Op& op = f_.ops[i];
    const TensorType& t = type(op.result);
    // Each candidate must have the result's type: broadcasting may make it larger.
    auto same_type = [&](ValueId v) -> std::optional<ValueId> {
      if (type(v) == t) return v;
      return std::nullopt;
    };
    switch (op.kind) {
      case OpKind::reshape:  // to the operand's own shape
        return same_type(op.operands[0]);
      case OpKind::transpose: {
        const std::vector<int64_t>& perm = op.ints_attr("perm");
        for (size_t k = 0; k < perm.size(); ++k)
          if (perm[k] != static_cast<int64_t>(k)) return std::nullopt;
        return same_type(op.operands[0]);
      }
      case OpKind::slice:  // the whole axis
        if (op.int_attr("start") == 0) return same_type(op.operands[0]);
        return std::nullopt;
      case OpKind::select: {
        const ValueId a = op.operands[1], b = op.operands[2];
        if (a == b) return same_type(a);
        if (std::optional<bool> c = bool_constant(op.operands[0])) return same_type(*c ? a : b);
        return std::nullopt;
      }
      case OpKind::mul: {
        // x * 1 = x (exactly, NaN and -0 included) for a scalar f32 constant 1.
        for (int k = 0; k < 2; ++k) {
          const Op* c = def(op.operands[k]);
          if (c && c->kind == OpKind::constant && type(c->result).rank() == 0 &&
              type(c->result).dtype == ir::DType::f32 && c->float_attr("value") == 1.0)
            return same_type(op.operands[1 - k]);
        }
        return std::nullopt;
      }
      case OpKind::cast: {
        // cast(select(c, a, b)) to bool, a and b scalar constants with a != 0 and b == 0:
        // c itself (PyTorch's `tril(ones(L, L)).bool()` as kiln import writes it).
        const Op* sel = def(op.operands[0]);
        if (t.dtype != ir::DType::boolean || !sel || sel->kind != OpKind::select) return {};
        const Op* a = def(sel->operands[1]);
        const Op* b = def(sel->operands[2]);
        auto scalar = [&](const Op* c) {
          return c && c->kind == OpKind::constant && type(c->result).rank() == 0;
        };
        if (!scalar(a) || !scalar(b)) return std::nullopt;
        if (a->float_attr("value") != 0 && b->float_attr("value") == 0)
          return same_type(sel->operands[0]);
        return std::nullopt;
      }
      case OpKind::logical_and:
      case OpKind::logical_or: {
        // x and true = x; x or false = x.
        const bool neutral = op.kind == OpKind::logical_and;
        for (int k = 0; k < 2; ++k)
          if (bool_constant(op.operands[k]) == neutral) return same_type(op.operands[1 - k]);
        return std::nullopt;
      }
      default:
        return std::nullopt;
    }
  }

  // Redirects every use of op i's result to `to`; false (and nothing changes) when that
  // would rename a function result. A result's name moves onto `to`, whose own name, if
  // any, is only cosmetic when `to` is neither a parameter nor a result.
  bool replace(size_t i, ValueId to) {
    const ValueId from = f_.ops[i].result;
    auto is_result = [&](ValueId v) {
      return std::find(f_.results.begin(), f_.results.end(), v) != f_.results.end();
    };
    if (is_result(from) && !f_.values[from].name.empty()) {
      const bool is_param = std::find(f_.params.begin(), f_.params.end(), to) != f_.params.end();
      if (is_param || is_result(to)) {
        debug_log(kPass, "{}: not replaced by {}: result {} would lose its name", where(i),
                  label(to), label(from));
        return false;
      }
      debug_log(kPass, "{}: {} replaced by {}, which takes its name", where(i), label(from),
                label(to));
      f_.values[to].name.clear();
    } else {
      debug_log(kPass, "{}: {} replaced by {}", where(i), label(from), label(to));
    }
    // Results now (the name moves with them), later ops' operands when the walk reaches
    // them: every use of `from` comes after op i.
    for (ValueId& r : f_.results)
      if (r == from) {
        if (f_.values[to].name.empty()) f_.values[to].name = f_.values[from].name;
        f_.values[from].name.clear();
        r = to;
      }
    forward_[from] = to;
    return true;
  }

  Function& f_;
  std::vector<int> defs_;         // defining op of each value; in-place rewrites keep it valid
  std::vector<ValueId> forward_;  // value -> the value replacing it this round, or -1
};

}  // namespace

bool canonicalize(ir::Module& module) {
  bool changed = false;
  for (Function& f : module.functions) {
    if (!Canonicalizer(f).run()) continue;
    changed = true;
    // Merged values live longer than before, so a memory plan no longer holds; readers
    // changed, so neither do fuse-elementwise's marks (it runs again after this pass).
    if (f.arena_bytes >= 0) {
      f.arena_bytes = -1;
      for (Op& op : f.ops) op.arena_offset = -1;
    }
    drop_fused_marks(f);
  }
  return changed;
}

}  // namespace kiln::passes
