// The IR verifier (see verifier.h for the numbered invariants).
#include "ir/verifier.h"

#include <algorithm>
#include <cctype>
#include <set>

#include <fmt/format.h>

#include "ir/op_types.h"
#include "support/error.h"

namespace kiln::ir {
namespace {

// The largest tensor the IR admits (2^48 bytes): sizes stay far from int64 overflow.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 48;

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

class Verifier {
 public:
  explicit Verifier(const Module& m) : m_(m) {}

  std::vector<Diagnostic> run() {
    check_symbols();
    check_weights();
    std::set<std::string> names;
    for (const Function& f : m_.functions) {
      if (!names.insert(f.name).second) module_error("[V3] function '{}' is defined twice", f.name);
      check_function(f);
    }
    return std::move(diags_);
  }

 private:
  template <typename... Args>
  void module_error(fmt::format_string<Args...> format, Args&&... args) {
    diags_.push_back({"", -1, {}, fmt::format(format, std::forward<Args>(args)...)});
  }

  void check_symbols() {
    std::set<std::string> seen;
    for (const Symbol& s : m_.symbols) {
      if (!is_identifier(s.name))
        module_error("[V1] symbol name '{}' is not an identifier", s.name);
      if (!seen.insert(s.name).second) module_error("[V1] symbol '{}' is declared twice", s.name);
      if (s.max < 1) module_error("[V1] symbol '{}' has maximum {}, expected >= 1", s.name, s.max);
    }
  }

  void check_weights() {
    std::set<std::string> seen;
    for (const Weight& w : m_.weights) {
      if (!seen.insert(w.name).second) module_error("[V2] weight '{}' is declared twice", w.name);
      int64_t bytes = dtype_size(w.type.dtype);
      bool bad_size = false;
      for (const Dim& d : w.type.shape) {
        if (d.is_symbolic())
          module_error("[V2] weight '{}' has symbolic type {}", w.name, to_string(w.type));
        bad_size |= d.value < 0 || __builtin_mul_overflow(bytes, d.value, &bytes) ||
                    bytes > kMaxTensorBytes;
      }
      if (bad_size)
        module_error("[V2] weight '{}' of type {} has a negative dim or more than {} bytes", w.name,
                     to_string(w.type), kMaxTensorBytes);
      if (w.derivation) check_derivation(w);
    }
  }

  void check_derivation(const Weight& w) {
    const WeightDerivation& d = *w.derivation;
    if (d.op == "transpose" && d.inputs.size() == 1) {
      // transpose(@W) {perm = [1, 0]} of a plain rank-2 weight (an [in, out] linear weight).
      const Weight* src = m_.find_weight(d.inputs[0]);
      if (!src || src->derivation) {
        module_error("[V9] weight '{}' derives from '{}', which is not a declared plain weight",
                     w.name, d.inputs[0]);
        return;
      }
      TypeResult r = infer_type(m_, OpKind::transpose, {src->type}, d.attrs, nullptr);
      if (!r.ok() || src->type.rank() != 2)
        module_error("[V9] weight '{}': transpose {}", w.name,
                     r.ok() ? "of a weight of rank other than 2" : r.error);
      else if (!(r.type == w.type))
        module_error("[V9] weight '{}' has type {}, its derivation gives {}", w.name,
                     to_string(w.type), to_string(r.type));
      return;
    }
    if (d.op != "concat" || d.inputs.empty()) {
      module_error("[V9] weight '{}' has an unknown derivation '{}'", w.name, d.op);
      return;
    }
    // {transpose = 1}: each input, an [in, out] weight [K, N_i], is transposed first.
    ir::Attrs attrs = d.attrs;
    bool transposed = false;
    if (auto it = attrs.find("transpose"); it != attrs.end()) {
      const int64_t* t = std::get_if<int64_t>(&it->second);
      if (!t || (*t != 0 && *t != 1)) {
        module_error("[V9] weight '{}': concat attribute 'transpose' must be 0 or 1", w.name);
        return;
      }
      transposed = *t == 1;
      attrs.erase(it);
    }
    std::vector<TensorType> types;
    for (const std::string& in : d.inputs) {
      const Weight* src = m_.find_weight(in);
      if (!src || src->derivation) {
        module_error("[V9] weight '{}' derives from '{}', which is not a declared plain weight",
                     w.name, in);
        return;
      }
      if (transposed && src->type.rank() != 2) {
        module_error("[V9] weight '{}': a transposed concat of '{}', which is not rank 2", w.name,
                     in);
        return;
      }
      types.push_back(transposed
                          ? TensorType{src->type.dtype, {src->type.shape[1], src->type.shape[0]}}
                          : src->type);
    }
    TypeResult r = infer_type(m_, OpKind::concat, types, attrs, nullptr);
    if (!r.ok())
      module_error("[V9] weight '{}': concat {}", w.name, r.error);
    else if (!(r.type == w.type))
      module_error("[V9] weight '{}' has type {}, its derivation gives {}", w.name,
                   to_string(w.type), to_string(r.type));
  }

