// ONNX -> kiln IR. See import/onnx_import.h.
#include "import/onnx_import.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_map>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <google/protobuf/io/coded_stream.h>
#include <onnx/onnx_pb.h>

#include "ir/op_types.h"
#include "ir/verifier.h"
#include "support/error.h"
#include "support/read_file.h"

namespace kiln::importer {
namespace {

using ir::Dim;
using ir::DType;
using ir::OpKind;
using ir::TensorType;
using ir::ValueId;

constexpr int64_t kMinOpset = 13, kMaxOpset = 17;
constexpr int64_t kMaxElements = int64_t{1} << 32;  // per tensor: larger is refused
constexpr int64_t kMaxRank = 8;
// Integer constants of rank <= 1 up to this many elements are lists of sizes (shape
// arithmetic); larger ones stay tensors. Also the largest constant folded at import time.
constexpr size_t kMaxSizesList = 4096;

// ---------------------------------------------------------------------------------------
// Sizes: coef * (product of symbols) + offset; the offset only with at most one symbol.
// Shape arithmetic (Shape -> Gather -> Mul -> Concat -> Reshape) is evaluated on these.
struct SDim {
  int64_t coef = 0;
  std::vector<std::string> syms;  // sorted; empty: the constant `offset`
  int64_t offset = 0;

  static SDim constant(int64_t v) { return SDim{0, {}, v}; }
  bool is_const() const { return syms.empty(); }
  bool operator==(const SDim&) const = default;
};

// Integers travel as doubles (exact below 2^53); the INT64 extremes that exports use for
// "to the end" saturate instead of overflowing.
int64_t to_i64(double d) {
  if (!(d == d)) return 0;
  if (d >= 9.2e18) return std::numeric_limits<int64_t>::max();
  if (d <= -9.2e18) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(d);
}

std::string sdim_text(const SDim& d) {
  if (d.is_const()) return std::to_string(d.offset);
  std::string s = d.coef == 1 ? "" : fmt::format("{}*", d.coef);
  s += fmt::format("{}", fmt::join(d.syms, "*"));
  if (d.offset > 0) s += fmt::format("+{}", d.offset);
  if (d.offset < 0) s += fmt::format("{}", d.offset);
  return s;
}

std::string sdims_text(const std::vector<SDim>& v) {
  std::vector<std::string> parts;
  for (const SDim& d : v) parts.push_back(sdim_text(d));
  return fmt::format("[{}]", fmt::join(parts, ","));
}

SDim from_dim(const Dim& d) {
  if (!d.is_symbolic()) return SDim::constant(d.value);
  return SDim{d.scale, {d.symbol}, d.value};
}

std::optional<Dim> to_dim(const SDim& d) {
  if (d.is_const())
    return d.offset >= 0 ? std::optional<Dim>(Dim::constant(d.offset)) : std::nullopt;
  if (d.syms.size() != 1 || d.coef < 1) return std::nullopt;
  return Dim::affine(d.syms[0], d.coef, d.offset);
}

// Checked int64 arithmetic: sizes that overflow are no sizes (a hostile or broken file).
std::optional<int64_t> add64(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
std::optional<int64_t> mul64(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Symbol products are capped: no model multiplies more than a few sizes.
constexpr size_t kMaxSymbolsInSize = 4;

std::optional<SDim> sdim_add(const SDim& a, const SDim& b) {
  const std::optional<int64_t> off = add64(a.offset, b.offset);
  if (!off) return std::nullopt;
  if (a.is_const() && b.is_const()) return SDim::constant(*off);
  if (b.is_const() && a.syms.size() == 1) return SDim{a.coef, a.syms, *off};
  if (a.is_const() && b.syms.size() == 1) return SDim{b.coef, b.syms, *off};
  if (a.syms != b.syms || !(a.syms.size() == 1 || (a.offset == 0 && b.offset == 0)))
    return std::nullopt;
  const std::optional<int64_t> coef = add64(a.coef, b.coef);
  if (!coef) return std::nullopt;
  if (*coef == 0) return SDim::constant(*off);
  return SDim{*coef, a.syms, *off};
}

std::optional<SDim> sdim_neg(const SDim& a) {
  const std::optional<int64_t> off = mul64(a.offset, -1), coef = mul64(a.coef, -1);
  if (!off || !coef) return std::nullopt;
  if (a.is_const()) return SDim::constant(*off);
  return SDim{*coef, a.syms, *off};
}

std::optional<SDim> sdim_mul(const SDim& a, const SDim& b) {
  if (a.is_const() && b.is_const()) {
    const std::optional<int64_t> v = mul64(a.offset, b.offset);
    if (!v) return std::nullopt;
    return SDim::constant(*v);
  }
  if (a.is_const() || b.is_const()) {
    const SDim& c = a.is_const() ? a : b;
    const SDim& s = a.is_const() ? b : a;
    if (c.offset == 0) return SDim::constant(0);
    const std::optional<int64_t> coef = mul64(s.coef, c.offset), off = mul64(s.offset, c.offset);
    if (!coef || !off) return std::nullopt;
    return SDim{*coef, s.syms, *off};
  }
  if (a.offset != 0 || b.offset != 0 || a.syms.size() + b.syms.size() > kMaxSymbolsInSize)
    return std::nullopt;
  const std::optional<int64_t> coef = mul64(a.coef, b.coef);
  if (!coef) return std::nullopt;
  SDim r{*coef, a.syms, 0};
  r.syms.insert(r.syms.end(), b.syms.begin(), b.syms.end());
  std::sort(r.syms.begin(), r.syms.end());
  return r;
}

// Exact division (sizes divide exactly where a model is right); integer division of
// constants truncates, as ONNX's integer Div does.
std::optional<SDim> sdim_div(const SDim& a, const SDim& b) {
  auto div = [](int64_t x, int64_t y) -> std::optional<int64_t> {
    if (y == 0 || (x == std::numeric_limits<int64_t>::min() && y == -1)) return std::nullopt;
    return x / y;
  };
  if (a.is_const() && b.is_const()) {
    const std::optional<int64_t> q = div(a.offset, b.offset);
    if (!q) return std::nullopt;
    return SDim::constant(*q);
  }
  if (b.is_const()) {
    const std::optional<int64_t> c = div(a.coef, b.offset), o = div(a.offset, b.offset);
    if (!c || !o || a.coef % b.offset != 0 || a.offset % b.offset != 0) return std::nullopt;
    return SDim{*c, a.syms, *o};
  }
  // a / b with b symbolic: a monomial divided by a monomial.
  const std::optional<int64_t> c = div(a.coef, b.coef);
  if (a.offset != 0 || b.offset != 0 || !c || a.coef % b.coef != 0) return std::nullopt;
  std::vector<std::string> rest = a.syms;
  for (const std::string& sym : b.syms) {
    auto it = std::find(rest.begin(), rest.end(), sym);
    if (it == rest.end()) return std::nullopt;
    rest.erase(it);
  }
  if (rest.empty()) return SDim::constant(*c);
  return SDim{*c, rest, 0};
}

// The number of elements of a shape as one SDim, when it is a monomial.
std::optional<SDim> sdim_product(const std::vector<SDim>& shape) {
  SDim p = SDim::constant(1);
  for (const SDim& d : shape) {
    std::optional<SDim> q = sdim_mul(p, d);
    if (!q) return std::nullopt;
    p = *q;
  }
  return p;
}

// ---------------------------------------------------------------------------------------
// What an ONNX value is during the import.
struct Val {
  enum Kind { kTensor, kConst, kSizes } kind = kTensor;
  DType dtype = DType::f32;
  // kTensor: the IR value, and the ONNX shape. They differ only where ONNX merges leading
  // dims into a product of symbols (see the header): then `shape[0]` is that product and
  // the IR value has the merged dims unflattened.
  ValueId id = -1;
  std::vector<SDim> shape;
  // kConst: a fully known tensor (floats, bools, or integers of rank >= 2).
  std::vector<int64_t> cshape;
  std::vector<double> data;
  std::string weight_name;  // an initializer's name (kept for the weights file)
  // kSizes: an integer tensor of rank 0 or 1 whose entries are sizes (maybe symbolic).
  std::vector<SDim> sizes;
  bool scalar = false;
};

struct ImportError {
  std::string message;
};

int64_t checked_numel(const std::vector<int64_t>& dims, const std::string& what) {
  if (static_cast<int64_t>(dims.size()) > kMaxRank)
    fail("{}: rank {} is more than kiln's {}", what, dims.size(), kMaxRank);
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) fail("{}: negative dim {}", what, d);
    if (d > 0 && n > kMaxElements / d)
      fail("{}: shape [{}] has more than 2^32 elements", what, fmt::join(dims, ","));
    n *= d;
  }
  return n;
}

std::optional<DType> onnx_dtype(int32_t t) {
  switch (t) {
    case onnx::TensorProto::FLOAT:
      return DType::f32;
    case onnx::TensorProto::FLOAT16:
      return DType::f32;  // widened
    case onnx::TensorProto::DOUBLE:
      return DType::f32;  // narrowed
    case onnx::TensorProto::INT64:
      return DType::i64;
    case onnx::TensorProto::INT32:
      return DType::i64;  // widened
    case onnx::TensorProto::BOOL:
      return DType::boolean;
    default:
      return std::nullopt;
  }
}

std::string onnx_dtype_name(int32_t t) {
  if (onnx::TensorProto::DataType_IsValid(t))
    return onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(t));
  return fmt::format("dtype {}", t);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(frac), -24);
  else if (exp == 31)
    v = frac ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    v = std::ldexp(static_cast<float>(frac | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

// `length` bytes at `offset` of an external data file, refused when the file is shorter.
std::string read_range(const std::string& path, int64_t offset, int64_t length,
                       const std::string& what) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail("{}: cannot open external data '{}': {}", what, path, ec.message());
  if (offset < 0 || length < 0 || static_cast<uint64_t>(offset) > size ||
      static_cast<uint64_t>(length) > size - static_cast<uint64_t>(offset))
    fail("{}: external data '{}' has {} bytes, not {} at offset {}", what, path, size, length,
         offset);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("{}: cannot open external data '{}': {}", what, path, std::strerror(errno));
  std::string out(static_cast<size_t>(length), '\0');
  bool ok = std::fseek(f, static_cast<long>(offset), SEEK_SET) == 0 &&
            std::fread(out.data(), 1, out.size(), f) == out.size();
  std::fclose(f);
  if (!ok) fail("{}: external data '{}' has no {} bytes at offset {}", what, path, length, offset);
  return out;
}

bool safe_relative_path(const std::string& p) {
  if (p.empty() || p[0] == '/') return false;
  for (const auto& part : std::filesystem::path(p))
    if (part == "..") return false;
  return true;
}

// A TensorProto's values as doubles (integers exactly up to 2^53; sizes are far smaller).
std::vector<double> tensor_values(const onnx::TensorProto& t, const std::string& what,
                                  const std::string& base_dir, std::vector<int64_t>* dims) {
  dims->assign(t.dims().begin(), t.dims().end());
  const int64_t n = checked_numel(*dims, what);
  const int32_t type = t.data_type();
  size_t esize = 0;
  switch (type) {
    case onnx::TensorProto::FLOAT:
    case onnx::TensorProto::INT32:
      esize = 4;
      break;
    case onnx::TensorProto::DOUBLE:
    case onnx::TensorProto::INT64:
      esize = 8;
      break;
    case onnx::TensorProto::FLOAT16:
      esize = 2;
      break;
    case onnx::TensorProto::BOOL:
      esize = 1;
      break;
    default:
      fail(
          "{}: data type {} is not supported (kiln reads FLOAT, FLOAT16, DOUBLE, INT64, "
          "INT32 and BOOL tensors)",
          what, onnx_dtype_name(type));
  }
  std::string external;
  const std::string* raw = nullptr;
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    std::string location;
    int64_t offset = 0, length = -1;
    for (const auto& e : t.external_data()) {
      if (e.key() == "location")
        location = e.value();
      else if (e.key() == "offset")
        offset = std::atoll(e.value().c_str());
      else if (e.key() == "length")
        length = std::atoll(e.value().c_str());
    }
    if (base_dir.empty()) fail("{}: external data is not available here", what);
    if (!safe_relative_path(location))
      fail("{}: external data location '{}' must be a relative path inside the model's folder",
           what, location);
    const std::string file = (std::filesystem::path(base_dir) / location).string();
    const int64_t want = length >= 0 ? length : n * static_cast<int64_t>(esize);
    if (offset < 0 || want != n * static_cast<int64_t>(esize))
      fail("{}: external data length {} does not hold {} elements of {}", what, want, n,
           onnx_dtype_name(type));
    external = read_range(file, offset, want, what);
    raw = &external;
  } else if (t.has_raw_data()) {
    raw = &t.raw_data();
  }
  if (raw && raw->size() != static_cast<size_t>(n) * esize)
    fail("{}: raw data has {} bytes, shape [{}] of {} needs {}", what, raw->size(),
         fmt::join(*dims, ","), onnx_dtype_name(type), static_cast<size_t>(n) * esize);
  if (!raw) {
    // The typed field's length, checked before anything of the shape's size is allocated.
    const int64_t have = type == onnx::TensorProto::FLOAT    ? t.float_data_size()
                         : type == onnx::TensorProto::DOUBLE ? t.double_data_size()
                         : type == onnx::TensorProto::INT64  ? t.int64_data_size()
                                                             : t.int32_data_size();
    if (have != n)
      fail("{}: the tensor holds {} values, shape [{}] needs {}", what, have, fmt::join(*dims, ","),
           n);
  }
  std::vector<double> v(static_cast<size_t>(n));
  if (raw) {
    const char* p = raw->data();
    for (int64_t i = 0; i < n; ++i, p += esize) {
      switch (type) {
        case onnx::TensorProto::FLOAT: {
          float f;
          std::memcpy(&f, p, 4);
          v[i] = f;
          break;
        }
        case onnx::TensorProto::DOUBLE: {
          double d;
          std::memcpy(&d, p, 8);
          v[i] = d;
          break;
        }
        case onnx::TensorProto::INT32: {
          int32_t x;
          std::memcpy(&x, p, 4);
          v[i] = x;
          break;
        }
        case onnx::TensorProto::INT64: {
          int64_t x;
          std::memcpy(&x, p, 8);
          v[i] = static_cast<double>(x);
          break;
        }
        case onnx::TensorProto::FLOAT16: {
          uint16_t h;
          std::memcpy(&h, p, 2);
          v[i] = half_to_float(h);
          break;
        }
        case onnx::TensorProto::BOOL:
          v[i] = *p != 0;
          break;
      }
    }
    return v;
  }
  auto take = [&](const auto& field, const char* name) {
    if (field.size() != n)
      fail("{}: {} has {} values, shape [{}] needs {}", what, name, field.size(),
           fmt::join(*dims, ","), n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(field.Get(static_cast<int>(i)));
  };
  switch (type) {
    case onnx::TensorProto::FLOAT:
      take(t.float_data(), "float_data");
      break;
    case onnx::TensorProto::DOUBLE:
      take(t.double_data(), "double_data");
      break;
    case onnx::TensorProto::INT64:
      take(t.int64_data(), "int64_data");
      break;
    case onnx::TensorProto::INT32:
    case onnx::TensorProto::BOOL:
      take(t.int32_data(), "int32_data");
      break;
    case onnx::TensorProto::FLOAT16: {
      if (t.int32_data().size() != n)
        fail("{}: int32_data has {} values, shape needs {}", what, t.int32_data().size(), n);
      for (int64_t i = 0; i < n; ++i)
        v[i] = half_to_float(static_cast<uint16_t>(t.int32_data(static_cast<int>(i))));
      break;
    }
  }
  return v;
}

std::string sanitize(const std::string& name, const char* fallback) {
  std::string s;
  for (char c : name) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) s = fallback + s;
  return s;
}

// ---------------------------------------------------------------------------------------
class Importer {
 public:
  Importer(const onnx::ModelProto& model, const std::string& label,
           const OnnxImportOptions& options, const std::string& base_dir)
      : model_(model), label_(label), options_(options), base_dir_(base_dir) {}

