// Type rules of every op (see op_types.h).
#include "ir/op_types.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace kiln::ir {
namespace {

TypeResult ok(TensorType t) { return TypeResult{std::move(t), {}}; }

template <typename... Args>
TypeResult err(fmt::format_string<Args...> format, Args&&... args) {
  return TypeResult{{}, fmt::format(format, std::forward<Args>(args)...)};
}

const AttrValue* find_attr(const Attrs& attrs, const char* key) {
  auto it = attrs.find(key);
  return it == attrs.end() ? nullptr : &it->second;
}

bool get_int(const Attrs& attrs, const char* key, int64_t* out) {
  const AttrValue* v = find_attr(attrs, key);
  if (!v) return false;
  if (const int64_t* i = std::get_if<int64_t>(v)) {
    *out = *i;
    return true;
  }
  return false;
}

bool get_number(const Attrs& attrs, const char* key, double* out) {
  const AttrValue* v = find_attr(attrs, key);
  if (!v) return false;
  if (const int64_t* i = std::get_if<int64_t>(v)) {
    *out = static_cast<double>(*i);
    return true;
  }
  if (const double* d = std::get_if<double>(v)) {
    *out = *d;
    return true;
  }
  return false;
}

bool get_ints(const Attrs& attrs, const char* key, std::vector<int64_t>* out) {
  const AttrValue* v = find_attr(attrs, key);
  if (!v) return false;
  if (const auto* l = std::get_if<std::vector<int64_t>>(v)) {
    *out = *l;
    return true;
  }
  return false;
}

bool get_string(const Attrs& attrs, const char* key, std::string* out) {
  const AttrValue* v = find_attr(attrs, key);
  if (!v) return false;
  if (const auto* s = std::get_if<std::string>(v)) {
    *out = *s;
    return true;
  }
  return false;
}

// Checks that exactly the allowed attribute keys are present.
std::string check_attr_keys(const Attrs& attrs, std::initializer_list<const char*> allowed) {
  for (const auto& [key, value] : attrs) {
    bool found = false;
    for (const char* a : allowed) found |= key == a;
    if (!found) return fmt::format("unexpected attribute '{}'", key);
  }
  return {};
}

// Products of constant dims and sorted symbol lists: equal iff element counts are
// equal for every binding of the symbols.
bool same_numel(const std::vector<Dim>& a, const std::vector<Dim>& b) {
  auto summarize = [](const std::vector<Dim>& s, int64_t* c, std::vector<std::string>* syms) {
    *c = 1;
    for (const auto& d : s) {
      if (d.is_symbolic())
        syms->push_back(d.symbol);
      else if (__builtin_mul_overflow(*c, d.value, c))
        *c = -1;  // overflowed: never equal to a valid count
    }
    std::sort(syms->begin(), syms->end());
  };
  int64_t ca, cb;
  std::vector<std::string> sa, sb;
  summarize(a, &ca, &sa);
  summarize(b, &cb, &sb);
  return ca == cb && sa == sb;
}

// The largest value a dim can take.
int64_t dim_max(const Module& m, const Dim& d) {
  if (!d.is_symbolic()) return d.value;
  const Symbol* s = m.find_symbol(d.symbol);
  return s ? s->max : 0;
}

std::string type_list(const std::vector<TensorType>& ts) {
  std::string out;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i) out += ", ";
    out += to_string(ts[i]);
  }
  return out;
}

}  // namespace

std::string shape_string(const std::vector<Dim>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ',';
    out += to_string(shape[i]);
  }
  return out + "]";
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

bool needs_declared_type(OpKind kind) {
  switch (kind) {
    case OpKind::weight:
    case OpKind::constant:
    case OpKind::sinusoid_table:
    case OpKind::iota:
    case OpKind::cast:
    case OpKind::reshape:
    case OpKind::slice:
      return true;
    default:
      return false;
  }
}