  void check_type_symbols(const Function& f, int op, const TensorType& t) {
    int64_t bytes = dtype_size(t.dtype);
    bool too_big = false;
    for (const Dim& d : t.shape) {
      if (d.is_symbolic() && !m_.find_symbol(d.symbol)) {
        op_error(f, op, "[V7] type {} uses undeclared symbol '{}'", to_string(t), d.symbol);
        return;
      }
      int64_t lowest = 0;  // the dim at its symbol's 1
      if (d.is_symbolic() && !__builtin_add_overflow(d.scale, d.value, &lowest) &&
          (d.scale < 1 || lowest < 1)) {
        op_error(f, op, "[V7] type {} has dim {}, which is {} when {} = 1 (a dim is at least 1)",
                 to_string(t), to_string(d), lowest, d.symbol);
        return;
      }
      int64_t extent = 0;
      if (d.is_symbolic() &&
          (__builtin_mul_overflow(d.scale, m_.find_symbol(d.symbol)->max, &extent) ||
           __builtin_add_overflow(extent, d.value, &extent))) {
        op_error(f, op, "[V7] type {} has dim {}, which overflows at {}'s maximum", to_string(t),
                 to_string(d), d.symbol);
        return;
      }
      if (!d.is_symbolic()) extent = d.value;
      if (extent < 0) {
        op_error(f, op, "[V7] type {} has a negative dim", to_string(t));
        return;
      }
      too_big |= __builtin_mul_overflow(bytes, extent, &bytes) || bytes > kMaxTensorBytes;
    }
    if (too_big)
      op_error(f, op, "[V7] type {} is larger than {} bytes at the symbols' maxima", to_string(t),
               kMaxTensorBytes);
  }

  template <typename... Args>
  void op_error(const Function& f, int op, fmt::format_string<Args...> format, Args&&... args) {
    Loc loc;
    if (op >= 0 && op < static_cast<int>(f.ops.size())) loc = f.ops[op].loc;
    diags_.push_back({f.name, op, loc, fmt::format(format, std::forward<Args>(args)...)});
  }