  OnnxImport run();

 private:
  // Node context for errors.
  [[noreturn]] void node_fail(const std::string& why) const {
    fail("{}: node '{}' ({}, opset {}): {}", label_, node_->name(), node_->op_type(), opset_, why);
  }
  template <typename... Args>
  [[noreturn]] void nfail(fmt::format_string<Args...> f, Args&&... args) const {
    node_fail(fmt::format(f, std::forward<Args>(args)...));
  }

  const Val& input(int i) const;
  bool has_input(int i) const { return i < node_->input_size() && !node_->input(i).empty(); }
  void set_output(int i, Val v);
  const onnx::AttributeProto* attr(const char* name) const;
  int64_t int_attr(const char* name, int64_t def) const;
  float float_attr(const char* name, float def) const;
  std::vector<int64_t> ints_attr(const char* name) const;

  // IR building.
  ir::Function& fn() { return module_.functions[0]; }
  TensorType ir_type(ValueId id) { return fn().type(id); }
  ValueId emit(OpKind kind, std::vector<ValueId> operands, ir::Attrs attrs = {},
               const TensorType* declared = nullptr);
  ValueId constant(double value, DType dtype, std::vector<Dim> shape = {});
  Val tensor_val(ValueId id);
  std::vector<Dim> dims_of(const std::vector<SDim>& s, const char* what);

  // Operands as IR tensors (constants and sizes materialized).
  ValueId as_tensor(const Val& v, const std::string& name);
  const std::vector<int64_t>& need_ints(const Val& v, const char* what,
                                        std::vector<int64_t>* store);
  std::vector<SDim> need_sizes(const Val& v, const char* what);
  double need_scalar(const Val& v, const char* what);

  void import_node();
  bool fold_node();  // all inputs known: evaluate; false when the op is not folded
  void tensor_node();

  void elementwise(OpKind kind);
  void compare(OpKind kind, bool swap = false);
  void matmul_node();
  void gemm_node();
  void reshape_node(const std::vector<SDim>& target);
  void slice_node();
  void gather_node();
  void trilu_node();

  // Merged values (see Val).
  bool merged(const Val& v) { return v.kind == Val::kTensor && !same_shape(v); }
  bool same_shape(const Val& v);

