// Type rules of every op (see op_types.h).
#include "ir/op_types.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace kiln::ir {
namespace {

TypeResult ok(TensorType t) { return TypeResult{std::move(t), {}}; }

template <typename... Args>
TypeResult err(fmt::format_string<Args...> format, Args&&... args) {
  return TypeResult{{}, fmt::format(format, std::forward<Args>(args)...)};
}

// Attribute reads, after check_attrs has checked presence and type.
int64_t int_at(const Attrs& attrs, const char* key) { return std::get<int64_t>(attrs.at(key)); }
const std::vector<int64_t>& ints_at(const Attrs& attrs, const char* key) {
  return std::get<std::vector<int64_t>>(attrs.at(key));
}
const std::string& string_at(const Attrs& attrs, const char* key) {
  return std::get<std::string>(attrs.at(key));
}

// Whether two shapes have the same element count for every value of their symbols. A
// symbolic dim a·S + b is g · ((a/g)·S + b/g) with g = gcd(a, |b|), a constant times a
// primitive linear polynomial; polynomials factor uniquely, so the counts are equal iff the
// products of the constants are and the sorted lists of those primitive factors are.
bool same_numel(const std::vector<Dim>& a, const std::vector<Dim>& b) {
  auto summarize = [](const std::vector<Dim>& s, int64_t* c, std::vector<std::string>* atoms) {
    *c = 1;
    for (const auto& d : s) {
      int64_t factor = d.value;
      if (d.is_symbolic()) {
        // d.scale >= 1 (V7), so factor >= 1; an offset of INT64_MIN (refused by V7) has no
        // absolute value for std::gcd.
        factor = d.value == INT64_MIN ? 1 : std::gcd(d.scale, d.value);
        if (factor < 1) factor = 1;
        atoms->push_back(to_string(Dim::affine(d.symbol, d.scale / factor, d.value / factor)));
      }
      if (*c >= 0 && __builtin_mul_overflow(*c, factor, c))
        *c = -1;  // overflowed: never equal to a valid count
    }
    std::sort(atoms->begin(), atoms->end());
  };
  int64_t ca, cb;
  std::vector<std::string> sa, sb;
  summarize(a, &ca, &sa);
  summarize(b, &cb, &sb);
  return ca == cb && sa == sb;
}

std::string type_list(const std::vector<TensorType>& ts) {
  std::string out;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i) out += ", ";
    out += to_string(ts[i]);
  }
  return out;
}

const char* attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::integer:
      return "an integer";
    case AttrType::number:
      return "a number";
    case AttrType::string:
      return "a string";
    case AttrType::ints:
      return "an integer list";
  }
  return "?";
}

bool has_type(const AttrValue& v, AttrType t) {
  switch (t) {
    case AttrType::integer:
      return std::holds_alternative<int64_t>(v);
    case AttrType::number:
      return std::holds_alternative<int64_t>(v) || std::holds_alternative<double>(v);
    case AttrType::string:
      return std::holds_alternative<std::string>(v);
    case AttrType::ints:
      return std::holds_alternative<std::vector<int64_t>>(v);
  }
  return false;
}

// "integer 3", "number 0.5", "string \"yes\"", "integer list [1,0]".
std::string describe(const AttrValue& v) {
  if (const int64_t* i = std::get_if<int64_t>(&v)) return fmt::format("integer {}", *i);
  if (const double* d = std::get_if<double>(&v)) return fmt::format("number {}", *d);
  if (const auto* s = std::get_if<std::string>(&v)) return fmt::format("string \"{}\"", *s);
  const auto& l = std::get<std::vector<int64_t>>(v);
  std::string out = "integer list [";
  for (size_t i = 0; i < l.size(); ++i) out += (i ? "," : "") + std::to_string(l[i]);
  return out + "]";
}

double as_number(const AttrValue& v) {
  if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return std::get<double>(v);
}

}  // namespace