  // V12, on a function whose values and operands are valid.
  void check_fused(const Function& f) {
    const size_t n = f.values.size();
    std::vector<int> def(n, -1), reads(n, 0), bad_reader(n, -1);
    for (size_t i = 0; i < f.ops.size(); ++i) def[f.ops[i].result] = static_cast<int>(i);
    std::vector<bool> is_result(n, false);
    for (ValueId r : f.results) is_result[r] = true;
    for (size_t i = 0; i < f.ops.size(); ++i) {
      const Op& u = f.ops[i];
      for (ValueId v : u.operands) {
        ++reads[v];
        const bool scalar_constant =
            def[v] >= 0 && f.ops[def[v]].kind == OpKind::constant && f.type(v).rank() == 0;
        const bool inside = is_elementwise(u.kind) &&
                            (f.type(v).shape == f.type(u.result).shape || scalar_constant);
        if (!inside && bad_reader[v] < 0) bad_reader[v] = static_cast<int>(i);
      }
    }
    auto name = [&](ValueId v) {
      return f.values[v].name.empty() ? std::to_string(v) : f.values[v].name;
    };
    // Levels of fused ops from each value up to the root of the kernel computing it, from
    // the last op back (every reader comes after the value it reads).
    std::vector<int> depth(n, 0);
    for (size_t k = f.ops.size(); k-- > 0;) {
      const Op& op = f.ops[k];
      const int d = op.fused ? depth[op.result] + 1 : 0;
      for (ValueId o : op.operands) depth[o] = std::max(depth[o], d);
    }
    for (size_t k = 0; k < f.ops.size(); ++k) {
      const Op& op = f.ops[k];
      if (!op.fused) continue;
      const ValueId v = op.result;
      const int i = static_cast<int>(k);
      const bool cheap = op.kind == OpKind::constant || op.kind == OpKind::iota;
      if (!is_elementwise_fusable(op.kind))
        op_error(f, i,
                 "[V12] {} %{} is fused but is not elementwise, a gather, a constant or an iota",
                 op_name(op.kind), name(v));
      else if (is_result[v])
        op_error(f, i, "[V12] {} %{} is fused but is a result of the function", op_name(op.kind),
                 name(v));
      else if (reads[v] == 0)
        op_error(f, i, "[V12] {} %{} is fused but nothing reads it", op_name(op.kind), name(v));
      else if (bad_reader[v] >= 0)
        op_error(f, i,
                 "[V12] {} %{} is fused but its reader {} %{} is not elementwise of its shape",
                 op_name(op.kind), name(v), op_name(f.ops[bad_reader[v]].kind),
                 name(f.ops[bad_reader[v]].result));
      else if (reads[v] > 1 && !cheap)
        op_error(f, i,
                 "[V12] {} %{} is fused but read {} times (only a constant or iota may be "
                 "computed in several kernels)",
                 op_name(op.kind), name(v), reads[v]);
      else if (depth[v] >= kMaxFusedDepth)
        op_error(f, i, "[V12] {} %{} is fused {} levels below its kernel's root (at most {})",
                 op_name(op.kind), name(v), depth[v] + 1, kMaxFusedDepth);
    }
  }