  const onnx::ModelProto& model_;
  std::string label_;
  OnnxImportOptions options_;
  std::string base_dir_;
  int64_t opset_ = 0;
  const onnx::NodeProto* node_ = nullptr;
  int node_index_ = 0;
  ir::Module module_;
  std::unordered_map<std::string, Val> vals_;
  std::unordered_map<std::string, const onnx::TensorProto*> initializers_;
  std::vector<rt::TensorData> weights_;
  std::set<std::string> weight_names_;
};

const onnx::AttributeProto* Importer::attr(const char* name) const {
  for (const auto& a : node_->attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t Importer::int_attr(const char* name, int64_t def) const {
  const auto* a = attr(name);
  if (!a) return def;
  if (a->type() != onnx::AttributeProto::INT) nfail("attribute '{}' must be an integer", name);
  return a->i();
}

float Importer::float_attr(const char* name, float def) const {
  const auto* a = attr(name);
  if (!a) return def;
  if (a->type() != onnx::AttributeProto::FLOAT) nfail("attribute '{}' must be a float", name);
  return a->f();
}

std::vector<int64_t> Importer::ints_attr(const char* name) const {
  const auto* a = attr(name);
  if (!a) return {};
  if (a->type() != onnx::AttributeProto::INTS)
    nfail("attribute '{}' must be a list of integers", name);
  return {a->ints().begin(), a->ints().end()};
}

const Val& Importer::input(int i) const {
  if (i >= node_->input_size() || node_->input(i).empty()) nfail("input {} is missing", i);
  auto it = vals_.find(node_->input(i));
  if (it == vals_.end())
    nfail("input '{}' is not defined before this node (the graph must be topologically sorted)",
          node_->input(i));
  return it->second;
}

void Importer::set_output(int i, Val v) {
  if (i >= node_->output_size() || node_->output(i).empty()) return;
  vals_[node_->output(i)] = std::move(v);
}

ValueId Importer::emit(OpKind kind, std::vector<ValueId> operands, ir::Attrs attrs,
                       const TensorType* declared) {
  std::vector<TensorType> types;
  for (ValueId id : operands) types.push_back(ir_type(id));
  ir::TypeResult r = ir::infer_type(module_, kind, types, attrs, declared);
  if (!r.ok()) {
    std::vector<std::string> ts;
    for (const TensorType& t : types) ts.push_back(ir::to_string(t));
    nfail("kiln's {} rejects operands ({}): {}", ir::op_name(kind), fmt::join(ts, ", "), r.error);
  }
  ValueId id = fn().add_op(kind, std::move(operands), r.type, std::move(attrs));
  ir::Op& op = fn().ops.back();
  op.src.file = module_.intern_source(label_);
  op.src.line = node_index_ + 1;
  if (!node_->name().empty()) op.src.scope = module_.intern_source(node_->name());
  return id;
}

ValueId Importer::constant(double value, DType dtype, std::vector<Dim> shape) {
  TensorType t{dtype, std::move(shape)};
  ir::AttrValue v;
  if (dtype == DType::f32)
    v = value;
  else
    v = static_cast<int64_t>(value);
  return emit(OpKind::constant, {}, {{"value", v}}, &t);
}

Val Importer::tensor_val(ValueId id) {
  Val v;
  v.kind = Val::kTensor;
  v.id = id;
  v.dtype = ir_type(id).dtype;
  for (const Dim& d : ir_type(id).shape) v.shape.push_back(from_dim(d));
  return v;
}

bool Importer::same_shape(const Val& v) {
  const TensorType t = ir_type(v.id);
  if (static_cast<size_t>(t.rank()) != v.shape.size()) return false;
  for (size_t i = 0; i < v.shape.size(); ++i)
    if (!(from_dim(t.shape[i]) == v.shape[i])) return false;
  return true;
}

std::vector<Dim> Importer::dims_of(const std::vector<SDim>& s, const char* what) {
  std::vector<Dim> out;
  for (const SDim& d : s) {
    std::optional<Dim> dim = to_dim(d);
    if (!dim)
      nfail(
          "{} {} has the size {}, which is no kiln dim (kiln dims are a constant or "
          "scale*symbol+offset of one symbol)",
          what, sdims_text(s), sdim_text(d));
    out.push_back(*dim);
  }
  return out;
}

const std::vector<int64_t>& Importer::need_ints(const Val& v, const char* what,
                                                std::vector<int64_t>* store) {
  store->clear();
  if (v.kind == Val::kSizes) {
    for (const SDim& d : v.sizes) {
      if (!d.is_const()) nfail("{} must be constant, got {}", what, sdims_text(v.sizes));
      store->push_back(d.offset);
    }
    return *store;
  }
  if (v.kind == Val::kConst && v.dtype != DType::f32) {
    for (double d : v.data) store->push_back(to_i64(d));
    return *store;
  }
  nfail("{} must be a constant integer tensor, not computed at run time", what);
}

std::vector<SDim> Importer::need_sizes(const Val& v, const char* what) {
  if (v.kind == Val::kSizes) return v.sizes;
  if (v.kind == Val::kConst && v.dtype != DType::f32 && v.cshape.size() <= 1) {
    if (v.data.size() > kMaxSizesList) nfail("{} has {} entries", what, v.data.size());
    std::vector<SDim> s;
    for (double d : v.data) s.push_back(SDim::constant(to_i64(d)));
    return s;
  }
  nfail(
      "{} must be computable at import time (constants and the inputs' sizes), but it is "
      "computed from tensor values at run time",
      what);
}

double Importer::need_scalar(const Val& v, const char* what) {
  if (v.kind == Val::kConst && v.data.size() == 1) return v.data[0];
  if (v.kind == Val::kSizes && v.sizes.size() == 1 && v.sizes[0].is_const())
    return static_cast<double>(v.sizes[0].offset);
  nfail("{} must be a constant scalar", what);
}

ValueId Importer::as_tensor(const Val& v, const std::string& name) {
  if (v.kind == Val::kTensor) return v.id;
  if (v.kind == Val::kSizes) {
    if (v.scalar) {
      if (!v.sizes[0].is_const())
        nfail(
            "input '{}' is a symbolic size ({}) used as a tensor value, which kiln cannot "
            "compute at run time",
            name, sdim_text(v.sizes[0]));
      return constant(static_cast<double>(v.sizes[0].offset), DType::i64);
    }
    bool splat =
        !v.sizes.empty() && v.sizes[0].is_const() &&
        std::all_of(v.sizes.begin(), v.sizes.end(), [&](const SDim& d) { return d == v.sizes[0]; });
    if (splat)
      return constant(static_cast<double>(v.sizes[0].offset), DType::i64,
                      {Dim::constant(static_cast<int64_t>(v.sizes.size()))});
    nfail(
        "input '{}' ({}) is a list of sizes used as a tensor value, which kiln does not "
        "support",
        name, sdims_text(v.sizes));
  }
  // kConst: a splat becomes a `constant`, anything else a weight.
  std::vector<Dim> shape;
  for (int64_t d : v.cshape) shape.push_back(Dim::constant(d));
  if (!v.data.empty() &&
      std::all_of(
          v.data.begin(), v.data.end(),
          [&](double x) { return x == v.data[0] || (std::isnan(x) && std::isnan(v.data[0])); }) &&
      v.weight_name.empty())
    return constant(v.data[0], v.dtype, shape);
  if (v.data.empty()) nfail("input '{}' is an empty tensor, which kiln does not support", name);
  if (v.dtype != DType::f32)
    nfail("input '{}' is a constant {} tensor of shape [{}]: kiln weights are f32", name,
          ir::dtype_name(v.dtype), fmt::join(v.cshape, ","));
  std::string wname = v.weight_name.empty() ? name : v.weight_name;
  TensorType t{DType::f32, shape};
  if (!weight_names_.count(wname)) {
    weight_names_.insert(wname);
    std::vector<float> f(v.data.begin(), v.data.end());
    weights_.push_back(rt::make_f32(wname, v.cshape, f));
  }
  module_.declare_weight(wname, t);
  return emit(OpKind::weight, {}, {{"name", wname}}, &t);
}

// ---------------------------------------------------------------------------------------
bool is_supported_op(const std::string& op) {
  static const std::set<std::string> ops = {"Abs",
                                            "Add",
                                            "And",
                                            "Cast",
                                            "Concat",
                                            "Constant",
                                            "ConstantOfShape",
                                            "Div",
                                            "Dropout",
                                            "Equal",
                                            "Erf",
                                            "Exp",
                                            "Expand",
                                            "Gather",
                                            "Gemm",
                                            "Greater",
                                            "GreaterOrEqual",
                                            "Identity",
                                            "LayerNormalization",
                                            "Less",
                                            "LessOrEqual",
                                            "Log",
                                            "LogSoftmax",
                                            "MatMul",
                                            "Max",
                                            "Min",
                                            "Mul",
                                            "Neg",
                                            "Not",
                                            "Or",
                                            "Pow",
                                            "Range",
                                            "Reciprocal",
                                            "ReduceMax",
                                            "ReduceMean",
                                            "ReduceProd",
                                            "ReduceSum",
                                            "Relu",
                                            "Reshape",
                                            "Shape",
                                            "Sigmoid",
                                            "Slice",
                                            "Softmax",
                                            "Split",
                                            "Sqrt",
                                            "Squeeze",
                                            "Sub",
                                            "Tanh",
                                            "Transpose",
                                            "Trilu",
                                            "Unsqueeze",
                                            "Where"};
  return ops.count(op) != 0;
}

OnnxImport Importer::run() {
  for (const auto& o : model_.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") opset_ = o.version();
  if (opset_ == 0)
    fail("{}: the model imports no ONNX opset (opset_import has no default domain)", label_);
  if (opset_ < kMinOpset || opset_ > kMaxOpset)
    fail(
        "{}: opset {} is not supported: kiln imports opsets {} to {} (re-export with "
        "torch.onnx.export(..., opset_version={}))",
        label_, opset_, kMinOpset, kMaxOpset, kMaxOpset);
  const onnx::GraphProto& g = model_.graph();

  // Every unsupported node at once.
  std::vector<std::string> unsupported;
  for (const auto& n : g.node()) {
    if (!n.domain().empty() && n.domain() != "ai.onnx")
      unsupported.push_back(fmt::format("'{}' ({}, domain {})", n.name(), n.op_type(), n.domain()));
    else if (!is_supported_op(n.op_type()))
      unsupported.push_back(fmt::format("'{}' ({})", n.name(), n.op_type()));
  }
  if (!unsupported.empty())
    fail("{}: {} node{} with operators kiln does not import (opset {}): {}", label_,
         unsupported.size(), unsupported.size() == 1 ? "" : "s", opset_,
         fmt::join(unsupported, ", "));

  module_.name = options_.module_name.empty() ? "imported" : options_.module_name;
  module_.functions.emplace_back();
  fn().name = options_.function;

  for (const auto& t : g.initializer()) {
    if (t.name().empty()) fail("{}: an initializer has no name", label_);
    initializers_[t.name()] = &t;
  }

  // Inputs: symbolic dims become symbols.
  std::set<std::string> param_names;
  for (const auto& in : g.input()) {
    if (initializers_.count(in.name())) continue;
    if (!in.type().has_tensor_type())
      fail("{}: graph input '{}' is not a tensor", label_, in.name());
    const auto& tt = in.type().tensor_type();
    std::optional<DType> dt = onnx_dtype(tt.elem_type());
    if (!dt || tt.elem_type() == onnx::TensorProto::DOUBLE ||
        tt.elem_type() == onnx::TensorProto::FLOAT16)
      fail("{}: graph input '{}' has element type {}: kiln inputs are FLOAT, INT64, INT32 or BOOL",
           label_, in.name(), onnx_dtype_name(tt.elem_type()));
    if (tt.elem_type() == onnx::TensorProto::INT32) dt = DType::i32;
    if (!tt.has_shape()) fail("{}: graph input '{}' has no shape", label_, in.name());
    if (tt.shape().dim_size() > kMaxRank)
      fail("{}: graph input '{}' has rank {}, more than kiln's {}", label_, in.name(),
           tt.shape().dim_size(), kMaxRank);
    TensorType t{*dt, {}};
    for (int i = 0; i < tt.shape().dim_size(); ++i) {
      const auto& d = tt.shape().dim(i);
      if (d.has_dim_value()) {
        if (d.dim_value() < 1 || d.dim_value() > kMaxElements)
          fail("{}: graph input '{}' dim {} is {}", label_, in.name(), i, d.dim_value());
        t.shape.push_back(Dim::constant(d.dim_value()));
        continue;
      }
      if (!d.has_dim_param() || d.dim_param().empty())
        fail(
            "{}: graph input '{}' dim {} has neither a size nor a name: export it with "
            "dynamic_axes naming it (e.g. {{'{}': {{{}: 'B'}}}}) or a fixed size",
            label_, in.name(), i, in.name(), i);
      const std::string sym = sanitize(d.dim_param(), "d");
      if (!module_.find_symbol(sym)) {
        auto it = options_.dim_max.find(d.dim_param());
        if (it == options_.dim_max.end()) it = options_.dim_max.find(sym);
        if (it == options_.dim_max.end())
          fail(
              "{}: graph input '{}' dim {} is the dynamic size '{}', which needs a maximum: "
              "pass --dim {}=MAX",
              label_, in.name(), i, d.dim_param(), d.dim_param());
        module_.symbols.push_back(ir::Symbol{sym, it->second});
      }
      t.shape.push_back(Dim::sym(sym));
    }
    std::string pname = sanitize(in.name(), "in_");
    if (!param_names.insert(pname).second)
      fail("{}: two graph inputs are named '{}'", label_, pname);
    ValueId id = fn().add_param(pname, t);
    vals_[in.name()] = tensor_val(id);
  }
  for (const auto& [name, sym] : options_.dim_max)
    if (options_.refuse_unused_dims && !module_.find_symbol(sanitize(name, "d")))
      fail("{}: --dim {}: no graph input has a dynamic dim named '{}'", label_, name, name);

  for (const auto& [name, t] : initializers_) {
    Val v;
    v.kind = Val::kConst;
    std::optional<DType> dt = onnx_dtype(t->data_type());
    if (!dt)
      fail("{}: initializer '{}' has data type {}, which kiln does not read", label_, name,
           onnx_dtype_name(t->data_type()));
    v.dtype = *dt;
    v.data =
        tensor_values(*t, fmt::format("{}: initializer '{}'", label_, name), base_dir_, &v.cshape);
    v.weight_name = name;
    if (v.dtype != DType::f32 && v.cshape.size() <= 1 && v.data.size() <= kMaxSizesList) {
      Val s;
      s.kind = Val::kSizes;
      s.scalar = v.cshape.empty();
      for (double d : v.data) s.sizes.push_back(SDim::constant(to_i64(d)));
      v = std::move(s);
    }
    vals_[name] = std::move(v);
  }

  for (const auto& n : g.node()) {
    node_ = &n;
    import_node();
    ++node_index_;
  }
  node_ = nullptr;

  // Outputs.
  std::set<std::string> result_names;
  for (const auto& out : g.output()) {
    auto it = vals_.find(out.name());
    if (it == vals_.end()) fail("{}: graph output '{}' is computed by no node", label_, out.name());
    Val v = it->second;
    if (v.kind != Val::kTensor) {
      onnx::NodeProto fake;
      fake.set_name(out.name());
      fake.set_op_type("graph output");
      node_ = &fake;
      v = tensor_val(as_tensor(v, out.name()));
      node_ = nullptr;
    }
    if (!same_shape(v))
      fail("{}: graph output '{}' has the shape {}, which is no kiln shape", label_, out.name(),
           sdims_text(v.shape));
    std::string rname = sanitize(out.name(), "out_");
    if (!result_names.insert(rname).second)
      fail("{}: two graph outputs are named '{}'", label_, rname);
    ValueId id = v.id;
    // A result needs its own named value: parameters and values returned twice get a copy.
    bool is_param = std::find(fn().params.begin(), fn().params.end(), id) != fn().params.end();
    bool returned = std::find(fn().results.begin(), fn().results.end(), id) != fn().results.end();
    if (is_param || returned || (!fn().values[id].name.empty() && fn().values[id].name != rname)) {
      TensorType t = ir_type(id);
      ValueId copy = fn().add_op(OpKind::reshape, {id}, t);
      id = copy;
    }
    fn().values[id].name = rname;
    fn().results.push_back(id);
  }
  if (fn().results.empty()) fail("{}: the graph has no outputs", label_);

  ir::verify_or_throw(module_);  // the importer's own invariant: what it emits verifies
  OnnxImport r;
  r.module = std::move(module_);
  r.weights = std::move(weights_);
  r.opset = opset_;
  r.onnx_nodes = static_cast<size_t>(g.node_size());
  return r;
}

// ---------------------------------------------------------------------------------------
void Importer::import_node() {
  const std::string& op = node_->op_type();
  if (node_->output_size() < 1) nfail("the node has no outputs");
  if (op == "Constant") {
    Val v;
    v.kind = Val::kConst;
    if (const auto* a = attr("value")) {
      if (a->type() != onnx::AttributeProto::TENSOR) nfail("attribute 'value' must be a tensor");
      std::optional<DType> dt = onnx_dtype(a->t().data_type());
      if (!dt)
        nfail("the constant's data type {} is not supported", onnx_dtype_name(a->t().data_type()));
      v.dtype = *dt;
      v.data = tensor_values(a->t(), fmt::format("{}: node '{}' (Constant)", label_, node_->name()),
                             base_dir_, &v.cshape);
    } else if (const auto* f = attr("value_float")) {
      v.dtype = DType::f32;
      v.data = {f->f()};
    } else if (const auto* i = attr("value_int")) {
      v.dtype = DType::i64;
      v.data = {static_cast<double>(i->i())};
    } else if (const auto* is = attr("value_ints")) {
      v.dtype = DType::i64;
      v.cshape = {is->ints_size()};
      for (int64_t x : is->ints()) v.data.push_back(static_cast<double>(x));
    } else if (const auto* fs = attr("value_floats")) {
      v.dtype = DType::f32;
      v.cshape = {fs->floats_size()};
      for (float x : fs->floats()) v.data.push_back(x);
    } else {
      nfail(
          "a Constant needs one of the attributes value, value_float, value_int, value_ints, "
          "value_floats");
    }
    if (v.dtype != DType::f32 && v.dtype != DType::boolean && v.cshape.size() <= 1 &&
        v.data.size() <= kMaxSizesList) {
      Val s;
      s.kind = Val::kSizes;
      s.scalar = v.cshape.empty();
      for (double d : v.data) s.sizes.push_back(SDim::constant(to_i64(d)));
      v = std::move(s);
    }
    set_output(0, std::move(v));
    return;
  }
  if (op == "Identity" || op == "Dropout") {
    if (op == "Dropout" && has_input(2)) {
      const Val& training = input(2);
      if (training.kind == Val::kTensor || need_scalar(training, "training_mode") != 0)
        nfail("Dropout in training mode is not supported (export the model in eval mode)");
    }
    set_output(0, input(0));
    if (op == "Dropout" && node_->output_size() > 1 && !node_->output(1).empty())
      nfail("Dropout's mask output is not supported");
    return;
  }
  if (op == "Shape") {
    const Val& x = input(0);
    Val s;
    s.kind = Val::kSizes;
    if (x.kind == Val::kTensor)
      s.sizes = x.shape;
    else if (x.kind == Val::kConst)
      for (int64_t d : x.cshape) s.sizes.push_back(SDim::constant(d));
    else
      s.sizes = x.scalar ? std::vector<SDim>{}
                         : std::vector<SDim>{SDim::constant(static_cast<int64_t>(x.sizes.size()))};
    int64_t rank = static_cast<int64_t>(s.sizes.size());
    int64_t start = int_attr("start", 0), end = int_attr("end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    s.sizes = std::vector<SDim>(s.sizes.begin() + start, s.sizes.begin() + end);
    set_output(0, std::move(s));
    return;
  }
  bool all_known = true;
  for (int i = 0; i < node_->input_size(); ++i)
    if (has_input(i) && input(i).kind == Val::kTensor) all_known = false;
  if (all_known && node_->input_size() > 0 && fold_node()) return;
  tensor_node();
}

// ---------------------------------------------------------------------------------------
// Folding: every input known at import time.

// A known value as doubles with its shape (sizes must be constant).
struct Known {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<double> data;
};

bool Importer::fold_node() {
  const std::string& op = node_->op_type();
  // Size arithmetic, symbolic entries allowed.
  auto sizes_of = [&](const Val& v, std::vector<SDim>* out, bool* scalar) {
    if (v.kind == Val::kSizes) {
      *out = v.sizes;
      *scalar = v.scalar;
      return true;
    }
    if (v.kind == Val::kConst && v.dtype != DType::f32 && v.cshape.size() <= 1) {
      out->clear();
      for (double d : v.data) out->push_back(SDim::constant(to_i64(d)));
      *scalar = v.cshape.empty();
      return true;
    }
    return false;
  };
  auto make_sizes = [](std::vector<SDim> s, bool scalar) {
    Val v;
    v.kind = Val::kSizes;
    v.sizes = std::move(s);
    v.scalar = scalar;
    return v;
  };
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
    std::vector<SDim> a, b;
    bool sa, sb;
    if (sizes_of(input(0), &a, &sa) && sizes_of(input(1), &b, &sb)) {
      size_t n = std::max(a.size(), b.size());
      if (a.empty() || b.empty() || !(a.size() == b.size() || a.size() == 1 || b.size() == 1))
        nfail("size arithmetic on {} and {}: lengths do not broadcast", sdims_text(a),
              sdims_text(b));
      std::vector<SDim> r;
      for (size_t i = 0; i < n; ++i) {
        const SDim& x = a[a.size() == 1 ? 0 : i];
        const SDim& y = b[b.size() == 1 ? 0 : i];
        std::optional<SDim> z;
        if (op == "Add")
          z = sdim_add(x, y);
        else if (op == "Sub") {
          auto ny = sdim_neg(y);
          if (ny) z = sdim_add(x, *ny);
        } else if (op == "Mul")
          z = sdim_mul(x, y);
        else
          z = sdim_div(x, y);
        if (!z)
          nfail("cannot compute {} of the sizes {} and {} at import time", op, sdim_text(x),
                sdim_text(y));
        r.push_back(*z);
      }
      set_output(0, make_sizes(std::move(r), sa && sb));
      return true;
    }
  }
  if (op == "Cast") {
    std::vector<SDim> a;
    bool sa;
    int64_t to = int_attr("to", 0);
    if (sizes_of(input(0), &a, &sa) &&
        (to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32)) {
      set_output(0, make_sizes(std::move(a), sa));
      return true;
    }
  }
  if (op == "Cast") {
    std::vector<SDim> a;
    bool sa;
    const int64_t to = int_attr("to", 0);
    if (sizes_of(input(0), &a, &sa) &&
        (to == onnx::TensorProto::FLOAT || to == onnx::TensorProto::DOUBLE) &&
        std::all_of(a.begin(), a.end(), [](const SDim& d) { return d.is_const(); })) {
      Val r;
      r.kind = Val::kConst;
      r.dtype = DType::f32;
      if (!sa) r.cshape = {static_cast<int64_t>(a.size())};
      for (const SDim& d : a) r.data.push_back(static_cast<double>(d.offset));
      set_output(0, std::move(r));
      return true;
    }
  }
  if (op == "ReduceProd") {
    std::vector<SDim> a;
    bool sa;
    if (sizes_of(input(0), &a, &sa)) {
      std::optional<SDim> p = sdim_product(a);
      if (!p) nfail("cannot compute the product of the sizes {}", sdims_text(a));
      const bool keep = int_attr("keepdims", 1) != 0 && !sa;
      set_output(0, make_sizes({*p}, !keep));
      return true;
    }
  }
  if (op == "Gather") {
    std::vector<SDim> a, idx;
    bool sa, si;
    if (sizes_of(input(0), &a, &sa) && !sa && sizes_of(input(1), &idx, &si)) {
      std::vector<SDim> r;
      for (const SDim& i : idx) {
        if (!i.is_const()) nfail("gather index {} is not a constant", sdim_text(i));
        int64_t k = i.offset < 0 ? i.offset + static_cast<int64_t>(a.size()) : i.offset;
        if (k < 0 || k >= static_cast<int64_t>(a.size()))
          nfail("index {} is out of range for {} entries", i.offset, a.size());
        r.push_back(a[static_cast<size_t>(k)]);
      }
      set_output(0, make_sizes(std::move(r), si));
      return true;
    }
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    std::vector<SDim> a;
    bool sa;
    if (sizes_of(input(0), &a, &sa)) {
      if (op == "Unsqueeze" && sa) {
        set_output(0, make_sizes(std::move(a), false));
        return true;
      }
      if (op == "Squeeze" && !sa && a.size() == 1) {
        set_output(0, make_sizes(std::move(a), true));
        return true;
      }
      if (op == "Unsqueeze" && !sa) return false;
    }
  }
  if (op == "Concat") {
    bool ok = true;
    std::vector<SDim> r;
    for (int i = 0; i < node_->input_size() && ok; ++i) {
      std::vector<SDim> a;
      bool sa;
      ok = sizes_of(input(i), &a, &sa) && !sa;
      r.insert(r.end(), a.begin(), a.end());
    }
    if (ok) {
      set_output(0, make_sizes(std::move(r), false));
      return true;
    }
  }
  if (op == "Slice") {
    std::vector<SDim> a;
    bool sa;
    if (sizes_of(input(0), &a, &sa) && !sa) {
      std::vector<int64_t> st, en, ax, sp;
      need_ints(input(1), "starts", &st);
      need_ints(input(2), "ends", &en);
      if (has_input(3)) need_ints(input(3), "axes", &ax);
      if (has_input(4)) need_ints(input(4), "steps", &sp);
      if (st.size() != 1 || en.size() != 1 || sp.size() > 1 || (!sp.empty() && sp[0] != 1) ||
          ax.size() > 1 || (!ax.empty() && ax[0] != 0 && ax[0] != -1))
        nfail("slicing a list of sizes supports one axis with step 1");
      int64_t n = static_cast<int64_t>(a.size());
      int64_t s = st[0] < 0 ? st[0] + n : st[0], e = en[0] < 0 ? en[0] + n : en[0];
      s = std::clamp<int64_t>(s, 0, n);
      e = std::clamp<int64_t>(e, s, n);
      set_output(0, make_sizes(std::vector<SDim>(a.begin() + s, a.begin() + e), false));
      return true;
    }
  }
  if (op == "Equal") {
    std::vector<SDim> a, b;
    bool sa, sb;
    if (sizes_of(input(0), &a, &sb) && sizes_of(input(1), &b, &sa)) {
      size_t n = std::max(a.size(), b.size());
      if (a.empty() || b.empty() || !(a.size() == b.size() || a.size() == 1 || b.size() == 1))
        nfail("comparing sizes {} and {}: lengths do not broadcast", sdims_text(a), sdims_text(b));
      Val r;
      r.kind = Val::kConst;
      r.dtype = DType::boolean;
      if (!(sa && sb)) r.cshape = {static_cast<int64_t>(n)};
      for (size_t i = 0; i < n; ++i) {
        const SDim& x = a[a.size() == 1 ? 0 : i];
        const SDim& y = b[b.size() == 1 ? 0 : i];
        if (x == y)
          r.data.push_back(1);
        else if (x.is_const() && y.is_const())
          r.data.push_back(0);
        else {
          // A symbolic size is at least 1: it never equals a constant below that.
          const SDim& c = x.is_const() ? x : y;
          if (!c.is_const() || c.offset >= 1)
            nfail("cannot decide at import time whether the sizes {} and {} are equal",
                  sdim_text(x), sdim_text(y));
          r.data.push_back(0);
        }
      }
      set_output(0, std::move(r));
      return true;
    }
  }
  if (op == "Where") {
    const Val& c = input(0);
    std::vector<SDim> a, b;
    bool sa, sb;
    if (c.kind == Val::kConst && sizes_of(input(1), &a, &sa) && sizes_of(input(2), &b, &sb)) {
      size_t n = std::max({c.data.size(), a.size(), b.size()});
      auto fits = [&](size_t m) { return m == n || m == 1; };
      if (c.data.empty() || a.empty() || b.empty() || !fits(c.data.size()) || !fits(a.size()) ||
          !fits(b.size()))
        nfail("Where over sizes: lengths {}, {} and {} do not broadcast", c.data.size(), a.size(),
              b.size());
      std::vector<SDim> r;
      for (size_t i = 0; i < n; ++i) {
        bool cond = c.data[c.data.size() == 1 ? 0 : i] != 0;
        r.push_back(cond ? a[a.size() == 1 ? 0 : i] : b[b.size() == 1 ? 0 : i]);
      }
      set_output(0, make_sizes(std::move(r), sa && sb && c.cshape.empty()));
      return true;
    }
  }
  if (op == "ConstantOfShape" || op == "Range" || op == "Expand" || op == "Reshape" ||
      op == "Trilu")
    return false;  // shapes may be symbolic: built as IR
  // Other ops on floats: not folded (they become IR ops on constants; canonicalize folds).
  return false;
}

// ---------------------------------------------------------------------------------------
void Importer::elementwise(OpKind kind) {
  Val a = input(0), b = input(1);
  if (merged(a) || merged(b)) {
    // Broadcast over the unflattened dims: the other operand must not reach the merged dim.
    const Val& m = merged(a) ? a : b;
    const Val& o = merged(a) ? b : a;
    if (merged(o)) {
      if (ir_type(o.id) != ir_type(m.id) || o.shape != m.shape)
        nfail("operands of shapes {} and {} are both stored unflattened differently",
              sdims_text(a.shape), sdims_text(b.shape));
    } else {
      size_t orank = o.kind == Val::kTensor  ? o.shape.size()
                     : o.kind == Val::kConst ? o.cshape.size()
                                             : 0;
      if (orank >= m.shape.size())
        nfail(
            "an operand of shape {} (a product of symbols, stored unflattened) broadcast "
            "with a rank-{} operand is not supported",
            sdims_text(m.shape), orank);
    }
    Val r = tensor_val(emit(kind, {as_tensor(a, node_->input(0)), as_tensor(b, node_->input(1))}));
    r.shape = m.shape;
    set_output(0, r);
    return;
  }
  set_output(
      0, tensor_val(emit(kind, {as_tensor(a, node_->input(0)), as_tensor(b, node_->input(1))})));
}

void Importer::compare(OpKind kind, bool swap) {
  Val a = input(0), b = input(1);
  if (merged(a) || merged(b)) nfail("comparisons of values stored unflattened are not supported");
  ValueId x = as_tensor(a, node_->input(0)), y = as_tensor(b, node_->input(1));
  set_output(0, tensor_val(swap ? emit(kind, {y, x}) : emit(kind, {x, y})));
}

void Importer::matmul_node() {
  Val a = input(0), b = input(1);
  if (merged(b)) nfail("a right operand stored unflattened is not supported");
  ValueId x = as_tensor(a, node_->input(0));
  ValueId w = as_tensor(b, node_->input(1));
  const TensorType wt = ir_type(w);
  if (wt.rank() < 2) nfail("MatMul by a rank-{} right operand is not supported", wt.rank());
  if (ir_type(x).rank() < 2)
    nfail("MatMul of a rank-{} left operand is not supported", ir_type(x).rank());
  Val r = tensor_val(emit(OpKind::matmul, {x, w}));
  if (merged(a)) {
    if (wt.rank() != 2) nfail("a left operand stored unflattened needs a rank-2 right operand");
    r.shape = a.shape;
    r.shape.back() = from_dim(wt.shape[1]);
  }
  set_output(0, r);
}

void Importer::gemm_node() {
  Val a = input(0), b = input(1);
  const int64_t trans_a = int_attr("transA", 0), trans_b = int_attr("transB", 0);
  const float alpha = float_attr("alpha", 1.f), beta = float_attr("beta", 1.f);
  ValueId x = as_tensor(a, node_->input(0));
  if (trans_a) {
    if (merged(a)) nfail("transA of a value stored unflattened is not supported");
    x = emit(OpKind::transpose, {x}, {{"perm", std::vector<int64_t>{1, 0}}});
  }
  ValueId w = as_tensor(b, node_->input(1));
  if (ir_type(w).rank() != 2 || (!merged(a) && ir_type(x).rank() != 2))
    nfail("Gemm needs rank-2 operands");
  if (trans_b) w = emit(OpKind::transpose, {w}, {{"perm", std::vector<int64_t>{1, 0}}});
  ValueId y = emit(OpKind::matmul, {x, w});
  if (alpha != 1.f) y = emit(OpKind::mul, {y, constant(alpha, DType::f32)});
  if (has_input(2)) {
    ValueId c = as_tensor(input(2), node_->input(2));
    if (beta != 1.f) c = emit(OpKind::mul, {c, constant(beta, DType::f32)});
    y = emit(OpKind::add, {y, c});
  }
  Val r = tensor_val(y);
  if (merged(a)) {
    r.shape = a.shape;
    r.shape.back() = from_dim(ir_type(w).shape[1]);
  }
  set_output(0, r);
}

// Reshape (and Unsqueeze, Squeeze, Flatten) of input 0 to `target` (no 0 or -1 left).
void Importer::reshape_node(const std::vector<SDim>& target) {
  if (target.size() > static_cast<size_t>(kMaxRank))
    nfail("the target shape has rank {}, more than kiln's {}", target.size(), kMaxRank);
  const Val x = input(0);
  if (x.kind != Val::kTensor) {
    if (x.kind == Val::kSizes) {
      // A reshape of sizes: a scalar <-> [1].
      std::optional<SDim> n = sdim_product(target);
      if (n && n->is_const() && n->offset == static_cast<int64_t>(x.sizes.size()) &&
          target.size() <= 1) {
        Val r = x;
        r.scalar = target.empty();
        set_output(0, r);
        return;
      }
    } else {
      std::vector<int64_t> shape;
      for (const SDim& d : target) {
        if (!d.is_const())
          nfail("reshape of a constant to the symbolic shape {}", sdims_text(target));
        shape.push_back(d.offset);
      }
      if (checked_numel(shape, "reshape") != static_cast<int64_t>(x.data.size()))
        nfail("cannot reshape a constant of {} elements to {}", x.data.size(), sdims_text(target));
      Val r = x;
      r.cshape = shape;
      r.weight_name.clear();
      set_output(0, r);
      return;
    }
  }
  ValueId id = as_tensor(x, node_->input(0));
  // A target kiln can hold.
  bool representable = std::all_of(target.begin(), target.end(),
                                   [](const SDim& d) { return to_dim(d).has_value(); });
  if (representable) {
    TensorType t{ir_type(id).dtype, dims_of(target, "the target shape")};
    if (t == ir_type(id)) {
      set_output(0, tensor_val(id));
      return;
    }
    set_output(0, tensor_val(emit(OpKind::reshape, {id}, {}, &t)));
    return;
  }
  // A leading product of symbols (T*B): keep it unflattened as its factors.
  for (size_t i = 1; i < target.size(); ++i)
    if (!to_dim(target[i]))
      nfail("the target shape {} has the size {}, which is no kiln dim", sdims_text(target),
            sdim_text(target[i]));
  const SDim& lead = target[0];
  if (lead.offset != 0)
    nfail("the target shape {} has the size {}, which is no kiln dim", sdims_text(target),
          sdim_text(lead));
  // The factors in the order their symbols appear in the operand's IR shape.
  std::vector<std::string> order;
  for (const Dim& d : ir_type(id).shape)
    if (d.is_symbolic() && std::count(lead.syms.begin(), lead.syms.end(), d.symbol) &&
        std::find(order.begin(), order.end(), d.symbol) == order.end())
      order.push_back(d.symbol);
  for (const std::string& s : lead.syms)
    if (std::find(order.begin(), order.end(), s) == order.end()) order.push_back(s);
  if (order.size() != lead.syms.size())
    nfail("the target shape {} has the size {}, which is no kiln dim", sdims_text(target),
          sdim_text(lead));
  std::vector<Dim> dims;
  for (size_t i = 0; i < order.size(); ++i)
    dims.push_back(Dim::affine(order[i], i == 0 ? lead.coef : 1, 0));
  for (size_t i = 1; i < target.size(); ++i) dims.push_back(*to_dim(target[i]));
  TensorType t{ir_type(id).dtype, dims};
  ValueId out = t == ir_type(id) ? id : emit(OpKind::reshape, {id}, {}, &t);
  Val r = tensor_val(out);
  r.shape = target;
  set_output(0, r);
}

void Importer::slice_node() {
  const Val x = input(0);
  std::vector<int64_t> axes, steps;
  std::vector<SDim> starts = need_sizes(input(1), "starts"), ends = need_sizes(input(2), "ends");
  if (has_input(3)) need_ints(input(3), "axes", &axes);
  if (has_input(4)) need_ints(input(4), "steps", &steps);
  if (starts.size() != ends.size()) nfail("starts and ends differ in length");
  if (x.kind == Val::kConst) {
    // Constants are sliced at import time (e.g. a positional table by a fixed length).
    if (starts.size() != 1) nfail("slicing a constant along several axes is not supported");
  }
  ValueId id = as_tensor(x, node_->input(0));
  if (merged(x)) nfail("slicing a value stored unflattened is not supported");
  const int64_t rank = ir_type(id).rank();
  if ((!axes.empty() && axes.size() != starts.size()) ||
      (!steps.empty() && steps.size() != starts.size()))
    nfail("starts, ends, axes and steps differ in length ({}, {}, {}, {})", starts.size(),
          ends.size(), axes.size(), steps.size());
  for (size_t k = 0; k < starts.size(); ++k) {
    const int64_t given = axes.empty() ? static_cast<int64_t>(k) : axes[k];
    int64_t axis = given;
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) nfail("axis {} is out of range for rank {}", given, rank);
    if (!steps.empty() && steps[k] != 1)
      nfail("steps other than 1 are not supported (step {})", steps[k]);
    const SDim dim = from_dim(ir_type(id).shape[static_cast<size_t>(axis)]);
    SDim s = starts[k], e = ends[k];
    if (!s.is_const()) nfail("a symbolic start ({}) is not supported", sdim_text(s));
    if (s.offset < 0) {
      auto v = sdim_add(dim, s);
      if (!v || !v->is_const())
        nfail("a negative start ({}) on the symbolic dim {} is not supported", s.offset,
              sdim_text(dim));
      s = *v;
    }
    if (e.is_const() && e.offset < 0) {
      auto v = sdim_add(dim, e);
      if (!v) nfail("cannot compute the end {} of dim {}", e.offset, sdim_text(dim));
      e = *v;
    }
    // Clamp: INT64_MAX-like ends mean "to the end".
    if (e.is_const() && dim.is_const())
      e.offset = std::clamp(e.offset, int64_t{0}, dim.offset);
    else if (e.is_const() && e.offset > (int64_t{1} << 40))
      e = dim;
    if (dim.is_const()) s.offset = std::min(s.offset, dim.offset);
    if (s.offset < 0)
      nfail("start {} is out of range for dim {}", starts[k].offset, sdim_text(dim));
    auto len_opt = sdim_add(e, SDim::constant(-s.offset));
    if (!len_opt) nfail("cannot compute the length of slice [{}, {})", sdim_text(s), sdim_text(e));
    SDim len = *len_opt;
    if (len.is_const() && len.offset < 0) len.offset = 0;
    if (len == dim && s.offset == 0) continue;
    TensorType t = ir_type(id);
    std::optional<Dim> ld = to_dim(len);
    if (!ld || (len.is_const() && len.offset == 0))
      nfail("the slice [{}, {}) of dim {} has the length {}, which kiln cannot hold", sdim_text(s),
            sdim_text(e), sdim_text(dim), sdim_text(len));
    t.shape[static_cast<size_t>(axis)] = *ld;
    id = emit(OpKind::slice, {id}, {{"axis", axis}, {"start", s.offset}}, &t);
  }
  set_output(0, tensor_val(id));
}

void Importer::gather_node() {
  const Val data = input(0), idx = input(1);
  int64_t axis = int_attr("axis", 0);
  if (idx.kind != Val::kTensor) {
    // Constant indices: a slice (and a reshape dropping the axis for a scalar index).
    std::vector<int64_t> ids;
    need_ints(idx, "the indices", &ids);
    bool scalar = idx.kind == Val::kSizes ? idx.scalar : idx.cshape.empty();
    ValueId id = as_tensor(data, node_->input(0));
    if (merged(data)) nfail("gathering from a value stored unflattened is not supported");
    TensorType t = ir_type(id);
    if (axis < 0) axis += t.rank();
    if (axis < 0 || axis >= t.rank()) nfail("axis is out of range for rank {}", t.rank());
    const Dim d = t.shape[static_cast<size_t>(axis)];
    if (ids.empty()) nfail("no indices");
    for (size_t i = 1; i < ids.size(); ++i)
      if (ids[i] != ids[0] + static_cast<int64_t>(i))
        nfail("only consecutive constant indices are supported");
    int64_t start = ids[0];
    if (start < 0) {
      if (d.is_symbolic()) nfail("a negative index on a symbolic dim is not supported");
      start += d.value;
    }
    if (start < 0 || (!d.is_symbolic() && start + static_cast<int64_t>(ids.size()) > d.value))
      nfail("index {} is out of range for dim {}", ids[0], ir::to_string(d));
    TensorType st = t;
    st.shape[static_cast<size_t>(axis)] = Dim::constant(static_cast<int64_t>(ids.size()));
    ValueId s = emit(OpKind::slice, {id}, {{"axis", axis}, {"start", start}}, &st);
    if (scalar) {
      TensorType rt = st;
      rt.shape.erase(rt.shape.begin() + axis);
      s = emit(OpKind::reshape, {s}, {}, &rt);
    }
    set_output(0, tensor_val(s));
    return;
  }
  if (axis != 0)
    nfail("Gather along axis {} by run-time indices is not supported (axis 0 only)", axis);
  ValueId table = as_tensor(data, node_->input(0));
  ValueId ids = idx.id;
  if (merged(idx) || merged(data)) nfail("values stored unflattened are not supported here");
  set_output(0, tensor_val(emit(OpKind::gather, {table, ids})));
}

// Trilu(x, k): upper keeps j - i >= k, lower keeps j - i <= k; others are 0.
void Importer::trilu_node() {
  const Val x = input(0);
  const int64_t k = has_input(1) ? static_cast<int64_t>(need_scalar(input(1), "k")) : 0;
  const bool upper = int_attr("upper", 1) != 0;
  ValueId id = as_tensor(x, node_->input(0));
  const TensorType t = ir_type(id);
  if (t.rank() < 2) nfail("Trilu needs rank >= 2");
  TensorType it{DType::i64, t.shape};
  const int64_t r = t.rank();
  ValueId row = emit(OpKind::iota, {}, {{"axis", r - 2}}, &it);
  ValueId col = emit(OpKind::iota, {}, {{"axis", r - 1}}, &it);
  ValueId keep;
  if (k == 0)
    keep = emit(upper ? OpKind::ge : OpKind::le, {col, row});
  else if (k == 1 && upper)
    keep = emit(OpKind::gt, {col, row});
  else if (k == -1 && !upper)
    keep = emit(OpKind::lt, {col, row});
  else {
    ValueId diff = emit(OpKind::sub, {col, row});
    keep =
        emit(upper ? OpKind::ge : OpKind::le, {diff, constant(static_cast<double>(k), DType::i64)});
  }
  // A splat input: the constant where kept.
  const ir::Function& f = fn();
  int def = f.defining_op(id);
  if (def >= 0 && f.ops[def].kind == OpKind::constant) {
    const ir::AttrValue& v = f.ops[def].attrs.at("value");
    double value = std::holds_alternative<double>(v) ? std::get<double>(v)
                                                     : static_cast<double>(std::get<int64_t>(v));
    if (t.dtype == DType::boolean && value != 0) {
      set_output(0, tensor_val(keep));
      return;
    }
    // A select between two scalars: the form fuse-attention reads as a mask.
    if (t.dtype != DType::boolean) {
      set_output(0, tensor_val(emit(OpKind::select,
                                    {keep, constant(value, t.dtype), constant(0, t.dtype)})));
      return;
    }
  }
  if (t.dtype == DType::boolean) {
    set_output(0, tensor_val(emit(OpKind::logical_and, {keep, id})));
    return;
  }
  set_output(0, tensor_val(emit(OpKind::select, {keep, id, constant(0, t.dtype)})));
}

void Importer::tensor_node() {
  const std::string& op = node_->op_type();
  auto unary = [&](OpKind kind) {
    const Val x = input(0);
    Val r = tensor_val(emit(kind, {as_tensor(x, node_->input(0))}));
    if (merged(x)) r.shape = x.shape;
    set_output(0, r);
  };
  if (op == "Add") return elementwise(OpKind::add);
  if (op == "Sub") return elementwise(OpKind::sub);
  if (op == "Mul") return elementwise(OpKind::mul);
  if (op == "Div") return elementwise(OpKind::div);
  if (op == "Max" || op == "Min") {
    if (node_->input_size() != 2)
      nfail("{} of {} inputs is not supported (2 only)", op, node_->input_size());
    return elementwise(op == "Max" ? OpKind::maximum : OpKind::minimum);
  }
  if (op == "Equal") return compare(OpKind::eq);
  if (op == "Less") return compare(OpKind::lt);
  if (op == "Greater") return compare(OpKind::gt);
  if (op == "LessOrEqual") return compare(OpKind::le);
  if (op == "GreaterOrEqual") return compare(OpKind::ge);
  if (op == "And") return compare(OpKind::logical_and);
  if (op == "Or") return compare(OpKind::logical_or);
  if (op == "Not") return unary(OpKind::logical_not);
  if (op == "Relu") return unary(OpKind::relu);
  if (op == "Tanh") return unary(OpKind::tanh);
  if (op == "Erf") return unary(OpKind::erf);
  if (op == "Sqrt") return unary(OpKind::sqrt);
  if (op == "Exp") return unary(OpKind::exp);
  if (op == "Log") return unary(OpKind::log);
  if (op == "Sigmoid") return unary(OpKind::sigmoid);
  if (op == "Neg") return unary(OpKind::neg);
  if (op == "Abs") return unary(OpKind::abs);
  if (op == "Reciprocal") {
    const Val x = input(0);
    set_output(
        0, tensor_val(emit(OpKind::div, {constant(1, DType::f32), as_tensor(x, node_->input(0))})));
    return;
  }
  if (op == "Pow") {
    const Val x = input(0);
    const double e = need_scalar(input(1), "the exponent (kiln imports Pow by a constant)");
    ValueId v = as_tensor(x, node_->input(0));
    ValueId r;
    if (e == 1)
      r = v;
    else if (e == 2)
      r = emit(OpKind::mul, {v, v});
    else if (e == 3)
      r = emit(OpKind::mul, {emit(OpKind::mul, {v, v}), v});
    else if (e == 0.5)
      r = emit(OpKind::sqrt, {v});
    else if (e == -0.5)
      r = emit(OpKind::rsqrt, {v});
    else if (e == -1)
      r = emit(OpKind::div, {constant(1, DType::f32), v});
    else
      nfail("Pow by {} is not supported (exponents 1, 2, 3, 0.5, -0.5 and -1 are)", e);
    Val out = tensor_val(r);
    if (merged(x)) out.shape = x.shape;
    set_output(0, out);
    return;
  }
  if (op == "Where") {
    const Val c = input(0), a = input(1), b = input(2);
    if (merged(c) || merged(a) || merged(b))
      nfail("values stored unflattened are not supported here");
    set_output(0, tensor_val(emit(OpKind::select,
                                  {as_tensor(c, node_->input(0)), as_tensor(a, node_->input(1)),
                                   as_tensor(b, node_->input(2))})));
    return;
  }
  if (op == "Cast") {
    const Val x = input(0);
    const int64_t to = int_attr("to", -1);
    std::optional<DType> dt = onnx_dtype(static_cast<int32_t>(to));
    if (!dt || to == onnx::TensorProto::DOUBLE || to == onnx::TensorProto::FLOAT16)
      nfail("Cast to {} is not supported (FLOAT, INT64, INT32 and BOOL are)",
            onnx_dtype_name(static_cast<int32_t>(to)));
    if (to == onnx::TensorProto::INT32) dt = DType::i32;
    ValueId v = as_tensor(x, node_->input(0));
    TensorType t = ir_type(v);
    if (t.dtype == *dt) {
      set_output(0, x.kind == Val::kTensor ? x : tensor_val(v));
      return;
    }
    t.dtype = *dt;
    Val r = tensor_val(emit(OpKind::cast, {v}, {}, &t));
    if (merged(x)) r.shape = x.shape;
    set_output(0, r);
    return;
  }
  if (op == "MatMul") return matmul_node();
  if (op == "Gemm") return gemm_node();
  if (op == "Softmax" || op == "LogSoftmax") {
    const Val x = input(0);
    const int64_t axis = int_attr("axis", -1);
    ValueId v = as_tensor(x, node_->input(0));
    if (merged(x) && !(axis == -1 || axis == static_cast<int64_t>(x.shape.size()) - 1))
      nfail("softmax over axis {} of a value stored unflattened is not supported", axis);
    const int64_t a = merged(x) ? -1 : axis;
    ValueId r = emit(OpKind::softmax, {v}, {{"axis", a}});
    if (op == "LogSoftmax") r = emit(OpKind::log, {r});
    Val out = tensor_val(r);
    if (merged(x)) out.shape = x.shape;
    set_output(0, out);
    return;
  }
  if (op == "ReduceMean" || op == "ReduceSum" || op == "ReduceMax") {
    const Val x = input(0);
    if (merged(x)) nfail("reductions of values stored unflattened are not supported");
    ValueId v = as_tensor(x, node_->input(0));
    std::vector<int64_t> axes = ints_attr("axes");
    if (has_input(1)) need_ints(input(1), "axes", &axes);
    const int64_t rank = ir_type(v).rank();
    if (axes.empty()) {
      if (int_attr("noop_with_empty_axes", 0)) {
        set_output(0, x);
        return;
      }
      for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
    }
    OpKind kind = op == "ReduceMean"  ? OpKind::reduce_mean
                  : op == "ReduceSum" ? OpKind::reduce_sum
                                      : OpKind::reduce_max;
    set_output(
        0, tensor_val(emit(
               kind, {v},
               {{"axes", axes}, {"keepdims", int_attr("keepdims", 1) ? int64_t{1} : int64_t{0}}})));
    return;
  }
  if (op == "LayerNormalization") {
    const Val x = input(0);
    const int64_t axis = int_attr("axis", -1);
    ValueId v = as_tensor(x, node_->input(0));
    const int64_t rank = ir_type(v).rank();
    if (!(axis == -1 || axis == rank - 1 ||
          (merged(x) && axis == static_cast<int64_t>(x.shape.size()) - 1)))
      nfail("LayerNormalization over axis {} is not supported (the last axis only)", axis);
    for (int i = 1; i < node_->output_size(); ++i)
      if (!node_->output(i).empty())
        nfail("LayerNormalization's Mean and InvStdDev outputs are not supported");
    ValueId w = as_tensor(input(1), node_->input(1));
    std::vector<ValueId> ops = {v, w};
    if (has_input(2))
      ops.push_back(as_tensor(input(2), node_->input(2)));
    else
      ops.push_back(constant(0, DType::f32, ir_type(w).shape));
    Val r = tensor_val(
        emit(OpKind::layernorm, ops, {{"eps", static_cast<double>(float_attr("epsilon", 1e-5f))}}));
    if (merged(x)) r.shape = x.shape;
    set_output(0, r);
    return;
  }
  if (op == "Transpose") {
    const Val x = input(0);
    if (merged(x))
      nfail("transposing a value stored unflattened ({}) is not supported", sdims_text(x.shape));
    ValueId v = as_tensor(x, node_->input(0));
    std::vector<int64_t> perm = ints_attr("perm");
    if (perm.empty())
      for (int64_t i = ir_type(v).rank(); i-- > 0;) perm.push_back(i);
    bool identity = true;
    for (size_t i = 0; i < perm.size(); ++i)
      identity = identity && perm[i] == static_cast<int64_t>(i);
    if (identity && static_cast<int64_t>(perm.size()) == ir_type(v).rank()) {
      set_output(0, tensor_val(v));
      return;
    }
    set_output(0, tensor_val(emit(OpKind::transpose, {v}, {{"perm", perm}})));
    return;
  }
  if (op == "Reshape") {
    const Val x = input(0);
    std::vector<SDim> target = need_sizes(input(1), "the target shape");
    const std::vector<SDim>& in = x.kind == Val::kTensor ? x.shape : std::vector<SDim>{};
    int infer = -1;
    for (size_t i = 0; i < target.size(); ++i) {
      if (target[i].is_const() && target[i].offset == 0 && !int_attr("allowzero", 0)) {
        if (i >= in.size()) nfail("a 0 in the target shape at {} copies no input dim", i);
        target[i] = in[i];
      } else if (target[i].is_const() && target[i].offset == -1) {
        if (infer >= 0) nfail("the target shape has two -1 entries");
        infer = static_cast<int>(i);
      } else if (target[i].is_const() && target[i].offset < 0) {
        nfail("the target shape has the size {}", target[i].offset);
      }
    }
    if (infer >= 0) {
      std::vector<SDim> known;
      for (size_t i = 0; i < target.size(); ++i)
        if (static_cast<int>(i) != infer) known.push_back(target[i]);
      std::vector<SDim> in_shape = in;
      if (x.kind == Val::kConst)
        for (int64_t d : x.cshape) in_shape.push_back(SDim::constant(d));
      std::optional<SDim> total = sdim_product(in_shape), part = sdim_product(known);
      std::optional<SDim> q = total && part ? sdim_div(*total, *part) : std::nullopt;
      if (!q)
        nfail("cannot infer the -1 in the target shape {} from the input shape {}",
              sdims_text(target), sdims_text(in_shape));
      target[static_cast<size_t>(infer)] = *q;
    }
    return reshape_node(target);
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    const Val x = input(0);
    std::vector<int64_t> axes = ints_attr("axes");
    if (has_input(1)) need_ints(input(1), "axes", &axes);
    std::vector<SDim> shape = x.kind == Val::kTensor ? x.shape : std::vector<SDim>{};
    if (x.kind == Val::kConst)
      for (int64_t d : x.cshape) shape.push_back(SDim::constant(d));
    if (x.kind == Val::kSizes && !x.scalar)
      shape.push_back(SDim::constant(static_cast<int64_t>(x.sizes.size())));
    if (op == "Unsqueeze") {
      const int64_t out_rank = static_cast<int64_t>(shape.size() + axes.size());
      if (out_rank > kMaxRank)
        nfail("the result has rank {}, more than kiln's {}", out_rank, kMaxRank);
      std::vector<bool> is_new(static_cast<size_t>(out_rank), false);
      for (int64_t a : axes) {
        int64_t n = a < 0 ? a + out_rank : a;
        if (n < 0 || n >= out_rank || is_new[n]) nfail("axis {} is out of range or repeated", a);
        is_new[n] = true;
      }
      std::vector<SDim> out;
      size_t j = 0;
      for (int64_t i = 0; i < out_rank; ++i)
        out.push_back(is_new[i] ? SDim::constant(1) : shape[j++]);
      return reshape_node(out);
    }
    const int64_t rank = static_cast<int64_t>(shape.size());
    std::vector<bool> drop(static_cast<size_t>(rank), false);
    if (axes.empty())
      for (int64_t i = 0; i < rank; ++i) drop[i] = shape[i] == SDim::constant(1);
    for (int64_t a : axes) {
      int64_t n = a < 0 ? a + rank : a;
      if (n < 0 || n >= rank) nfail("axis {} is out of range for rank {}", a, rank);
      if (!(shape[n] == SDim::constant(1)))
        nfail("axis {} has size {}, not 1", a, sdim_text(shape[n]));
      drop[n] = true;
    }
    std::vector<SDim> out;
    for (int64_t i = 0; i < rank; ++i)
      if (!drop[i]) out.push_back(shape[i]);
    return reshape_node(out);
  }
  if (op == "Slice") return slice_node();
  if (op == "Gather") return gather_node();
  if (op == "Trilu") return trilu_node();
  if (op == "Concat") {
    const int64_t axis = int_attr("axis", 0);
    std::vector<ValueId> parts;
    for (int i = 0; i < node_->input_size(); ++i) {
      if (merged(input(i))) nfail("concatenating values stored unflattened is not supported");
      parts.push_back(as_tensor(input(i), node_->input(i)));
    }
    if (parts.size() == 1) {
      set_output(0, tensor_val(parts[0]));
      return;
    }
    set_output(0, tensor_val(emit(OpKind::concat, parts, {{"axis", axis}})));
    return;
  }
  if (op == "Split") {
    const Val x = input(0);
    if (merged(x)) nfail("splitting a value stored unflattened is not supported");
    ValueId v = as_tensor(x, node_->input(0));
    const TensorType t = ir_type(v);
    int64_t axis = int_attr("axis", 0);
    if (axis < 0) axis += t.rank();
    if (axis < 0 || axis >= t.rank()) nfail("axis is out of range");
    std::vector<int64_t> split = ints_attr("split");
    if (has_input(1)) need_ints(input(1), "split", &split);
    const Dim d = t.shape[static_cast<size_t>(axis)];
    const int64_t n = node_->output_size();
    if (split.empty()) {
      if (d.is_symbolic() || d.value % n != 0)
        nfail("cannot split dim {} into {} equal parts", ir::to_string(d), n);
      split.assign(static_cast<size_t>(n), d.value / n);
    }
    if (static_cast<int64_t>(split.size()) != n)
      nfail("split has {} sizes for {} outputs", split.size(), n);
    int64_t start = 0;
    for (int64_t i = 0; i < n; ++i) {
      TensorType st = t;
      if (split[i] < 1) nfail("split size {}", split[i]);
      st.shape[static_cast<size_t>(axis)] = Dim::constant(split[i]);
      set_output(static_cast<int>(i),
                 tensor_val(emit(OpKind::slice, {v}, {{"axis", axis}, {"start", start}}, &st)));
      start += split[i];
    }
    if (!d.is_symbolic() && start != d.value)
      nfail("split sizes sum to {}, the dim is {}", start, d.value);
    return;
  }
  if (op == "Expand") {
    const Val x = input(0);
    if (merged(x)) nfail("expanding a value stored unflattened is not supported");
    ValueId v = as_tensor(x, node_->input(0));
    std::vector<SDim> shape = need_sizes(input(1), "the shape");
    if (shape.size() > static_cast<size_t>(kMaxRank))
      nfail("the shape has rank {}, more than kiln's {}", shape.size(), kMaxRank);
    std::vector<SDim> xs;
    for (const Dim& d : ir_type(v).shape) xs.push_back(from_dim(d));
    const size_t rank = std::max(shape.size(), xs.size());
    std::vector<SDim> out(rank);
    for (size_t i = 0; i < rank; ++i) {
      const SDim* a = i + xs.size() >= rank ? &xs[i + xs.size() - rank] : nullptr;
      const SDim* b = i + shape.size() >= rank ? &shape[i + shape.size() - rank] : nullptr;
      if (a && b) {
        if (*a == *b || *b == SDim::constant(1))
          out[i] = *a;
        else if (*a == SDim::constant(1))
          out[i] = *b;
        else
          nfail("cannot expand {} to {}", sdims_text(xs), sdims_text(shape));
      } else {
        out[i] = a ? *a : *b;
      }
    }
    TensorType t{ir_type(v).dtype, dims_of(out, "the expanded shape")};
    if (t == ir_type(v)) {
      set_output(0, tensor_val(v));
      return;
    }
    set_output(0, tensor_val(emit(OpKind::expand, {v}, {}, &t)));
    return;
  }
  if (op == "ConstantOfShape") {
    std::vector<SDim> shape = need_sizes(input(0), "the shape");
    double value = 0;
    DType dt = DType::f32;
    if (const auto* a = attr("value")) {
      std::vector<int64_t> dims;
      std::vector<double> v = tensor_values(
          a->t(), fmt::format("{}: node '{}' value", label_, node_->name()), {}, &dims);
      if (v.size() != 1) nfail("the value must hold one element");
      std::optional<DType> d = onnx_dtype(a->t().data_type());
      if (!d) nfail("value type {} is not supported", onnx_dtype_name(a->t().data_type()));
      dt = *d;
      value = v[0];
    }
    if (shape.size() > static_cast<size_t>(kMaxRank))
      nfail("the shape {} has rank {}, more than kiln's {}", sdims_text(shape), shape.size(),
            kMaxRank);
    bool all_const =
        std::all_of(shape.begin(), shape.end(), [](const SDim& d) { return d.is_const(); });
    if (all_const) {
      std::vector<int64_t> dims;
      for (const SDim& d : shape) dims.push_back(d.offset);
      all_const = checked_numel(dims, "ConstantOfShape") <= static_cast<int64_t>(kMaxSizesList);
    }
    if (all_const) {  // small: folded (a list of sizes, a constant operand)
      Val c;
      c.kind = Val::kConst;
      c.dtype = dt;
      for (const SDim& d : shape) c.cshape.push_back(d.offset);
      c.data.assign(static_cast<size_t>(checked_numel(c.cshape, "ConstantOfShape")), value);
      if (dt != DType::f32 && dt != DType::boolean && c.cshape.size() <= 1) {
        Val s;
        s.kind = Val::kSizes;
        s.scalar = c.cshape.empty();
        for (double d : c.data) s.sizes.push_back(SDim::constant(to_i64(d)));
        c = s;
      }
      set_output(0, c);
      return;
    }
    set_output(0, tensor_val(constant(value, dt, dims_of(shape, "the shape"))));
    return;
  }
  if (op == "Range") {
    const double start = need_scalar(input(0), "start");
    const double delta = need_scalar(input(2), "delta");
    std::vector<SDim> lim = need_sizes(input(1), "limit");
    if (lim.size() != 1) nfail("limit must be a scalar");
    if (delta != 1) nfail("Range with a delta other than 1 is not supported");
    const std::optional<SDim> neg_start = sdim_neg(SDim::constant(to_i64(start)));
    std::optional<SDim> n = neg_start ? sdim_add(lim[0], *neg_start) : std::nullopt;
    if (!n) nfail("cannot compute the length of the range");
    if (n->is_const() && n->offset < 1) nfail("the range is empty (length {})", n->offset);
    if (n->is_const() && n->offset <= static_cast<int64_t>(kMaxRank)) {
      Val s;
      s.kind = Val::kSizes;
      for (int64_t i = 0; i < n->offset; ++i)
        s.sizes.push_back(SDim::constant(static_cast<int64_t>(start) + i));
      set_output(0, s);
      return;
    }
    if (n->is_const() && n->offset > kMaxElements) nfail("the range has {} elements", n->offset);
    TensorType t{DType::i64, dims_of({*n}, "the range's length")};
    ValueId r = emit(OpKind::iota, {}, {{"axis", int64_t{0}}}, &t);
    if (start != 0) r = emit(OpKind::add, {r, constant(start, DType::i64)});
    set_output(0, tensor_val(r));
    return;
  }
  // Shape-only ops that could not be folded.
  nfail("this use of {} is not supported", op);
}

}  // namespace

OnnxImport import_onnx(std::string_view bytes, const std::string& label,
                       const OnnxImportOptions& options, const std::string& base_dir) {
  onnx::ModelProto model;
  {
    google::protobuf::io::CodedInputStream in(
        reinterpret_cast<const uint8_t*>(bytes.data()),
        static_cast<int>(std::min<size_t>(bytes.size(), INT32_MAX)));
    in.SetRecursionLimit(64);
    if (bytes.size() > INT32_MAX)
      fail("{}: the file is larger than 2 GiB (store weights as external data)", label);
    if (!model.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage())
      fail("{}: not a valid ONNX model (the protobuf does not parse: truncated or corrupt)", label);
  }
  if (!model.has_graph()) fail("{}: the model has no graph", label);
  return Importer(model, label, options, base_dir).run();
}

OnnxImport import_onnx_file(const std::string& path, const OnnxImportOptions& options) {
  const std::vector<uint8_t> data = read_input_file(path, "ONNX model");
  const std::string bytes(data.begin(), data.end());
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  return import_onnx(bytes, path, options, dir);
}

}  // namespace kiln::importer