std::string check_attrs(OpKind kind, const Attrs& attrs) {
  const std::span<const AttrSpec> specs = op_info(kind).attrs;
  for (const auto& [key, value] : attrs) {
    const AttrSpec* spec = nullptr;
    for (const AttrSpec& s : specs)
      if (key == s.key) spec = &s;
    if (!spec) return fmt::format("unexpected attribute '{}'", key);
    if (!has_type(value, spec->type))
      return fmt::format("attribute '{}' must be {}, got {}", key, attr_type_name(spec->type),
                         describe(value));
  }
  for (const AttrSpec& s : specs)
    if (s.required && !attrs.count(s.key))
      return fmt::format("needs attribute '{}' ({})", s.key, attr_type_name(s.type));
  // Ranges that do not depend on the operands, in the order of the op's attributes.
  for (const AttrSpec& s : specs) {
    auto it = attrs.find(s.key);
    if (it == attrs.end()) continue;
    const AttrValue& v = it->second;
    switch (s.range) {
      case AttrRange::any:
        break;
      case AttrRange::flag:
        if (std::get<int64_t>(v) != 0 && std::get<int64_t>(v) != 1)
          return fmt::format("attribute '{}' must be 0 or 1, got {}", s.key, std::get<int64_t>(v));
        break;
      case AttrRange::nonnegative:
        if (std::get<int64_t>(v) < 0)
          return fmt::format("attribute '{}' must be >= 0, got {}", s.key, std::get<int64_t>(v));
        break;
      case AttrRange::at_least_one:
        if (std::get<int64_t>(v) < 1)
          return fmt::format("attribute '{}' must be >= 1, got {}", s.key, std::get<int64_t>(v));
        break;
      case AttrRange::positive_finite:
        if (!(as_number(v) > 0) || !std::isfinite(as_number(v)))
          return fmt::format("attribute '{}' must be positive and finite, got {}", s.key,
                             as_number(v));
        break;
      case AttrRange::finite:
        if (!std::isfinite(as_number(v)))
          return fmt::format("attribute '{}' must be finite, got {}", s.key, as_number(v));
        break;
      case AttrRange::activation:
        if (!is_linear_activation(std::get<std::string>(v)))
          return fmt::format(
              "attribute '{}' must be \"none\", \"relu\", \"gelu\", \"gelu_tanh\", "
              "\"silu\", \"sigmoid\" or \"tanh\", got \"{}\"",
              s.key, std::get<std::string>(v));
        break;
    }
  }
  return {};
}

std::string shape_string(const std::vector<Dim>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ',';
    out += to_string(shape[i]);
  }
  return out + "]";
}

AttentionOperands attention_operands(const Attrs& attrs, size_t count) {
  auto flag = [&](const char* key) {
    auto it = attrs.find(key);
    return it != attrs.end() && std::holds_alternative<int64_t>(it->second) &&
           std::get<int64_t>(it->second) == 1;
  };
  const bool query_pad = flag("query_pad"), bias = flag("bias");
  const int fixed = 3 + (query_pad ? 1 : 0) + (bias ? 1 : 0);
  AttentionOperands r;
  int next = 3;
  if (static_cast<int>(count) > fixed) r.key_pad = next++;
  if (query_pad) r.query_pad = next++;
  if (bias) r.bias = next++;
  return r;
}

int64_t normalize_axis(int64_t axis, int64_t rank) {
  if (axis < 0) axis += rank;
  return (axis < 0 || axis >= rank) ? -1 : axis;
}

TypeResult broadcast_types(const TensorType& a, const TensorType& b, DType result_dtype) {
  size_t rank = std::max(a.shape.size(), b.shape.size());
  std::vector<Dim> out(rank);
  for (size_t i = 0; i < rank; ++i) {
    // Align from the right.
    const Dim* da = i < rank - a.shape.size() ? nullptr : &a.shape[i - (rank - a.shape.size())];
    const Dim* db = i < rank - b.shape.size() ? nullptr : &b.shape[i - (rank - b.shape.size())];
    if (!da) {
      out[i] = *db;
    } else if (!db) {
      out[i] = *da;
    } else if (*da == *db) {
      out[i] = *da;
    } else if (da->is_const(1)) {
      out[i] = *db;
    } else if (db->is_const(1)) {
      out[i] = *da;
    } else {
      return err("operand shapes {} and {} do not broadcast", shape_string(a.shape),
                 shape_string(b.shape));
    }
  }
  return ok(TensorType{result_dtype, std::move(out)});
}

bool needs_declared_type(OpKind kind) { return op_info(kind).has(kDeclaredType); }

bool broadcasts_over_leading_dims(const TensorType& y, const TensorType& x) {
  if (y.dtype != x.dtype || y.rank() < 1 || y.rank() > x.rank() || y == x) return false;
  int64_t ones = 0;  // y's leading dims of 1
  while (ones < y.rank() - 1 && y.shape[ones].is_const(1)) ++ones;
  return std::equal(y.shape.begin() + ones, y.shape.end(), x.shape.end() - (y.rank() - ones));
}