TypeResult infer_type(const Module& m, OpKind kind, const std::vector<TensorType>& in,
                      const Attrs& attrs, const TensorType* declared) {
  const size_t n = in.size();
  auto want_operands = [&](size_t lo, size_t hi) -> std::string {
    if (n < lo || n > hi) {
      if (lo == hi) return fmt::format("expects {} operand(s), got {}", lo, n);
      return fmt::format("expects {} to {} operands, got {}", lo, hi, n);
    }
    return {};
  };
  if (needs_declared_type(kind) && !declared) return err("needs a declared result type");

#define KILN_CHECK(expr)                   \
  do {                                     \
    std::string e_ = (expr);               \
    if (!e_.empty()) return err("{}", e_); \
  } while (0)

  switch (kind) {
    case OpKind::weight: {
      KILN_CHECK(want_operands(0, 0));
      KILN_CHECK(check_attr_keys(attrs, {"name"}));
      std::string name;
      if (!get_string(attrs, "name", &name)) return err("needs a string attribute 'name'");
      const Weight* w = m.find_weight(name);
      if (!w) return err("refers to undeclared weight '{}'", name);
      if (!(w->type == *declared))
        return err("weight '{}' is declared as {}, used as {}", name, to_string(w->type),
                   to_string(*declared));
      return ok(*declared);
    }
    case OpKind::constant: {
      KILN_CHECK(want_operands(0, 0));
      KILN_CHECK(check_attr_keys(attrs, {"value"}));
      double v;
      if (!get_number(attrs, "value", &v)) return err("needs a numeric attribute 'value'");
      if (is_integer(declared->dtype) && std::holds_alternative<double>(attrs.at("value")))
        return err("integer constant has a non-integer value");
      return ok(*declared);
    }
    case OpKind::sinusoid_table: {
      KILN_CHECK(want_operands(0, 0));
      KILN_CHECK(check_attr_keys(attrs, {}));
      // The row count may be symbolic (canonicalize folds a slice of the rows used
      // into the table); the feature dim must be constant.
      if (declared->dtype != DType::f32 || declared->rank() != 2 ||
          declared->shape[1].is_symbolic())
        return err("result must be f32[rows,dim] with a constant dim, got {}",
                   to_string(*declared));
      return ok(*declared);
    }
    case OpKind::iota: {
      KILN_CHECK(want_operands(0, 0));
      KILN_CHECK(check_attr_keys(attrs, {"axis"}));
      int64_t axis;
      if (!get_int(attrs, "axis", &axis)) return err("needs an integer attribute 'axis'");
      if (!is_integer(declared->dtype)) return err("result must be an integer type");
      if (normalize_axis(axis, declared->rank()) < 0)
        return err("axis {} out of range for rank {}", axis, declared->rank());
      return ok(*declared);
    }
    case OpKind::cast: {
      KILN_CHECK(want_operands(1, 1));
      KILN_CHECK(check_attr_keys(attrs, {}));
      if (in[0].shape != declared->shape)
        return err("result shape {} differs from operand shape {}", shape_string(declared->shape),
                   shape_string(in[0].shape));
      return ok(*declared);
    }
    case OpKind::reshape: {
      KILN_CHECK(want_operands(1, 1));
      KILN_CHECK(check_attr_keys(attrs, {}));
      if (declared->dtype != in[0].dtype) return err("reshape cannot change the dtype");
      if (!same_numel(in[0].shape, declared->shape))
        return err("cannot reshape {} to {}: element counts differ", shape_string(in[0].shape),
                   shape_string(declared->shape));
      return ok(*declared);
    }
    case OpKind::slice: {
      KILN_CHECK(want_operands(1, 1));
      KILN_CHECK(check_attr_keys(attrs, {"axis", "start"}));
      int64_t axis, start;
      if (!get_int(attrs, "axis", &axis) || !get_int(attrs, "start", &start))
        return err("needs integer attributes 'axis' and 'start'");
      int64_t a = normalize_axis(axis, in[0].rank());
      if (a < 0) return err("axis {} out of range for rank {}", axis, in[0].rank());
      if (declared->dtype != in[0].dtype || declared->rank() != in[0].rank())
        return err("result {} must have the operand's dtype and rank ({})", to_string(*declared),
                   to_string(in[0]));
      for (int64_t i = 0; i < in[0].rank(); ++i)
        if (i != a && !(declared->shape[i] == in[0].shape[i]))
          return err("result {} differs from operand {} outside axis {}", to_string(*declared),
                     to_string(in[0]), a);
      if (start < 0) return err("negative start {}", start);
      const Dim& src = in[0].shape[a];
      const Dim& dst = declared->shape[a];
      int64_t end = 0;
      if (!(start == 0 && src == dst) &&
          (__builtin_add_overflow(start, dim_max(m, dst), &end) || end > dim_max(m, src)))
        return err("slice [{}, {}+{}) exceeds extent {} of axis {}", start, start, to_string(dst),
                   to_string(src), a);
      return ok(*declared);
    }
    default:
      break;
  }

  if (is_binary_elementwise(kind)) {
    KILN_CHECK(want_operands(2, 2));
    KILN_CHECK(check_attr_keys(attrs, {}));
    if (in[0].dtype != in[1].dtype)
      return err("operand dtypes differ: {} and {}", dtype_name(in[0].dtype),
                 dtype_name(in[1].dtype));
    DType d = in[0].dtype;
    if (kind == OpKind::logical_and || kind == OpKind::logical_or) {
      if (d != DType::boolean) return err("operands must be bool, got {}", dtype_name(d));
    } else if (!is_comparison(kind) && d == DType::boolean) {
      return err("arithmetic on bool operands");
    }
    return broadcast_types(in[0], in[1], is_comparison(kind) ? DType::boolean : d);
  }

  switch (kind) {
    case OpKind::relu:
    case OpKind::neg:
    case OpKind::exp:
    case OpKind::sqrt:
    case OpKind::logical_not: {
      KILN_CHECK(want_operands(1, 1));
      KILN_CHECK(check_attr_keys(attrs, {}));
      if (kind == OpKind::logical_not) {
        if (in[0].dtype != DType::boolean) return err("operand must be bool");
      } else if (kind == OpKind::exp || kind == OpKind::sqrt) {
        if (in[0].dtype != DType::f32) return err("operand must be f32");
      } else if (in[0].dtype == DType::boolean) {
        return err("operand must not be bool");
      }
      return ok(in[0]);
    }
    case OpKind::select: {
      KILN_CHECK(want_operands(3, 3));
      KILN_CHECK(check_attr_keys(attrs, {}));
      if (in[0].dtype != DType::boolean) return err("condition must be bool");
      if (in[1].dtype != in[2].dtype)
        return err("branch dtypes differ: {} and {}", dtype_name(in[1].dtype),
                   dtype_name(in[2].dtype));
      TypeResult ab = broadcast_types(in[1], in[2], in[1].dtype);
      if (!ab.ok()) return ab;
      return broadcast_types(in[0], ab.type, in[1].dtype);
    }
    case OpKind::gather: {
      KILN_CHECK(want_operands(2, 2));
      KILN_CHECK(check_attr_keys(attrs, {}));
      if (in[0].rank() < 1) return err("table must have rank >= 1");
      if (!is_integer(in[1].dtype))
        return err("indices must be integers, got {}", dtype_name(in[1].dtype));
      TensorType t{in[0].dtype, in[1].shape};
      t.shape.insert(t.shape.end(), in[0].shape.begin() + 1, in[0].shape.end());
      return ok(t);
    }
    case OpKind::transpose: {
      KILN_CHECK(want_operands(1, 1));
      KILN_CHECK(check_attr_keys(attrs, {"perm"}));
      std::vector<int64_t> perm;
      if (!get_ints(attrs, "perm", &perm)) return err("needs an integer list attribute 'perm'");
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
      if (n < 1) return err("expects at least 1 operand");
      KILN_CHECK(check_attr_keys(attrs, {"axis"}));
      int64_t axis;
      if (!get_int(attrs, "axis", &axis)) return err("needs an integer attribute 'axis'");
      int64_t a = normalize_axis(axis, in[0].rank());
      if (a < 0) return err("axis {} out of range for rank {}", axis, in[0].rank());
      TensorType t = in[0];
      int64_t total = 0;
      std::string sym;
      for (const auto& ti : in) {
        if (ti.dtype != t.dtype || ti.rank() != t.rank())
          return err("operands {} differ in dtype or rank", type_list(in));
        for (int64_t i = 0; i < t.rank(); ++i)
          if (i != a && !(ti.shape[i] == t.shape[i]))
            return err("operands {} differ outside axis {}", type_list(in), a);
        if (ti.shape[a].is_symbolic()) {
          if (n != 1) return err("concat along a symbolic axis is not supported");
          sym = ti.shape[a].symbol;
        }
        if (__builtin_add_overflow(total, ti.shape[a].value, &total))
          return err("concatenated extent overflows");
      }
      t.shape[a] = sym.empty() ? Dim::constant(total) : Dim::sym(sym);
      return ok(t);
    }
    case OpKind::matmul: {
      KILN_CHECK(want_operands(2, 2));
      KILN_CHECK(check_attr_keys(attrs, {}));
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
      KILN_CHECK(want_operands(1, 1));
      KILN_CHECK(check_attr_keys(attrs, {"axis"}));
      int64_t axis;
      if (!get_int(attrs, "axis", &axis)) return err("needs an integer attribute 'axis'");
      if (normalize_axis(axis, in[0].rank()) < 0)
        return err("axis {} out of range for rank {}", axis, in[0].rank());
      if (in[0].dtype != DType::f32) return err("operand must be f32");
      return ok(in[0]);
    }
    case OpKind::layernorm:
    case OpKind::add_layernorm: {
      const bool fused = kind == OpKind::add_layernorm;
      KILN_CHECK(want_operands(fused ? 4 : 3, fused ? 4 : 3));
      KILN_CHECK(check_attr_keys(attrs, {"eps"}));
      double eps;
      if (!get_number(attrs, "eps", &eps) || !(eps > 0)) return err("needs a positive 'eps'");
      const TensorType& x = in[0];
      if (fused && !(in[1] == x))
        return err("addends differ: {} and {}", to_string(x), to_string(in[1]));
      if (x.dtype != DType::f32 || x.rank() < 1) return err("input must be f32 of rank >= 1");
      const TensorType& g = in[fused ? 2 : 1];
      const TensorType& bta = in[fused ? 3 : 2];
      TensorType want{DType::f32, {x.shape.back()}};
      if (!(g == want) || !(bta == want))
        return err("gamma {} and beta {} must be {}", to_string(g), to_string(bta),
                   to_string(want));
      return ok(x);
    }
    case OpKind::reduce_sum:
    case OpKind::reduce_max:
    case OpKind::reduce_mean: {
      KILN_CHECK(want_operands(1, 1));
      KILN_CHECK(check_attr_keys(attrs, {"axes", "keepdims"}));
      std::vector<int64_t> axes;
      int64_t keep = 0;
      if (!get_ints(attrs, "axes", &axes)) return err("needs an integer list attribute 'axes'");
      get_int(attrs, "keepdims", &keep);
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
    case OpKind::argmax: {
      KILN_CHECK(want_operands(1, 1));
      KILN_CHECK(check_attr_keys(attrs, {"axis"}));
      int64_t axis;
      if (!get_int(attrs, "axis", &axis)) return err("needs an integer attribute 'axis'");
      int64_t a = normalize_axis(axis, in[0].rank());
      if (a < 0) return err("axis {} out of range for rank {}", axis, in[0].rank());
      TensorType t{DType::i64, in[0].shape};
      t.shape.erase(t.shape.begin() + a);
      return ok(t);
    }
    case OpKind::linear: {
      KILN_CHECK(want_operands(2, 3));
      KILN_CHECK(check_attr_keys(attrs, {"act"}));
      std::string act;
      if (!get_string(attrs, "act", &act) || (act != "none" && act != "relu"))
        return err("needs attribute act = \"none\" or \"relu\"");
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
    case OpKind::attention: {
      // attention(q[B,Lq,H*Dk], k[B,Lk,H*Dk], v[B,Lk,H*Dv] [, key_pad bool[B,Lk]])
      //   {heads, scale, causal}
      KILN_CHECK(want_operands(3, 4));
      KILN_CHECK(check_attr_keys(attrs, {"heads", "scale", "causal"}));
      int64_t heads, causal = 0;
      double scale;
      if (!get_int(attrs, "heads", &heads) || heads < 1) return err("needs 'heads' >= 1");
      if (!get_number(attrs, "scale", &scale)) return err("needs a numeric 'scale'");
      if (get_int(attrs, "causal", &causal) && causal != 0 && causal != 1)
        return err("'causal' must be 0 or 1");
      const TensorType &q = in[0], &k = in[1], &v = in[2];
      for (const TensorType* t : {&q, &k, &v})
        if (t->dtype != DType::f32 || t->rank() != 3)
          return err("q, k, v must be f32 of rank 3, got {}", type_list(in));
      if (!(q.shape[0] == k.shape[0]) || !(k.shape[0] == v.shape[0]) ||
          !(k.shape[1] == v.shape[1]) || !(q.shape[2] == k.shape[2]))
        return err("q {}, k {}, v {} do not agree", to_string(q), to_string(k), to_string(v));
      for (const TensorType* t : {&q, &v})
        if (t->shape[2].is_symbolic() || t->shape[2].value % heads != 0)
          return err("feature size of {} is not divisible by {} heads", to_string(*t), heads);
      if (n == 4) {
        TensorType want{DType::boolean, {k.shape[0], k.shape[1]}};
        if (!(in[3] == want))
          return err("key padding mask {} must be {}", to_string(in[3]), to_string(want));
      }
      return ok(TensorType{DType::f32, {q.shape[0], q.shape[1], v.shape[2]}});
    }
    default:
      break;
  }
#undef KILN_CHECK
  return err("has no type rule");
}

}  // namespace kiln::ir
