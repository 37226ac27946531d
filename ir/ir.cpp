// Basic operations on the IR data structures: names, lookups, builders.
#include "ir/ir.h"

#include <fmt/format.h>

#include "support/error.h"

namespace kiln::ir {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::boolean:
      return "bool";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "f32") return DType::f32;
  if (s == "i32") return DType::i32;
  if (s == "i64") return DType::i64;
  if (s == "bool") return DType::boolean;
  return std::nullopt;
}

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::boolean:
      return 1;
  }
  return 0;
}

std::string to_string(const Dim& dim) {
  if (!dim.is_symbolic()) return std::to_string(dim.value);
  std::string out = dim.scale == 1 ? dim.symbol : fmt::format("{}*{}", dim.scale, dim.symbol);
  if (dim.value > 0) out += fmt::format("+{}", dim.value);
  if (dim.value < 0) out += fmt::format("{}", dim.value);
  return out;
}

std::optional<Dim> add_dims(const Dim& a, const Dim& b, std::string* why) {
  int64_t scale = 0, offset = 0;
  const bool overflow =
      __builtin_add_overflow(a.value, b.value, &offset) ||
      __builtin_add_overflow(a.is_symbolic() ? a.scale : 0, b.is_symbolic() ? b.scale : 0, &scale);
  if (a.is_symbolic() && b.is_symbolic() && a.symbol != b.symbol) {
    if (why)
      *why = fmt::format("the sum of dims {} and {}: sums of different symbols are not supported",
                         to_string(a), to_string(b));
    return std::nullopt;
  }
  if (overflow) {
    if (why) *why = fmt::format("the sum of dims {} and {} overflows", to_string(a), to_string(b));
    return std::nullopt;
  }
  return Dim::affine(a.is_symbolic() ? a.symbol : b.symbol, scale, offset);
}

std::optional<Dim> sub_dims(const Dim& a, const Dim& b, std::string* why) {
  if (b.is_symbolic() && (!a.is_symbolic() || a.symbol != b.symbol || a.scale < b.scale)) {
    if (why)
      *why = fmt::format(
          "the difference of dims {} and {} is not a dim of one symbol with a "
          "positive scale",
          to_string(a), to_string(b));
    return std::nullopt;
  }
  int64_t scale = 0, offset = 0;
  if (__builtin_sub_overflow(a.value, b.value, &offset) ||
      __builtin_sub_overflow(a.is_symbolic() ? a.scale : 0, b.is_symbolic() ? b.scale : 0,
                             &scale)) {
    if (why)
      *why = fmt::format("the difference of dims {} and {} overflows", to_string(a), to_string(b));
    return std::nullopt;
  }
  return Dim::affine(a.symbol, scale, offset);
}

std::optional<Dim> mul_dims(const Dim& a, const Dim& b, std::string* why) {
  if (a.is_symbolic() && b.is_symbolic()) {
    if (why)
      *why = fmt::format(
          "the product of dims {} and {}: a dim is an affine function of one symbol, and "
          "products of symbolic dims are not supported",
          to_string(a), to_string(b));
    return std::nullopt;
  }
  const Dim& s = a.is_symbolic() ? a : b;
  const int64_t c = a.is_symbolic() ? b.value : a.value;
  if (!s.is_symbolic()) {
    int64_t v = 0;
    if (!__builtin_mul_overflow(a.value, b.value, &v)) return Dim::constant(v);
  } else if (c < 0) {
    if (why)
      *why = fmt::format("the product of dims {} and {} has a negative scale", to_string(a),
                         to_string(b));
    return std::nullopt;
  } else {
    int64_t scale = 0, offset = 0;
    if (!__builtin_mul_overflow(s.scale, c, &scale) && !__builtin_mul_overflow(s.value, c, &offset))
      return Dim::affine(s.symbol, scale, offset);
  }
  if (why)
    *why = fmt::format("the product of dims {} and {} overflows", to_string(a), to_string(b));
  return std::nullopt;
}

std::string to_string(const TensorType& type) {
  std::string out = dtype_name(type.dtype);
  out += '[';
  for (size_t i = 0; i < type.shape.size(); ++i) {
    if (i) out += ',';
    out += to_string(type.shape[i]);
  }
  out += ']';
  return out;
}

std::string line_prefix(const Loc& loc) {
  return loc.line > 0 ? fmt::format("line {}: ", loc.line) : std::string();
}

int64_t Op::int_attr(const std::string& key) const {
  auto it = attrs.find(key);
  KILN_ASSERT(it != attrs.end(), fmt::format("{} has no attribute '{}'", op_name(kind), key));
  const int64_t* v = std::get_if<int64_t>(&it->second);
  KILN_ASSERT(v, fmt::format("{} attribute '{}' is not an integer", op_name(kind), key));
  return *v;
}

