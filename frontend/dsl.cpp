// The C++ DSL: tensors, operators and builders (see dsl.h).
#include "frontend/dsl.h"

#include <cstring>

#include <fmt/format.h>

#include "ir/op_types.h"
#include "ir/verifier.h"
#include "support/error.h"

namespace kiln::ir {
namespace {
Dim checked(std::optional<Dim> d, const std::string& why) {
  if (!d) fail("dim arithmetic: {}", why);
  return *d;
}
}  // namespace

Dim operator+(const Dim& a, const Dim& b) {
  std::string why;
  return checked(add_dims(a, b, &why), why);
}
Dim operator+(const Dim& a, int64_t b) { return a + Dim::constant(b); }
Dim operator+(int64_t a, const Dim& b) { return Dim::constant(a) + b; }
Dim operator-(const Dim& a, const Dim& b) {
  std::string why;
  return checked(sub_dims(a, b, &why), why);
}
Dim operator-(const Dim& a, int64_t b) { return a - Dim::constant(b); }
Dim operator*(const Dim& a, const Dim& b) {
  std::string why;
  return checked(mul_dims(a, b, &why), why);
}
Dim operator*(const Dim& a, int64_t b) { return a * Dim::constant(b); }
Dim operator*(int64_t a, const Dim& b) { return Dim::constant(a) * b; }
}  // namespace kiln::ir