TypeResult infer_type(const Module& m, OpKind kind, const std::vector<TensorType>& in,
                      const Attrs& attrs, const TensorType* declared) {
  const size_t n = in.size();
  auto want_operands = [&](int lo, int hi) -> std::string {
    const int count = static_cast<int>(n);
    if (hi == kVariadic) {
      if (count >= lo) return {};
      if (lo == 1) return "expects at least 1 operand";
      return fmt::format("expects at least {} operands, got {}", lo, n);
    }
    if (count < lo || count > hi) {
      if (lo == hi) return fmt::format("expects {} operand(s), got {}", lo, n);
      return fmt::format("expects {} to {} operands, got {}", lo, hi, n);
    }
    return {};
  };
  if (needs_declared_type(kind) && !declared) return err("needs a declared result type");
  // Every attribute read below is present when required, of its type and in its fixed range.
  if (std::string e = check_attrs(kind, attrs); !e.empty()) return err("{}", e);

#define KILN_CHECK(expr)                   \
  do {                                     \
    std::string e_ = (expr);               \
    if (!e_.empty()) return err("{}", e_); \
  } while (0)

  const OpInfo& info = op_info(kind);
  if (!info.has(kOperandsByAttrs)) KILN_CHECK(want_operands(info.min_operands, info.max_operands));

  // The generic rules of the pointwise ops.
  switch (info.rule) {
    case TypeRule::arith:
    case TypeRule::compare:
    case TypeRule::logical: {
      if (n == 1) {  // logical_not
        if (in[0].dtype != DType::boolean) return err("operand must be bool");
        return ok(in[0]);
      }
      if (in[0].dtype != in[1].dtype)
        return err("operand dtypes differ: {} and {}", dtype_name(in[0].dtype),
                   dtype_name(in[1].dtype));
      const DType d = in[0].dtype;
      if (info.rule == TypeRule::logical && d != DType::boolean)
        return err("operands must be bool, got {}", dtype_name(d));
      if (info.rule == TypeRule::arith && d == DType::boolean)
        return err("arithmetic on bool operands");
      return broadcast_types(in[0], in[1], info.rule == TypeRule::arith ? d : DType::boolean);
    }
    case TypeRule::f32_unary:
      if (in[0].dtype != DType::f32) return err("operand must be f32");
      return ok(in[0]);
    case TypeRule::numeric_unary:
      if (in[0].dtype == DType::boolean) return err("operand must not be bool");
      return ok(in[0]);
    case TypeRule::select: {
      if (in[0].dtype != DType::boolean) return err("condition must be bool");
      if (in[1].dtype != in[2].dtype)
        return err("branch dtypes differ: {} and {}", dtype_name(in[1].dtype),
                   dtype_name(in[2].dtype));
      TypeResult ab = broadcast_types(in[1], in[2], in[1].dtype);
      if (!ab.ok()) return ab;
      return broadcast_types(in[0], ab.type, in[1].dtype);
    }
    case TypeRule::custom:
      break;
  }

  // The kinds' own rules (TypeRule::custom); the operand count is checked above.
  switch (kind) {
    case OpKind::weight: {
      const std::string& name = string_at(attrs, "name");
      const Weight* w = m.find_weight(name);
      if (!w) return err("refers to undeclared weight '{}'", name);
      if (!(w->type == *declared))
        return err("weight '{}' is declared as {}, used as {}", name, to_string(w->type),
                   to_string(*declared));
      return ok(*declared);
    }
    case OpKind::constant: {
      if (is_integer(declared->dtype) && std::holds_alternative<double>(attrs.at("value")))
        return err("integer constant has a non-integer value");
      if (declared->dtype == DType::i32) {
        const int64_t v = int_at(attrs, "value");
        if (v < INT32_MIN || v > INT32_MAX) return err("value {} does not fit i32", v);
      }
      return ok(*declared);
    }
    case OpKind::sinusoid_table: {
      // The row count may be symbolic (canonicalize folds a slice of the rows used
      // into the table); the feature dim must be constant.
      if (declared->dtype != DType::f32 || declared->rank() != 2 ||
          declared->shape[1].is_symbolic())
        return err("result must be f32[rows,dim] with a constant dim, got {}",
                   to_string(*declared));
      return ok(*declared);
    }
    case OpKind::iota: {
      const int64_t axis = int_at(attrs, "axis");
      if (!is_integer(declared->dtype)) return err("result must be an integer type");
      if (normalize_axis(axis, declared->rank()) < 0)
        return err("axis {} out of range for rank {}", axis, declared->rank());
      return ok(*declared);
    }
    case OpKind::cast: {
      if (in[0].shape != declared->shape)
        return err("result shape {} differs from operand shape {}", shape_string(declared->shape),
                   shape_string(in[0].shape));
      return ok(*declared);
    }
    case OpKind::expand: {
      // Numpy broadcasting of the operand to the declared shape: right-aligned, each operand
      // dim 1 or equal to the result's.
      const TensorType& x = in[0];
      if (declared->dtype != x.dtype)
        return err("result {} must have the operand's dtype ({})", to_string(*declared),
                   to_string(x));
      bool fits = x.rank() <= declared->rank();
      for (int64_t d = 0; fits && d < x.rank(); ++d) {
        const Dim& od = declared->shape[static_cast<size_t>(declared->rank() - x.rank() + d)];
        fits = x.shape[static_cast<size_t>(d)].is_const(1) || x.shape[static_cast<size_t>(d)] == od;
      }
      if (!fits)
        return err("operand {} does not broadcast to {}", to_string(x), to_string(*declared));
      return ok(*declared);
    }
    case OpKind::reshape: {
      if (declared->dtype != in[0].dtype) return err("reshape cannot change the dtype");
      if (!same_numel(in[0].shape, declared->shape))
        return err("cannot reshape {} to {}: element counts differ", shape_string(in[0].shape),
                   shape_string(declared->shape));
      return ok(*declared);
    }
    case OpKind::slice: {
      const int64_t axis = int_at(attrs, "axis"), start = int_at(attrs, "start");
      int64_t a = normalize_axis(axis, in[0].rank());
      if (a < 0) return err("axis {} out of range for rank {}", axis, in[0].rank());
      if (declared->dtype != in[0].dtype || declared->rank() != in[0].rank())
        return err("result {} must have the operand's dtype and rank ({})", to_string(*declared),
                   to_string(in[0]));
      for (int64_t i = 0; i < in[0].rank(); ++i)
        if (i != a && !(declared->shape[i] == in[0].shape[i]))
          return err("result {} differs from operand {} outside axis {}", to_string(*declared),
                     to_string(in[0]), a);
      const Dim& src = in[0].shape[a];
      const Dim& dst = declared->shape[a];
      // start + dst <= src at the symbols' maxima (what memory holds), and when both dims are
      // affine in one symbol, also at its value 1 (then at every value between).
      bool ok_range = start == 0 && src == dst;
      if (!ok_range) {
        int64_t end = 0;
        ok_range = !__builtin_add_overflow(start, dim_max(m, dst), &end) && end <= dim_max(m, src);
        int64_t lo_dst = 0, lo_src = 0;  // at the symbol's 1
        if (ok_range && src.is_symbolic() && dst.is_symbolic() && src.symbol == dst.symbol)
          ok_range = !__builtin_add_overflow(dst.scale, dst.value, &lo_dst) &&
                     !__builtin_add_overflow(lo_dst, start, &lo_dst) &&
                     !__builtin_add_overflow(src.scale, src.value, &lo_src) && lo_dst <= lo_src;
      }
      if (!ok_range)
        return err("slice [{}, {}+{}) exceeds extent {} of axis {}", start, start, to_string(dst),
                   to_string(src), a);
      return ok(*declared);
    }
    case OpKind::gather: {
      if (in[0].rank() < 1) return err("table must have rank >= 1");
      if (!is_integer(in[1].dtype))
        return err("indices must be integers, got {}", dtype_name(in[1].dtype));
      TensorType t{in[0].dtype, in[1].shape};
      t.shape.insert(t.shape.end(), in[0].shape.begin() + 1, in[0].shape.end());
      return ok(t);
    }
    case OpKind::transpose: {
      const std::vector<int64_t>& perm = ints_at(attrs, "perm");
      if (static_cast<int64_t>(perm.size()) != in[0].rank())
        return err("perm has {} entries for rank {}", perm.size(), in[0].rank());
      std::vector<bool> seen(perm.size());
      TensorType t{in[0].dtype, {}};
      for (int64_t p : perm) {
        if (p < 0 || p >= in[0].rank() || seen[p]) return err("perm is not a permutation");
        seen[p] = true;
        t.shape.push_back(in[0].shape[p]);
      }
      return ok(t);
    }
    case OpKind::concat: {
      const int64_t axis = int_at(attrs, "axis");
      int64_t a = normalize_axis(axis, in[0].rank());
      if (a < 0) return err("axis {} out of range for rank {}", axis, in[0].rank());
      TensorType t = in[0];
      std::optional<Dim> total = Dim::constant(0);
      for (const auto& ti : in) {
        if (ti.dtype != t.dtype || ti.rank() != t.rank())
          return err("operands {} differ in dtype or rank", type_list(in));
        for (int64_t i = 0; i < t.rank(); ++i)
          if (i != a && !(ti.shape[i] == t.shape[i]))
            return err("operands {} differ outside axis {}", type_list(in), a);
        // The extents along the axis add up: constants, and affine dims of one symbol
        // ([B,1,D] ++ [B,T,D] -> [B,T+1,D]); two different symbols do not.
        std::string why;
        total = add_dims(*total, ti.shape[a], &why);
        if (!total) return err("cannot concat {} along axis {}: {}", type_list(in), a, why);
      }
      t.shape[a] = *total;
      return ok(t);
    }
    case OpKind::matmul: {
      const TensorType& a = in[0];
      const TensorType& b = in[1];
      if (a.dtype != DType::f32 || b.dtype != DType::f32) return err("operands must be f32");
      if (a.rank() < 2 || b.rank() < 2)
        return err("operands must have rank >= 2, got {} and {}", to_string(a), to_string(b));
      if (!(a.shape[a.rank() - 1] == b.shape[b.rank() - 2]))
        return err("contraction dims differ: {} x {}", to_string(a), to_string(b));
      TensorType ba{a.dtype, {a.shape.begin(), a.shape.end() - 2}};
      TensorType bb{b.dtype, {b.shape.begin(), b.shape.end() - 2}};
      TypeResult batch = broadcast_types(ba, bb, DType::f32);
      if (!batch.ok())
        return err("batch dims of {} and {} do not broadcast", to_string(a), to_string(b));
      batch.type.shape.push_back(a.shape[a.rank() - 2]);
      batch.type.shape.push_back(b.shape[b.rank() - 1]);
      return batch;
    }
    case OpKind::softmax: {
      const int64_t axis = int_at(attrs, "axis");
      if (normalize_axis(axis, in[0].rank()) < 0)
        return err("axis {} out of range for rank {}", axis, in[0].rank());
      if (in[0].dtype != DType::f32) return err("operand must be f32");
      return ok(in[0]);
    }
    case OpKind::layernorm:
    case OpKind::add_layernorm: {
      const bool fused = kind == OpKind::add_layernorm;
      const bool rms = attrs.count("rms") && int_at(attrs, "rms") == 1;
      const int params = fused ? 2 : 1;  // operands before gamma
      KILN_CHECK(want_operands(params + (rms ? 1 : 2), params + (rms ? 1 : 2)));
      if (rms && ((attrs.count("unbiased") && int_at(attrs, "unbiased") == 1) ||
                  (attrs.count("eps_outside") && int_at(attrs, "eps_outside") == 1)))
        return err("rms takes neither unbiased nor eps_outside");
      const TensorType& x = in[0];
      // y is x's type, or broadcasts over x's leading dims (learned positions [S,D] or
      // [1,S,D] added to token embeddings [B,S,D]).
      if (fused && !(in[1] == x) && !broadcasts_over_leading_dims(in[1], x))
        return err("addends differ: {} and {}", to_string(x), to_string(in[1]));
      if (x.dtype != DType::f32 || x.rank() < 1) return err("input must be f32 of rank >= 1");
      const TensorType& g = in[params];
      TensorType want{DType::f32, {x.shape.back()}};
      if (rms && !(g == want)) return err("gamma {} must be {}", to_string(g), to_string(want));
      const TensorType& bta = in[rms ? params : params + 1];
      if (!(g == want) || !(bta == want))
        return err("gamma {} and beta {} must be {}", to_string(g), to_string(bta),
                   to_string(want));
      // The unbiased variance of one value divides by D - 1 = 0.
      if (attrs.count("unbiased") && int_at(attrs, "unbiased") == 1 && x.shape.back().is_const(1))
        return err("unbiased variance over a last dim of 1 divides by zero (D - 1 = 0)");
      return ok(x);
    }
    case OpKind::add_layernorm_sum:
      // That the operand is an add_layernorm's result is V11, beyond a type rule.
      if (in[0].dtype != DType::f32 || in[0].rank() < 1)
        return err("operand must be f32 of rank >= 1");
      return ok(in[0]);
    case OpKind::reduce_sum:
    case OpKind::reduce_max:
    case OpKind::reduce_mean: {
      const std::vector<int64_t>& axes = ints_at(attrs, "axes");
      const bool keep = attrs.count("keepdims") && int_at(attrs, "keepdims") == 1;
      if (in[0].dtype == DType::boolean) return err("cannot reduce bool");
      if (kind == OpKind::reduce_mean && in[0].dtype != DType::f32)
        return err("reduce_mean needs f32");
      std::vector<bool> reduced(in[0].rank());
      for (int64_t ax : axes) {
        int64_t a = normalize_axis(ax, in[0].rank());
        if (a < 0) return err("axis {} out of range for rank {}", ax, in[0].rank());
        if (reduced[a]) return err("axis {} repeated", ax);
        reduced[a] = true;
      }
      TensorType t{in[0].dtype, {}};
      for (int64_t i = 0; i < in[0].rank(); ++i) {
        if (!reduced[i])
          t.shape.push_back(in[0].shape[i]);
        else if (keep)
          t.shape.push_back(Dim::constant(1));
      }
      return ok(t);
    }
    case OpKind::take_along_axis: {
      // take_along_axis(x[..., N, ...], ids int[..., K, ...]) {axis} -> x.dtype[ids's shape]
      const TensorType &x = in[0], &ids = in[1];
      const int64_t axis = int_at(attrs, "axis");
      const int64_t a = normalize_axis(axis, x.rank());
      if (a < 0) return err("axis {} out of range for rank {}", axis, x.rank());
      if (!is_integer(ids.dtype))
        return err("indices must be integers, got {}", dtype_name(ids.dtype));
      if (ids.rank() != x.rank())
        return err("indices {} must have the rank of {}", to_string(ids), to_string(x));
      for (int64_t i = 0; i < x.rank(); ++i)
        if (i != a && !(ids.shape[i] == x.shape[i]))
          return err("indices {} differ from {} outside axis {}", to_string(ids), to_string(x), a);
      return ok(TensorType{x.dtype, ids.shape});
    }
    case OpKind::scatter_add: {
      // scatter_add(base[..., N, ...], ids int[..., K, ...], src[..., K, ...]) {axis} -> base
      const TensorType &base = in[0], &ids = in[1], &src = in[2];
      const int64_t axis = int_at(attrs, "axis");
      const int64_t a = normalize_axis(axis, base.rank());
      if (a < 0) return err("axis {} out of range for rank {}", axis, base.rank());
      if (base.dtype == DType::boolean) return err("cannot add bool values");
      if (src.dtype != base.dtype)
        return err("source {} must have the dtype of {}", to_string(src), to_string(base));
      if (!is_integer(ids.dtype))
        return err("indices must be integers, got {}", dtype_name(ids.dtype));
      if (ids.shape != src.shape)
        return err("indices {} must have the shape of the source {}", to_string(ids),
                   to_string(src));
      if (src.rank() != base.rank())
        return err("source {} must have the rank of {}", to_string(src), to_string(base));
      for (int64_t i = 0; i < base.rank(); ++i)
        if (i != a && !(src.shape[i] == base.shape[i]))
          return err("source {} differs from {} outside axis {}", to_string(src), to_string(base),
                     a);
      return ok(base);
    }
    case OpKind::topk: {
      // topk(x[..., N]) {k} -> i64[..., k]
      const TensorType& x = in[0];
      const int64_t k = int_at(attrs, "k");
      if (x.rank() < 1 || x.dtype == DType::boolean)
        return err("operand must be a number tensor of rank >= 1, got {}", to_string(x));
      if (k > dim_max(m, x.shape.back()))
        return err("k = {} exceeds the last axis of {}", k, to_string(x));
      TensorType t{DType::i64, x.shape};
      t.shape.back() = Dim::constant(k);
      return ok(t);
    }
    case OpKind::moe_ffn: {
      // moe_ffn(x f32[..., D], ids int[..., K], gates f32[..., K],
      //         {w1 f32[F, D], w3 f32[F, D], w2 f32[D, F]} per expert) {experts}
      const int64_t experts = int_at(attrs, "experts");
      if (experts > 1 << 20) return err("experts = {} is too many", experts);
      KILN_CHECK(
          want_operands(static_cast<int>(3 + 3 * experts), static_cast<int>(3 + 3 * experts)));
      const TensorType &x = in[0], &ids = in[1], &gates = in[2];
      if (x.dtype != DType::f32 || x.rank() < 1 || x.shape.back().is_symbolic())
        return err("x {} must be f32[..., D] with a constant D", to_string(x));
      if (!is_integer(ids.dtype) || ids.rank() != x.rank() || ids.shape.back().is_symbolic() ||
          !std::equal(ids.shape.begin(), ids.shape.end() - 1, x.shape.begin()))
        return err("expert ids {} must be integers [..., K] with the leading dims of x {}",
                   to_string(ids), to_string(x));
      if (!(gates == TensorType{DType::f32, ids.shape}))
        return err("gates {} must be f32 of the ids' shape {}", to_string(gates),
                   shape_string(ids.shape));
      const Dim& d = x.shape.back();
      const TensorType& w1 = in[3];
      if (w1.dtype != DType::f32 || w1.rank() != 2 || w1.shape[0].is_symbolic() ||
          !(w1.shape[1] == d))
        return err("expert 0's w1 {} must be f32[F, {}]", to_string(w1), to_string(d));
      const TensorType up{DType::f32, {w1.shape[0], d}}, down{DType::f32, {d, w1.shape[0]}};
      for (int64_t e = 0; e < experts; ++e)
        for (int j = 0; j < 3; ++j) {
          const TensorType& w = in[static_cast<size_t>(3 + 3 * e + j)];
          const TensorType& want = j == 2 ? down : up;
          if (!(w == want))
            return err("expert {}'s {} {} must be {}", e,
                       j == 0   ? "w1"
                       : j == 1 ? "w3"
                                : "w2",
                       to_string(w), to_string(want));
        }
      return ok(x);
    }
    case OpKind::argmax: {
      const int64_t axis = int_at(attrs, "axis");
      int64_t a = normalize_axis(axis, in[0].rank());
      if (a < 0) return err("axis {} out of range for rank {}", axis, in[0].rank());
      TensorType t{DType::i64, in[0].shape};
      t.shape.erase(t.shape.begin() + a);
      return ok(t);
    }
    case OpKind::linear: {
      const TensorType& x = in[0];
      const TensorType& w = in[1];
      if (x.dtype != DType::f32 || w.dtype != DType::f32 || x.rank() < 1 || w.rank() != 2)
        return err("expects f32 x[...,K] and W[N,K], got {} and {}", to_string(x), to_string(w));
      if (!(x.shape.back() == w.shape[1]))
        return err("input {} does not match weight {}", to_string(x), to_string(w));
      if (n == 3 && !(in[2] == TensorType{DType::f32, {w.shape[0]}}))
        return err("bias {} must be f32[{}]", to_string(in[2]), to_string(w.shape[0]));
      TensorType t = x;
      t.shape.back() = w.shape[0];
      return ok(t);
    }
    case OpKind::linear_rows: {
      const TensorType &x = in[0], &w = in[1], &ids = in[2];
      if (x.dtype != DType::f32 || w.dtype != DType::f32 || x.rank() < 1 || w.rank() != 2)
        return err("expects f32 x[...,K] and W[V,K], got {} and {}", to_string(x), to_string(w));
      if (!(x.shape.back() == w.shape[1]))
        return err("input {} does not match weight {}", to_string(x), to_string(w));
      if (ids.dtype != DType::i64 || ids.rank() != 1)
        return err("ids must be i64[R], got {}", to_string(ids));
      if (n == 4 && !(in[3] == TensorType{DType::f32, {w.shape[0]}}))
        return err("bias {} must be f32[{}]", to_string(in[3]), to_string(w.shape[0]));
      TensorType t = x;
      t.shape.back() = ids.shape[0];
      return ok(t);
    }
    case OpKind::attention: {
      // attention(q[B,Lq,H*Dk], k[B,Lk,KV*Dk], v[B,Lk,KV*Dv] [, key_pad bool[B,Lk]]
      //           [, query_pad bool[B,Lq] (with query_pad = 1)] [, bias f32 (with bias = 1)])
      //   {heads, scale, causal, fill_inf, query_pad, kv_heads, bias, window, softcap}
      const AttentionOperands ops = attention_operands(attrs, n);
      const int fixed = 3 + (ops.query_pad >= 0 ? 1 : 0) + (ops.bias >= 0 ? 1 : 0);
      KILN_CHECK(want_operands(fixed, fixed + 1));
      const int64_t heads = int_at(attrs, "heads");
      const int64_t kv_heads = attrs.count("kv_heads") ? int_at(attrs, "kv_heads") : heads;
      if (heads % kv_heads != 0)
        return err("{} heads are not a multiple of {} kv_heads", heads, kv_heads);
      if (attrs.count("window") && !(attrs.count("causal") && int_at(attrs, "causal") == 1))
        return err("a sliding window needs causal = 1");
      // (Which rows a window and key padding mask whole is not known to the kernel: they are
      // the mean of v there, as with -1e9, but would have to be NaN with -inf.)
      if (attrs.count("window") && ops.key_pad >= 0 && attrs.count("fill_inf") &&
          int_at(attrs, "fill_inf") == 1)
        return err("a sliding window with key padding needs the -1e9 fill, not fill_inf");
      const TensorType &q = in[0], &k = in[1], &v = in[2];
      for (const TensorType* t : {&q, &k, &v})
        if (t->dtype != DType::f32 || t->rank() != 3)
          return err("q, k, v must be f32 of rank 3, got {}", type_list(in));
      if (!(q.shape[0] == k.shape[0]) || !(k.shape[0] == v.shape[0]) ||
          !(k.shape[1] == v.shape[1]) || (kv_heads == heads && !(q.shape[2] == k.shape[2])))
        return err("q {}, k {}, v {} do not agree", to_string(q), to_string(k), to_string(v));
      if (q.shape[2].is_symbolic() || q.shape[2].value % heads != 0)
        return err("feature size of {} is not divisible by {} heads", to_string(q), heads);
      if (v.shape[2].is_symbolic() || v.shape[2].value % kv_heads != 0)
        return err("feature size of {} is not divisible by {} {}", to_string(v), kv_heads,
                   kv_heads == heads ? "heads" : "kv heads");
      if (k.shape[2].is_symbolic() || k.shape[2].value != q.shape[2].value / heads * kv_heads)
        return err("k {} must have {} kv heads of q {}'s head size", to_string(k), kv_heads,
                   to_string(q));
      if (ops.key_pad >= 0) {
        TensorType want{DType::boolean, {k.shape[0], k.shape[1]}};
        if (!(in[ops.key_pad] == want))
          return err("key padding mask {} must be {}", to_string(in[ops.key_pad]), to_string(want));
      }
      if (ops.query_pad >= 0) {
        TensorType want{DType::boolean, {q.shape[0], q.shape[1]}};
        if (!(in[ops.query_pad] == want))
          return err("query padding mask {} must be {}", to_string(in[ops.query_pad]),
                     to_string(want));
      }
      if (ops.bias >= 0) {
        // f32 [B',H',Lq',Lk'], each dim 1 or the scores' [B,H,Lq,Lk].
        const TensorType& b = in[ops.bias];
        const std::vector<Dim> full = {q.shape[0], Dim::constant(heads), q.shape[1], k.shape[1]};
        bool fits = b.dtype == DType::f32 && b.rank() == 4;
        for (size_t d = 0; fits && d < 4; ++d)
          fits = b.shape[d].is_const(1) || b.shape[d] == full[d];
        if (!fits)
          return err("score bias {} must be f32 of rank 4 broadcasting to the scores {}",
                     to_string(b), to_string(TensorType{DType::f32, full}));
      }
      return ok(
          TensorType{DType::f32,
                     {q.shape[0], q.shape[1], Dim::constant(v.shape[2].value / kv_heads * heads)}});
    }
    case OpKind::cache_write: {
      // cache_write(cache f32[T,C,D], x f32[N,1,D], pos i64[1]) -> f32[T,C,D]
      // cache_write(cache f32[T,C,D], x f32[N,L,D]) -> f32[T,C,D]   (rows 0..L-1)
      const TensorType &cache = in[0], &x = in[1];
      const bool at_pos = in.size() == 3;
      if (cache.dtype != DType::f32 || cache.rank() != 3 || x.dtype != DType::f32 ||
          x.rank() != 3 || (at_pos && !x.shape[1].is_const(1)) || !(x.shape[2] == cache.shape[2]))
        return err("expects cache f32[T,C,D] and x f32[N,{},D], got {} and {}", at_pos ? "1" : "L",
                   to_string(cache), to_string(x));
      if (at_pos && !(in[2] == TensorType{DType::i64, {Dim::constant(1)}}))
        return err("position {} must be i64[1]", to_string(in[2]));
      if (dim_max(m, x.shape[0]) > dim_max(m, cache.shape[1]) || dim_max(m, cache.shape[1]) < 1)
        return err("x {} has up to {} rows, more than the cache {} has slots", to_string(x),
                   dim_max(m, x.shape[0]), to_string(cache));
      if (!at_pos && dim_max(m, x.shape[1]) > dim_max(m, cache.shape[0]))
        return err("x {} has up to {} positions, more than the cache {} holds", to_string(x),
                   dim_max(m, x.shape[1]), to_string(cache));
      return ok(cache);
    }
    case OpKind::cache_attention:
    case OpKind::memory_attention: {
      // cache_attention(q f32[N,1,H*Dk], k f32[T,C,H*Dk], v f32[T,C,H*Dv], rows i64[N,P]
      //                 [, bias f32[N',H',1,P]])
      // memory_attention(q f32[N,1,H*Dk], k f32[B,S,H*Dk], v f32[B,S,H*Dv], src_row i64[N],
      //                  key_pad bool[B,S])
      const bool cache = kind == OpKind::cache_attention;
      const int64_t heads = int_at(attrs, "heads");
      const TensorType &q = in[0], &k = in[1], &v = in[2];
      // Key/value heads: kv_heads (cache_attention's grouped-query form) or heads.
      const int64_t groups = attrs.count("kv_heads") ? int_at(attrs, "kv_heads") : heads;
      if (heads % groups != 0)
        return err("kv_heads = {} does not divide heads = {}", groups, heads);
      for (const TensorType* t : {&q, &k, &v})
        if (t->dtype != DType::f32 || t->rank() != 3)
          return err("q, k, v must be f32 of rank 3, got {}", type_list(in));
      for (const TensorType* t : {&q, &k, &v})
        if (t->shape[2].is_symbolic() || t->shape[2].value % (t == &q ? heads : groups) != 0)
          return err("feature size of {} is not divisible by {} heads", to_string(*t),
                     t == &q ? heads : groups);
      if (!q.shape[1].is_const(1) || !(k.shape[0] == v.shape[0]) || !(k.shape[1] == v.shape[1]) ||
          q.shape[2].value / heads != k.shape[2].value / groups)
        return err("q {}, k {}, v {} do not agree", to_string(q), to_string(k), to_string(v));
      const TensorType& rows = in[3];
      if (cache) {
        if (rows.dtype != DType::i64 || rows.rank() != 2 || !(rows.shape[0] == q.shape[0]))
          return err("row table {} must be i64[{},P]", to_string(rows), to_string(q.shape[0]));
        if (dim_max(m, rows.shape[1]) > dim_max(m, k.shape[0]))
          return err("row table {} reaches up to {} positions, more than the cache {} holds",
                     to_string(rows), dim_max(m, rows.shape[1]), to_string(k));
        if (in.size() == 5) {
          // Score bias f32 [N',H',1,P]: N' and H' 1 or the scores' N and heads.
          const TensorType& b = in[4];
          if (b.dtype != DType::f32 || b.rank() != 4 ||
              !(b.shape[0].is_const(1) || b.shape[0] == q.shape[0]) ||
              !(b.shape[1].is_const(1) || b.shape[1].is_const(heads)) || !b.shape[2].is_const(1) ||
              !(b.shape[3] == rows.shape[1]))
            return err("score bias {} must be f32[1 or {}, 1 or {}, 1, {}] (the row table's width)",
                       to_string(b), to_string(q.shape[0]), heads, to_string(rows.shape[1]));
        }
      } else {
        if (!(rows == TensorType{DType::i64, {q.shape[0]}}))
          return err("source rows {} must be i64[{}]", to_string(rows), to_string(q.shape[0]));
        TensorType want{DType::boolean, {k.shape[0], k.shape[1]}};
        if (!(in[4] == want))
          return err("key padding mask {} must be {}", to_string(in[4]), to_string(want));
      }
      return ok(TensorType{
          DType::f32, {q.shape[0], q.shape[1], Dim::constant(v.shape[2].value / groups * heads)}});
    }
    default:
      break;
  }
#undef KILN_CHECK
  return err("has no type rule");
}

}  // namespace kiln::ir