double Op::float_attr(const std::string& key) const {
  auto it = attrs.find(key);
  KILN_ASSERT(it != attrs.end(), fmt::format("{} has no attribute '{}'", op_name(kind), key));
  if (const int64_t* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  const double* v = std::get_if<double>(&it->second);
  KILN_ASSERT(v, fmt::format("{} attribute '{}' is not a number", op_name(kind), key));
  return *v;
}

const std::string& Op::str_attr(const std::string& key) const {
  auto it = attrs.find(key);
  KILN_ASSERT(it != attrs.end(), fmt::format("{} has no attribute '{}'", op_name(kind), key));
  const std::string* v = std::get_if<std::string>(&it->second);
  KILN_ASSERT(v, fmt::format("{} attribute '{}' is not a string", op_name(kind), key));
  return *v;
}

const std::vector<int64_t>& Op::ints_attr(const std::string& key) const {
  auto it = attrs.find(key);
  KILN_ASSERT(it != attrs.end(), fmt::format("{} has no attribute '{}'", op_name(kind), key));
  const auto* v = std::get_if<std::vector<int64_t>>(&it->second);
  KILN_ASSERT(v, fmt::format("{} attribute '{}' is not an integer list", op_name(kind), key));
  return *v;
}

ValueId Function::add_value(TensorType type, std::string name) {
  values.push_back(Value{std::move(name), std::move(type)});
  return static_cast<ValueId>(values.size() - 1);
}

ValueId Function::add_param(std::string name, TensorType type) {
  ValueId id = add_value(std::move(type), std::move(name));
  params.push_back(id);
  return id;
}

ValueId Function::add_op(OpKind kind, std::vector<ValueId> operands, TensorType type, Attrs attrs,
                         Loc loc) {
  ValueId id = add_value(std::move(type));
  ops.push_back(Op{kind, id, std::move(operands), std::move(attrs)});
  ops.back().loc = loc;
  return id;
}

int32_t Module::intern_source(std::string_view text) {
  for (size_t i = sources.size(); i-- > 0;)  // the latest first: ops come in runs
    if (sources[i] == text) return static_cast<int32_t>(i);
  sources.emplace_back(text);
  return static_cast<int32_t>(sources.size() - 1);
}

std::string Module::source_text(const SourceLoc& src) const {
  const auto in_range = [&](int32_t i) {
    return i >= 0 && static_cast<size_t>(i) < sources.size();
  };
  if (!in_range(src.file)) return {};
  std::string out = sources[src.file] + ":" + std::to_string(src.line);
  if (in_range(src.scope)) out += " (" + sources[src.scope] + ")";
  return out;
}

int Function::defining_op(ValueId id) const {
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].result == id) return static_cast<int>(i);
  return -1;
}

const Symbol* Module::find_symbol(std::string_view name) const {
  for (const auto& s : symbols)
    if (s.name == name) return &s;
  return nullptr;
}

const Weight* Module::find_weight(std::string_view name) const {
  for (const auto& w : weights)
    if (w.name == name) return &w;
  return nullptr;
}

Function* Module::find_function(std::string_view name) {
  for (auto& f : functions)
    if (f.name == name) return &f;
  return nullptr;
}

const Function* Module::find_function(std::string_view name) const {
  for (const auto& f : functions)
    if (f.name == name) return &f;
  return nullptr;
}

void Module::declare_weight(const std::string& name, const TensorType& type) {
  if (const Weight* w = find_weight(name)) {
    if (!(w->type == type))
      fail("weight '{}' declared as {} and again as {}", name, to_string(w->type), to_string(type));
    return;
  }
  weights.push_back(Weight{name, type, std::nullopt});
}

int64_t static_numel(const TensorType& type) {
  int64_t n = 1;
  for (const auto& d : type.shape) {
    KILN_ASSERT(!d.is_symbolic(), "static_numel of a symbolic shape");
    n *= d.value;
  }
  return n;
}

int64_t max_numel(const Module& module, const TensorType& type) {
  int64_t n = 1;
  for (const auto& d : type.shape) {
    KILN_ASSERT(!d.is_symbolic() || module.find_symbol(d.symbol), "unknown symbol " + d.symbol);
    n *= dim_max(module, d);
  }
  return n;
}

int64_t dim_max(const Module& module, const Dim& dim) {
  if (!dim.is_symbolic()) return dim.value;
  const Symbol* s = module.find_symbol(dim.symbol);
  if (!s) return 0;
  int64_t v = 0;  // saturated: the verifier (V7) refuses a dim whose maximum overflows
  if (__builtin_mul_overflow(dim.scale, s->max, &v) || __builtin_add_overflow(v, dim.value, &v))
    return INT64_MAX;
  return v;
}

}  // namespace kiln::ir