namespace kiln::dsl {

using ir::OpKind;
using ir::TensorType;

namespace {

std::string basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

FunctionBuilder* common_builder(const std::vector<Tensor>& xs, const Loc& loc, const char* op) {
  FunctionBuilder* fb = nullptr;
  for (const Tensor& t : xs) {
    if (!t.valid())
      throw Error(fmt::format("dsl error at {}:{}: {}: operand is an empty tensor",
                              basename(loc.file_name()), loc.line(), op));
    if (fb && t.builder() != fb)
      fb->error(loc, fmt::format("{}: operands belong to different functions", op));
    fb = t.builder();
  }
  return fb;
}

}  // namespace

const TensorType& Tensor::type() const {
  KILN_ASSERT(fb_, "type() of an empty tensor");
  return fb_->function().type(id_);
}

const Dim& Tensor::dim(int64_t axis) const {
  int64_t a = ir::normalize_axis(axis, rank());
  if (a < 0)
    fb_->error(Loc::current(),
               fmt::format("axis {} out of range for {}", axis, ir::to_string(type())));
  return type().shape[a];
}

std::string FunctionBuilder::scope() const {
  std::string out;
  for (const auto& s : scopes_) {
    if (!out.empty()) out += '.';
    out += s;
  }
  return out;
}

void FunctionBuilder::error(const Loc& loc, const std::string& message) const {
  std::string where = fmt::format("{}:{}", basename(loc.file_name()), loc.line());
  std::string sc = scope();
  if (!sc.empty()) where += fmt::format(" in '{}'", sc);
  throw Error(fmt::format("dsl error at {} (function '{}'): {}", where,
                          module_->functions[index_].name, message));
}

Tensor FunctionBuilder::input(const std::string& name, DType dtype, std::vector<Dim> shape,
                              Loc loc) {
  ir::Function& f = function();
  for (const auto& v : f.values)
    if (v.name == name) error(loc, fmt::format("input '{}' is declared twice", name));
  for (const Dim& d : shape)
    if (d.is_symbolic() && !module_->find_symbol(d.symbol))
      error(loc, fmt::format("input '{}' uses undeclared symbol '{}'", name, d.symbol));
  return Tensor(this, f.add_param(name, TensorType{dtype, std::move(shape)}));
}

Tensor FunctionBuilder::weight(const std::string& name, std::vector<int64_t> shape, Loc loc) {
  TensorType type{DType::f32, {}};
  for (int64_t d : shape) {
    if (d < 1) error(loc, fmt::format("weight '{}' has a dim of size {}", name, d));
    type.shape.push_back(Dim::constant(d));
  }
  for (const auto& [n, id] : weight_cache_) {
    if (n != name) continue;
    if (!(function().type(id) == type))
      error(loc, fmt::format("weight '{}' used as {} and as {}", name,
                             ir::to_string(function().type(id)), ir::to_string(type)));
    return Tensor(this, id);
  }
  try {
    module_->declare_weight(name, type);
  } catch (const Error& e) {
    error(loc, e.what());
  }
  ir::ValueId id = function().add_op(OpKind::weight, {}, type, {{"name", name}});
  weight_cache_.emplace_back(name, id);
  return Tensor(this, id);
}

Tensor FunctionBuilder::constant(double value, DType dtype) {
  ir::Attrs attrs;
  if (ir::is_integer(dtype) || dtype == DType::boolean)
    attrs["value"] = static_cast<int64_t>(value);
  else
    attrs["value"] = value;
  return Tensor(this, function().add_op(OpKind::constant, {}, TensorType{dtype, {}}, attrs));
}

void FunctionBuilder::output(Tensor value, const std::string& name, Loc loc) {
  if (!value.valid() || value.builder() != this)
    error(loc, fmt::format("output '{}' is not a value of this function", name));
  ir::Function& f = function();
  for (const auto& v : f.values)
    if (v.name == name) error(loc, fmt::format("output name '{}' is already used", name));
  ir::Value& v = f.values[value.id()];
  if (!v.name.empty()) error(loc, fmt::format("output '{}' is already named '{}'", name, v.name));
  v.name = name;
  f.results.push_back(value.id());
}

Tensor FunctionBuilder::emit(OpKind kind, const std::vector<Tensor>& operands, ir::Attrs attrs,
                             const TensorType* declared, Loc loc) {
  std::vector<TensorType> types;
  std::vector<ir::ValueId> ids;
  for (const Tensor& t : operands) {
    if (t.builder() != this)
      error(loc, fmt::format("{}: operand belongs to another function", ir::op_name(kind)));
    types.push_back(t.type());
    ids.push_back(t.id());
  }
  ir::TypeResult r = ir::infer_type(*module_, kind, types, attrs, declared);
  if (!r.ok()) {
    std::string operand_list;
    for (size_t i = 0; i < types.size(); ++i)
      operand_list += (i ? ", " : "") + ir::to_string(types[i]);
    error(loc, fmt::format("{}({}): {}", ir::op_name(kind), operand_list, r.error));
  }
  const ir::ValueId id = function().add_op(kind, std::move(ids), r.type, std::move(attrs));
  // Where the user wrote it, for diagnostics after the passes (ir::SourceLoc).
  ir::SourceLoc& src = function().ops.back().src;
  if (loc.line() == 0) return Tensor(this, id);
  src.file = module_->intern_source(basename(loc.file_name()));
  src.line = static_cast<int32_t>(loc.line());
  const std::string sc = scope();
  if (!sc.empty()) src.scope = module_->intern_source(sc);
  return Tensor(this, id);
}

ModelBuilder::ModelBuilder(std::string name) : module_(std::make_unique<ir::Module>()) {
  module_->name = std::move(name);
}

Dim ModelBuilder::symbol(const std::string& name, int64_t max) {
  if (max < 1) fail("dsl error: symbol '{}' has maximum {}, expected >= 1", name, max);
  if (module_->find_symbol(name)) fail("dsl error: symbol '{}' is declared twice", name);
  module_->symbols.push_back({name, max});
  return Dim::sym(name);
}

void ModelBuilder::set_config(const std::string& key, const std::string& value) {
  module_->config[key] = value;
}

FunctionBuilder& ModelBuilder::function(const std::string& name) {
  if (module_->find_function(name)) fail("dsl error: function '{}' is defined twice", name);
  module_->functions.push_back(ir::Function{});
  module_->functions.back().name = name;
  builders_.push_back(
      std::make_unique<FunctionBuilder>(module_.get(), module_->functions.size() - 1));
  return *builders_.back();
}

ir::Module ModelBuilder::finish() {
  ir::verify_or_throw(*module_, "<dsl>");
  builders_.clear();
  return std::move(*module_);
}

// ---- Ops -------------------------------------------------------------------------

namespace {
Tensor emit(OpKind kind, const std::vector<Tensor>& xs, ir::Attrs attrs, const Loc& loc,
            const TensorType* declared = nullptr) {
  FunctionBuilder* fb = common_builder(xs, loc, ir::op_name(kind));
  return fb->emit(kind, xs, std::move(attrs), declared, loc);
}
}  // namespace

Tensor add(Tensor a, Tensor b, Loc loc) { return emit(OpKind::add, {a, b}, {}, loc); }
Tensor sub(Tensor a, Tensor b, Loc loc) { return emit(OpKind::sub, {a, b}, {}, loc); }
Tensor mul(Tensor a, Tensor b, Loc loc) { return emit(OpKind::mul, {a, b}, {}, loc); }
Tensor div(Tensor a, Tensor b, Loc loc) { return emit(OpKind::div, {a, b}, {}, loc); }
Tensor maximum(Tensor a, Tensor b, Loc loc) { return emit(OpKind::maximum, {a, b}, {}, loc); }
Tensor minimum(Tensor a, Tensor b, Loc loc) { return emit(OpKind::minimum, {a, b}, {}, loc); }

namespace {
// A scalar constant like the operand's tensor, which must be a tensor of a function.
Tensor scalar_like(const Operand& like, double value, const char* op) {
  common_builder({like.tensor}, like.loc, op);
  return scalar(like.tensor, value);
}
}  // namespace

Tensor operator+(Operand a, Operand b) { return add(a.tensor, b.tensor, a.loc); }
Tensor operator-(Operand a, Operand b) { return sub(a.tensor, b.tensor, a.loc); }
Tensor operator*(Operand a, Operand b) { return mul(a.tensor, b.tensor, a.loc); }
Tensor operator/(Operand a, Operand b) { return div(a.tensor, b.tensor, a.loc); }
Tensor operator+(Operand a, double b) { return add(a.tensor, scalar_like(a, b, "add"), a.loc); }
Tensor operator-(Operand a, double b) { return sub(a.tensor, scalar_like(a, b, "sub"), a.loc); }
Tensor operator*(Operand a, double b) { return mul(a.tensor, scalar_like(a, b, "mul"), a.loc); }
Tensor operator/(Operand a, double b) { return div(a.tensor, scalar_like(a, b, "div"), a.loc); }
Tensor operator+(double a, Operand b) { return add(scalar_like(b, a, "add"), b.tensor, b.loc); }
Tensor operator-(double a, Operand b) { return sub(scalar_like(b, a, "sub"), b.tensor, b.loc); }
Tensor operator*(double a, Operand b) { return mul(scalar_like(b, a, "mul"), b.tensor, b.loc); }
Tensor operator/(double a, Operand b) { return div(scalar_like(b, a, "div"), b.tensor, b.loc); }
Tensor operator-(Operand x) { return neg(x.tensor, x.loc); }

Tensor eq(Tensor a, Tensor b, Loc loc) { return emit(OpKind::eq, {a, b}, {}, loc); }
Tensor ne(Tensor a, Tensor b, Loc loc) { return emit(OpKind::ne, {a, b}, {}, loc); }
Tensor lt(Tensor a, Tensor b, Loc loc) { return emit(OpKind::lt, {a, b}, {}, loc); }
Tensor le(Tensor a, Tensor b, Loc loc) { return emit(OpKind::le, {a, b}, {}, loc); }
Tensor gt(Tensor a, Tensor b, Loc loc) { return emit(OpKind::gt, {a, b}, {}, loc); }
Tensor ge(Tensor a, Tensor b, Loc loc) { return emit(OpKind::ge, {a, b}, {}, loc); }
Tensor logical_and(Tensor a, Tensor b, Loc loc) {
  return emit(OpKind::logical_and, {a, b}, {}, loc);
}
Tensor logical_or(Tensor a, Tensor b, Loc loc) { return emit(OpKind::logical_or, {a, b}, {}, loc); }
Tensor logical_not(Tensor a, Loc loc) { return emit(OpKind::logical_not, {a}, {}, loc); }
Tensor relu(Tensor x, Loc loc) { return emit(OpKind::relu, {x}, {}, loc); }
Tensor neg(Tensor x, Loc loc) { return emit(OpKind::neg, {x}, {}, loc); }
Tensor exp(Tensor x, Loc loc) { return emit(OpKind::exp, {x}, {}, loc); }
Tensor log(Tensor x, Loc loc) { return emit(OpKind::log, {x}, {}, loc); }
Tensor sqrt(Tensor x, Loc loc) { return emit(OpKind::sqrt, {x}, {}, loc); }
Tensor rsqrt(Tensor x, Loc loc) { return emit(OpKind::rsqrt, {x}, {}, loc); }
Tensor sin(Tensor x, Loc loc) { return emit(OpKind::sin, {x}, {}, loc); }
Tensor cos(Tensor x, Loc loc) { return emit(OpKind::cos, {x}, {}, loc); }
Tensor abs(Tensor x, Loc loc) { return emit(OpKind::abs, {x}, {}, loc); }
Tensor sign(Tensor x, Loc loc) { return emit(OpKind::sign, {x}, {}, loc); }
Tensor tanh(Tensor x, Loc loc) { return emit(OpKind::tanh, {x}, {}, loc); }
Tensor erf(Tensor x, Loc loc) { return emit(OpKind::erf, {x}, {}, loc); }
Tensor sigmoid(Tensor x, Loc loc) { return emit(OpKind::sigmoid, {x}, {}, loc); }
Tensor gelu(Tensor x, Loc loc) { return emit(OpKind::gelu, {x}, {}, loc); }
Tensor gelu_tanh(Tensor x, Loc loc) { return emit(OpKind::gelu_tanh, {x}, {}, loc); }
Tensor silu(Tensor x, Loc loc) { return emit(OpKind::silu, {x}, {}, loc); }
Tensor select(Tensor c, Tensor a, Tensor b, Loc loc) {
  return emit(OpKind::select, {c, a, b}, {}, loc);
}
Tensor cast(Tensor x, DType dtype, Loc loc) {
  TensorType t{dtype, x.shape()};
  return emit(OpKind::cast, {x}, {}, loc, &t);
}

Tensor scalar(const Tensor& like, double value) { return scalar(like, value, like.dtype()); }
Tensor scalar(const Tensor& like, double value, DType dtype) {
  KILN_ASSERT(like.valid(), "scalar() needs a tensor of the function");
  return like.builder()->constant(value, dtype);
}

Tensor gather(Tensor table, Tensor ids, Loc loc) {
  return emit(OpKind::gather, {table, ids}, {}, loc);
}
Tensor transpose(Tensor x, std::vector<int64_t> perm, Loc loc) {
  return emit(OpKind::transpose, {x}, {{"perm", std::move(perm)}}, loc);
}
Tensor reshape(Tensor x, std::vector<Dim> shape, Loc loc) {
  TensorType t{x.dtype(), std::move(shape)};
  return emit(OpKind::reshape, {x}, {}, loc, &t);
}
Tensor expand(Tensor x, std::vector<Dim> shape, Loc loc) {
  TensorType t{x.dtype(), std::move(shape)};
  return emit(OpKind::expand, {x}, {}, loc, &t);
}
Tensor slice(Tensor x, int64_t axis, int64_t start, Dim extent, Loc loc) {
  TensorType t = x.type();
  int64_t a = ir::normalize_axis(axis, x.rank());
  if (a < 0)
    x.builder()->error(
        loc, fmt::format("slice: axis {} out of range for {}", axis, ir::to_string(x.type())));
  t.shape[a] = extent;
  return emit(OpKind::slice, {x}, {{"axis", axis}, {"start", start}}, loc, &t);
}
Tensor concat(const std::vector<Tensor>& xs, int64_t axis, Loc loc) {
  return emit(OpKind::concat, xs, {{"axis", axis}}, loc);
}
Tensor matmul(Tensor a, Tensor b, Loc loc) { return emit(OpKind::matmul, {a, b}, {}, loc); }
Tensor softmax(Tensor x, int64_t axis, Loc loc) {
  return emit(OpKind::softmax, {x}, {{"axis", axis}}, loc);
}
Tensor rmsnorm(Tensor x, Tensor gamma, double eps, Loc loc) {
  return emit(OpKind::layernorm, {x, gamma}, {{"eps", eps}, {"rms", int64_t{1}}}, loc);
}

Tensor layernorm(Tensor x, Tensor gamma, Tensor beta, double eps, Loc loc) {
  return emit(OpKind::layernorm, {x, gamma, beta}, {{"eps", eps}}, loc);
}
Tensor layernorm(Tensor x, Tensor gamma, Tensor beta, const LayerNormOptions& options, Loc loc) {
  // Only the variant's flags become attributes: the default stays the plain op.
  ir::Attrs attrs{{"eps", options.eps}};
  if (options.unbiased) attrs["unbiased"] = int64_t{1};
  if (options.eps_outside) attrs["eps_outside"] = int64_t{1};
  return emit(OpKind::layernorm, {x, gamma, beta}, std::move(attrs), loc);
}
Tensor cache_write(Tensor cache, Tensor x, Tensor pos, Loc loc) {
  return emit(OpKind::cache_write, {cache, x, pos}, {}, loc);
}
Tensor cache_write(Tensor cache, Tensor x, Loc loc) {
  return emit(OpKind::cache_write, {cache, x}, {}, loc);
}
Tensor cache_attention(Tensor q, Tensor k, Tensor v, Tensor rows, int64_t heads, double scale,
                       Loc loc) {
  return emit(OpKind::cache_attention, {q, k, v, rows}, {{"heads", heads}, {"scale", scale}}, loc);
}
Tensor memory_attention(Tensor q, Tensor k, Tensor v, Tensor src_row, Tensor key_pad, int64_t heads,
                        double scale, Loc loc) {
  return emit(OpKind::memory_attention, {q, k, v, src_row, key_pad},
              {{"heads", heads}, {"scale", scale}}, loc);
}
Tensor reduce_sum(Tensor x, std::vector<int64_t> axes, bool keepdims, Loc loc) {
  return emit(OpKind::reduce_sum, {x}, {{"axes", std::move(axes)}, {"keepdims", int64_t{keepdims}}},
              loc);
}
Tensor reduce_max(Tensor x, std::vector<int64_t> axes, bool keepdims, Loc loc) {
  return emit(OpKind::reduce_max, {x}, {{"axes", std::move(axes)}, {"keepdims", int64_t{keepdims}}},
              loc);
}
Tensor reduce_mean(Tensor x, std::vector<int64_t> axes, bool keepdims, Loc loc) {
  return emit(OpKind::reduce_mean, {x},
              {{"axes", std::move(axes)}, {"keepdims", int64_t{keepdims}}}, loc);
}
Tensor argmax(Tensor x, int64_t axis, Loc loc) {
  return emit(OpKind::argmax, {x}, {{"axis", axis}}, loc);
}

Tensor take_along_axis(Tensor x, Tensor ids, int64_t axis, Loc loc) {
  return emit(OpKind::take_along_axis, {x, ids}, {{"axis", axis}}, loc);
}
Tensor scatter_add(Tensor base, Tensor ids, Tensor src, int64_t axis, Loc loc) {
  return emit(OpKind::scatter_add, {base, ids, src}, {{"axis", axis}}, loc);
}
Tensor topk(Tensor x, int64_t k, Loc loc) { return emit(OpKind::topk, {x}, {{"k", k}}, loc); }
Tensor moe_ffn(Tensor x, Tensor ids, Tensor gates, const std::vector<ExpertWeights>& experts,
               Loc loc) {
  std::vector<Tensor> xs = {x, ids, gates};
  for (const ExpertWeights& e : experts) {
    xs.push_back(e.w1);
    xs.push_back(e.w3);
    xs.push_back(e.w2);
  }
  return emit(OpKind::moe_ffn, xs, {{"experts", static_cast<int64_t>(experts.size())}}, loc);
}

Tensor sinusoid_table(FunctionBuilder& fb, int64_t rows, int64_t dim, Loc loc) {
  TensorType t{DType::f32, {Dim::constant(rows), Dim::constant(dim)}};
  return fb.emit(OpKind::sinusoid_table, {}, {}, &t, loc);
}
Tensor iota(FunctionBuilder& fb, DType dtype, std::vector<Dim> shape, int64_t axis, Loc loc) {
  TensorType t{dtype, std::move(shape)};
  return fb.emit(OpKind::iota, {}, {{"axis", axis}}, &t, loc);
}

}  // namespace kiln::dsl