  void check_function(const Function& f) {
    const size_t diags_before = diags_.size();
    const int nvalues = static_cast<int>(f.values.size());
    std::vector<int> defined(nvalues, 0);  // 0 = not yet, 1 = defined
    std::vector<int> def_count(nvalues, 0);
    auto valid = [&](ValueId id) { return id >= 0 && id < nvalues; };

    std::set<std::string> names;
    for (const Value& v : f.values)
      if (!v.name.empty() && !names.insert(v.name).second)
        op_error(f, -1, "[V6] value name '%{}' is used twice", v.name);

    for (ValueId p : f.params) {
      if (!valid(p)) {
        op_error(f, -1, "[V4] parameter refers to missing value {}", p);
        continue;
      }
      defined[p] = 1;
      ++def_count[p];
      check_type_symbols(f, -1, f.type(p));
    }
    std::vector<int> def_op(nvalues, -1);            // the op defining each value, once defined
    std::vector<bool> has_sum(f.ops.size(), false);  // add_layernorms with their sum op
    for (int i = 0; i < static_cast<int>(f.ops.size()); ++i) {
      const Op& op = f.ops[i];
      if (op.kind == OpKind::add_layernorm_sum && op.operands.size() == 1 &&
          valid(op.operands[0]) && defined[op.operands[0]]) {
        const int d = def_op[op.operands[0]];
        if (d < 0 || f.ops[d].kind != OpKind::add_layernorm)
          op_error(f, i, "[V11] add_layernorm_sum: operand %{} is not an add_layernorm's result",
                   f.values[op.operands[0]].name.empty() ? std::to_string(op.operands[0])
                                                         : f.values[op.operands[0]].name);
        else if (has_sum[d])
          op_error(f, i, "[V11] add_layernorm_sum: the add_layernorm of %{} has a sum already",
                   f.values[op.operands[0]].name.empty() ? std::to_string(op.operands[0])
                                                         : f.values[op.operands[0]].name);
        else
          has_sum[d] = true;
      }
      std::vector<TensorType> operand_types;
      bool operands_ok = true;
      for (ValueId v : op.operands) {
        if (!valid(v)) {
          op_error(f, i, "[V4] {}: operand refers to missing value {}", op_name(op.kind), v);
          operands_ok = false;
        } else if (!defined[v]) {
          op_error(f, i, "[V5] {}: operand %{} is used before it is defined", op_name(op.kind),
                   f.values[v].name.empty() ? std::to_string(v) : f.values[v].name);
          operands_ok = false;
        } else {
          operand_types.push_back(f.type(v));
        }
      }
      if (!valid(op.result)) {
        op_error(f, i, "[V4] {}: result refers to missing value {}", op_name(op.kind), op.result);
        continue;
      }
      ++def_count[op.result];
      defined[op.result] = 1;
      def_op[op.result] = i;
      check_type_symbols(f, i, f.type(op.result));
      if (std::string e = check_attrs(op.kind, op.attrs); !e.empty()) {
        op_error(f, i, "[V10] {}: {}", op_name(op.kind), e);
        continue;
      }
      if (!operands_ok) continue;
      TypeResult r = infer_type(m_, op.kind, operand_types, op.attrs, &f.type(op.result));
      if (!r.ok())
        op_error(f, i, "[V8] {}: {}", op_name(op.kind), r.error);
      else if (!(r.type == f.type(op.result)))
        op_error(f, i, "[V8] {}: result type is {}, expected {}", op_name(op.kind),
                 to_string(f.type(op.result)), to_string(r.type));
    }
    for (int v = 0; v < nvalues; ++v)
      if (def_count[v] != 1)
        op_error(f, -1, "[V5] value %{} is defined {} times",
                 f.values[v].name.empty() ? std::to_string(v) : f.values[v].name, def_count[v]);
    if (f.results.empty()) op_error(f, -1, "[V3] function '{}' has no results", f.name);
    for (ValueId r : f.results)
      if (!valid(r)) op_error(f, -1, "[V4] return refers to missing value {}", r);
    if (diags_.size() == diags_before) check_fused(f);
  }

  const Module& m_;
  std::vector<Diagnostic> diags_;
};

}  // namespace

std::vector<Diagnostic> verify(const Module& module) { return Verifier(module).run(); }

std::string format_diagnostic(const Diagnostic& d, const std::string& file) {
  if (d.loc.line > 0)
    return fmt::format("{}:{}:{}: error: {}", file, d.loc.line, d.loc.col, d.message);
  if (d.function.empty()) return fmt::format("{}: error: {}", file, d.message);
  if (d.op_index < 0)
    return fmt::format("{}: error: in function '{}': {}", file, d.function, d.message);
  return fmt::format("{}: error: in function '{}', op {}: {}", file, d.function, d.op_index,
                     d.message);
}

void verify_or_throw(const Module& module, const std::string& file) {
  std::vector<Diagnostic> diags = verify(module);
  if (diags.empty()) return;
  std::string msg;
  for (size_t i = 0; i < diags.size() && i < 10; ++i) {
    if (i) msg += '\n';
    msg += format_diagnostic(diags[i], file);
  }
  if (diags.size() > 10) msg += fmt::format("\n... and {} more", diags.size() - 10);
  throw Error(msg);
}

}  // namespace kiln::ir
