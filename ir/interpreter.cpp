// The reference interpreter (see interpreter.h).
//
// How a run goes:
//  1. The function's structure is checked (value ids, SSA order, every op's type
//     rule), so that a module that was never verified cannot make it read out of
//     bounds; such problems throw kiln::Error.
//  2. The inputs are bound to the parameters: dtypes, ranks and constant dims must
//     match, and each symbol gets the size it has in the inputs (the same everywhere,
//     between 1 and its declared maximum). An integer parameter accepts i32 or i64
//     data either way (the values must fit the declared dtype); other dtypes must
//     match exactly.
//  3. The ops run in order. Each result's shape is the op's declared type with the
//     symbols substituted (refused above kMaxInterpreterTensorBytes before anything is
//     allocated), and every op checks that what it computes has that shape.
//
// Numerics (beyond interpreter.h):
//  * f32 elementwise ops use float arithmetic; the math functions (exp, log, tanh, erf,
//    sigmoid, gelu, gelu_tanh, silu) are computed in double and rounded once.
//  * Integer ops compute in int64 with two's complement wrap-around, and i32 results
//    wrap to 32 bits. Integer division truncates toward zero; dividing by zero throws.
//  * cast: f32 -> integer truncates toward zero (a value that is NaN or out of the
//    target's range throws); i64 -> i32 wraps; -> bool is "nonzero".
//  * The fused ops round where their unfused forms do, so a fusion pass changes
//    nothing in the interpreter, except attention's scale (see attention()):
//      linear = float(dot in double) + bias in float, then the activation as its op;
//      add_layernorm = layernorm(float(x + y));
//      attention = matmul, scale, masked_fill(-1e9 or -inf), softmax, matmul.
#include "ir/interpreter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "ir/op_types.h"
#include "ir/printer.h"
#include "support/error.h"
#include "support/int8.h"
#include "support/sinusoid.h"

namespace kiln::ir {

using Shape = std::vector<int64_t>;

namespace {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ",")); }

int64_t rank_of(const Tensor& t) { return static_cast<int64_t>(t.shape.size()); }

// Product of the dims in [begin, end).
int64_t dims_product(const Shape& shape, int64_t begin, int64_t end) {
  int64_t n = 1;
  for (int64_t i = begin; i < end; ++i) n *= shape[i];
  return n;
}

// Row-major strides.
Shape strides_of(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

// The multi-index of flat position `flat` in `shape`.
Shape unravel(int64_t flat, const Shape& shape) {
  Shape index(shape.size());
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    index[i] = shape[i] == 0 ? 0 : flat % shape[i];
    flat = shape[i] == 0 ? 0 : flat / shape[i];
  }
  return index;
}

// Steps a multi-index to the next position in row-major order (last dim fastest).
void next_index(Shape& index, const Shape& shape) {
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    if (++index[i] < shape[i]) return;
    index[i] = 0;
  }
}

// Numpy broadcast of two concrete shapes (right-aligned; a 1 stretches).
Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    KILN_ASSERT(da == db || da == 1 || db == 1,
                fmt::format("shapes {} and {} do not broadcast", shape_str(a), shape_str(b)));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// For an operand of shape `in` broadcast to `out`: the operand's flat index for
// every flat index of `out`.
std::vector<int64_t> broadcast_index_map(const Shape& in, const Shape& out) {
  KILN_ASSERT(in.size() <= out.size(), "broadcast to a smaller rank");
  const size_t lead = out.size() - in.size();
  const Shape in_strides = strides_of(in);
  // Stride of each output dim in the operand (0 where the operand is broadcast).
  Shape strides(out.size(), 0);
  for (size_t i = 0; i < in.size(); ++i) {
    KILN_ASSERT(in[i] == out[lead + i] || in[i] == 1,
                fmt::format("cannot broadcast {} to {}", shape_str(in), shape_str(out)));
    strides[lead + i] = in[i] == 1 ? 0 : in_strides[i];
  }
  const int64_t n = shape_numel(out);
  std::vector<int64_t> map(n);
  Shape index(out.size(), 0);
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t offset = 0;
    for (size_t i = 0; i < out.size(); ++i) offset += index[i] * strides[i];
    map[flat] = offset;
    next_index(index, out);
  }
  return map;
}

// Two's complement arithmetic in int64 (no undefined behaviour on overflow).
int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t wrap_sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

// Fits an int64 result to `dtype`: i32 wraps to 32 bits, bool becomes 0/1.
int64_t fit_int(int64_t v, DType dtype) {
  if (dtype == DType::i32) return static_cast<int32_t>(static_cast<uint32_t>(v));
  if (dtype == DType::boolean) return v != 0 ? 1 : 0;
  return v;
}

bool fits_i32(int64_t v) {
  return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
}

// NaN-propagating float maximum.
float max_f32(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  return a < b ? b : a;
}

// NaN-propagating float minimum.
float min_f32(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  return b < a ? b : a;
}

// Softmax of one lane: max-subtracted, exponentials and their sum in double, each
// result rounded to float once.
std::vector<float> softmax_of(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  if (x.empty()) return y;
  float m = x[0];
  for (float v : x) m = max_f32(m, v);
  std::vector<double> e(x.size());
  double sum = 0;
  for (size_t j = 0; j < x.size(); ++j) {
    e[j] = std::exp(static_cast<double>(x[j]) - static_cast<double>(m));
    sum += e[j];
  }
  for (size_t j = 0; j < x.size(); ++j) y[j] = static_cast<float>(e[j] / sum);
  return y;
}

// Layer normalization of one row: mean and variance in double (biased, or divided by
// n - 1 when `unbiased`: a row of one value then gives NaN, as torch.std does),
// y = (x - mean) / sqrt(var + eps) * gamma + beta (or / (sqrt(var) + eps) when
// `eps_outside`) in double, rounded once.
std::vector<float> layernorm_of(const std::vector<float>& x, const std::vector<float>& gamma,
                                const std::vector<float>& beta, double eps, bool unbiased,
                                bool eps_outside) {
  KILN_ASSERT(gamma.size() == x.size() && beta.size() == x.size(), "layernorm parameter size");
  std::vector<float> y(x.size());
  if (x.empty()) return y;
  const double n = static_cast<double>(x.size());
  double mean = 0;
  for (float v : x) mean += v;
  mean /= n;
  double var = 0;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= unbiased ? n - 1 : n;
  const double inv = eps_outside ? 1.0 / (std::sqrt(var) + eps) : 1.0 / std::sqrt(var + eps);
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = static_cast<float>((x[i] - mean) * inv * static_cast<double>(gamma[i]) +
                              static_cast<double>(beta[i]));
  return y;
}

// RMSNorm of one row: the mean of squares in double, y = x / sqrt(ms + eps) * gamma in
// double, rounded once.
std::vector<float> rmsnorm_of(const std::vector<float>& x, const std::vector<float>& gamma,
                              double eps) {
  KILN_ASSERT(gamma.size() == x.size(), "rmsnorm parameter size");
  std::vector<float> y(x.size());
  if (x.empty()) return y;
  double ms = 0;
  for (float v : x) ms += static_cast<double>(v) * v;
  ms /= static_cast<double>(x.size());
  const double inv = 1.0 / std::sqrt(ms + eps);
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = static_cast<float>(x[i] * inv * static_cast<double>(gamma[i]));
  return y;
}

// Normalizes an attribute axis that the type rule has already accepted.
int64_t axis_of(int64_t axis, int64_t rank) {
  const int64_t a = normalize_axis(axis, rank);
  KILN_ASSERT(a >= 0, fmt::format("axis {} out of range for rank {}", axis, rank));
  return a;
}

// Concatenates tensors of equal dtype and rank that agree outside `axis`.
Tensor concat_tensors(const std::vector<const Tensor*>& parts, int64_t axis) {
  KILN_ASSERT(!parts.empty(), "concat of nothing");
  const Tensor& first = *parts[0];
  const int64_t rank = rank_of(first);
  KILN_ASSERT(axis >= 0 && axis < rank, "concat axis out of range");
  Shape out_shape = first.shape;
  out_shape[axis] = 0;
  for (const Tensor* p : parts) {
    KILN_ASSERT(p->dtype == first.dtype && rank_of(*p) == rank, "concat operands differ");
    for (int64_t i = 0; i < rank; ++i)
      KILN_ASSERT(i == axis || p->shape[i] == first.shape[i], "concat operands differ");
    out_shape[axis] += p->shape[axis];
  }
  Tensor r = Tensor::zeros(first.dtype, out_shape);
  const int64_t outer = dims_product(out_shape, 0, axis);
  const int64_t inner = dims_product(out_shape, axis + 1, rank);
  int64_t pos = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor* p : parts) {
      const int64_t chunk = p->shape[axis] * inner;
      for (int64_t i = 0; i < chunk; ++i, ++pos) {
        if (first.dtype == DType::f32)
          r.f[pos] = p->f[o * chunk + i];
        else
          r.ints[pos] = p->ints[o * chunk + i];
      }
    }
  }
  KILN_ASSERT(pos == r.numel(), "concat size");
  return r;
}

// Checks that a tensor handed in by a user holds data matching its dtype and shape:
// the right number of values, bools as 0/1 and i32 values in range. `who` names it.
void check_tensor_data(const Tensor& t, const std::string& who) {
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (t.shape[i] < 0) fail("{} has shape {}: dim {} is negative", who, shape_str(t.shape), i);
  const int64_t n = t.numel();
  const size_t have = t.dtype == DType::f32 ? t.f.size() : t.ints.size();
  if (static_cast<int64_t>(have) != n)
    fail("{} has type {} ({} elements) but holds {} values", who, t.type_string(), n, have);
  if (t.dtype == DType::f32) return;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = t.ints[i];
    if (t.dtype == DType::boolean && v != 0 && v != 1)
      fail("{} is bool but holds {} at {}", who, v, shape_str(unravel(i, t.shape)));
    if (t.dtype == DType::i32 && !fits_i32(v))
      fail("{} is i32 but holds {} at {}", who, v, shape_str(unravel(i, t.shape)));
  }
}

// ---------------------------------------------------------------------------------
// The ops. Each takes its operands and the result's dtype and concrete shape (the
// declared type with symbols substituted), and returns the result. `where` names the
// op for the errors that data can cause.

Tensor eval_constant(const Op& op, DType dtype, const Shape& shape) {
  Tensor r = Tensor::zeros(dtype, shape);
  const AttrValue& v = op.attrs.at("value");
  if (dtype == DType::f32) {
    const float x = static_cast<float>(op.float_attr("value"));
    std::fill(r.f.begin(), r.f.end(), x);
  } else {
    const int64_t* i = std::get_if<int64_t>(&v);
    // A float value for an integer type is rejected by the type rule, but a bool
    // constant may be written as 1.0.
    const int64_t x = i ? *i : (op.float_attr("value") != 0 ? 1 : 0);
    std::fill(r.ints.begin(), r.ints.end(), fit_int(x, dtype));
  }
  return r;
}

Tensor eval_sinusoid_table(const Shape& shape) {
  KILN_ASSERT(shape.size() == 2, "sinusoid_table rank");
  Tensor r = Tensor::zeros(DType::f32, shape);
  fill_sinusoid_table(shape[0], shape[1], r.f.data());
  return r;
}

Tensor eval_iota(const Op& op, DType dtype, const Shape& shape) {
  const int64_t axis = axis_of(op.int_attr("axis"), static_cast<int64_t>(shape.size()));
  Tensor r = Tensor::zeros(dtype, shape);
  const int64_t len = shape[axis];
  const int64_t inner = dims_product(shape, axis + 1, static_cast<int64_t>(shape.size()));
  for (int64_t i = 0; i < r.numel(); ++i) r.ints[i] = fit_int((i / inner) % len, dtype);
  return r;
}

// f32 -> integer: truncation toward zero; NaN and out-of-range values throw.
int64_t f32_to_int(float x, DType dtype, const std::string& where) {
  // Bounds as exact floats: [-2^31, 2^31) and [-2^63, 2^63).
  const double lo = dtype == DType::i32 ? -2147483648.0 : -9223372036854775808.0;
  const double hi = -lo;
  const double t = std::trunc(static_cast<double>(x));
  if (!(t >= lo && t < hi)) fail("{}: cannot cast {} to {}", where, x, dtype_name(dtype));
  return static_cast<int64_t>(t);
}

// ---------------------------------------------------------------------------------
// The pointwise ops (kPointwise in ir/ops.def): each is one function point_<name> that
// computes an element of the result from its operands' elements at that position, which
// eval_pointwise applies with numpy broadcasting. Their dtypes are those the op's type rule
// accepts.

// One element: `f` of an f32 value, `i` of an integer or bool (0/1) one.
struct Elem {
  float f = 0;
  int64_t i = 0;
};

// What a pointwise function knows besides its operands: their dtype (select's: its
// branches'; cast's: the source's), the result's, and the op for the errors data can cause.
struct PointCtx {
  DType in;
  DType out;
  const std::string& where;
};

using PointFn = Elem (*)(const Elem* x, const PointCtx& c);

Elem real(float f) { return Elem{f, 0}; }
Elem integer(int64_t i) { return Elem{0, i}; }
Elem boolean(bool b) { return Elem{0, b ? 1 : 0}; }

// An f32 math function as PyTorch defines it, evaluated in double and rounded once.
template <typename F>
Elem in_double(const Elem* x, F f) {
  return real(static_cast<float>(f(static_cast<double>(x[0].f))));
}

template <typename Cmp>
Elem compare(const Elem* x, const PointCtx& c, Cmp cmp) {
  return boolean(c.in == DType::f32 ? cmp(x[0].f, x[1].f) : cmp(x[0].i, x[1].i));
}

Elem point_add(const Elem* x, const PointCtx& c) {
  if (c.in == DType::f32) return real(x[0].f + x[1].f);
  return integer(fit_int(wrap_add(x[0].i, x[1].i), c.out));
}
Elem point_sub(const Elem* x, const PointCtx& c) {
  if (c.in == DType::f32) return real(x[0].f - x[1].f);
  return integer(fit_int(wrap_sub(x[0].i, x[1].i), c.out));
}
Elem point_mul(const Elem* x, const PointCtx& c) {
  if (c.in == DType::f32) return real(x[0].f * x[1].f);
  return integer(fit_int(wrap_mul(x[0].i, x[1].i), c.out));
}
Elem point_div(const Elem* x, const PointCtx& c) {
  if (c.in == DType::f32) return real(x[0].f / x[1].f);
  const int64_t a = x[0].i, b = x[1].i;
  if (b == 0) fail("{}: integer division by zero", c.where);
  // The one overflowing quotient wraps, like the other ops.
  if (b == -1) return integer(fit_int(wrap_sub(0, a), c.out));
  return integer(fit_int(a / b, c.out));
}
Elem point_maximum(const Elem* x, const PointCtx& c) {
  if (c.in == DType::f32) return real(max_f32(x[0].f, x[1].f));
  return integer(std::max(x[0].i, x[1].i));
}
Elem point_minimum(const Elem* x, const PointCtx& c) {
  if (c.in == DType::f32) return real(min_f32(x[0].f, x[1].f));
  return integer(std::min(x[0].i, x[1].i));
}
Elem point_eq(const Elem* x, const PointCtx& c) { return compare(x, c, std::equal_to<>()); }
Elem point_ne(const Elem* x, const PointCtx& c) { return compare(x, c, std::not_equal_to<>()); }
Elem point_lt(const Elem* x, const PointCtx& c) { return compare(x, c, std::less<>()); }
Elem point_le(const Elem* x, const PointCtx& c) { return compare(x, c, std::less_equal<>()); }
Elem point_gt(const Elem* x, const PointCtx& c) { return compare(x, c, std::greater<>()); }
Elem point_ge(const Elem* x, const PointCtx& c) { return compare(x, c, std::greater_equal<>()); }
Elem point_logical_and(const Elem* x, const PointCtx&) {
  return boolean(x[0].i != 0 && x[1].i != 0);
}
Elem point_logical_or(const Elem* x, const PointCtx&) {
  return boolean(x[0].i != 0 || x[1].i != 0);
}
Elem point_logical_not(const Elem* x, const PointCtx&) { return boolean(x[0].i == 0); }
Elem point_relu(const Elem* x, const PointCtx& c) {
  if (c.in != DType::f32) return integer(x[0].i > 0 ? x[0].i : 0);
  const float v = x[0].f;
  return real(std::isnan(v) ? v : (v > 0.0f ? v : 0.0f));
}
Elem point_neg(const Elem* x, const PointCtx& c) {
  if (c.in == DType::f32) return real(-x[0].f);
  return integer(fit_int(wrap_sub(0, x[0].i), c.out));
}
Elem point_exp(const Elem* x, const PointCtx&) {
  return in_double(x, [](double v) { return std::exp(v); });
}
Elem point_sqrt(const Elem* x, const PointCtx&) { return real(std::sqrt(x[0].f)); }
Elem point_log(const Elem* x, const PointCtx&) {
  return in_double(x, [](double v) { return std::log(v); });
}
Elem point_tanh(const Elem* x, const PointCtx&) {
  return in_double(x, [](double v) { return std::tanh(v); });
}
Elem point_erf(const Elem* x, const PointCtx&) {
  return in_double(x, [](double v) { return std::erf(v); });
}
Elem point_sigmoid(const Elem* x, const PointCtx&) {
  return in_double(x, [](double v) { return 1.0 / (1.0 + std::exp(-v)); });
}
Elem point_gelu(const Elem* x, const PointCtx&) {
  constexpr double kSqrtHalf = 0.70710678118654752440;  // 1/√2
  return in_double(x, [](double v) { return 0.5 * v * (1.0 + std::erf(v * kSqrtHalf)); });
}
Elem point_gelu_tanh(const Elem* x, const PointCtx&) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;  // √(2/π)
  return in_double(x, [](double v) {
    return 0.5 * v * (1.0 + std::tanh(kSqrt2OverPi * (v + 0.044715 * v * v * v)));
  });
}
Elem point_silu(const Elem* x, const PointCtx&) {
  return in_double(x, [](double v) { return v / (1.0 + std::exp(-v)); });
}
Elem point_sign(const Elem* x, const PointCtx&) {
  const float v = x[0].f;
  if (std::isnan(v)) return real(v);
  return real(v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : 0.0f));
}
Elem point_sin(const Elem* x, const PointCtx&) {
  return in_double(x, [](double v) { return std::sin(v); });
}
Elem point_cos(const Elem* x, const PointCtx&) {
  return in_double(x, [](double v) { return std::cos(v); });
}
Elem point_rsqrt(const Elem* x, const PointCtx&) {
  return in_double(x, [](double v) { return 1.0 / std::sqrt(v); });
}
Elem point_abs(const Elem* x, const PointCtx& c) {
  if (c.in == DType::f32) return real(std::fabs(x[0].f));
  return integer(x[0].i < 0 ? fit_int(wrap_sub(0, x[0].i), c.out) : x[0].i);
}
Elem point_select(const Elem* x, const PointCtx&) { return x[0].i != 0 ? x[1] : x[2]; }
// f32 -> integer truncates (f32_to_int), i64 -> i32 wraps, -> bool is "nonzero".
Elem point_cast(const Elem* x, const PointCtx& c) {
  if (c.in == DType::f32) {
    const float v = x[0].f;
    if (c.out == DType::f32) return real(v);
    if (c.out == DType::boolean) return boolean(v != 0.0f);
    return integer(f32_to_int(v, c.out, c.where));
  }
  if (c.out == DType::f32) return real(static_cast<float>(x[0].i));
  return integer(fit_int(x[0].i, c.out));
}

// expand: the operand's element at the broadcast position (eval_pointwise maps it).
Elem point_expand(const Elem* x, const PointCtx&) { return x[0]; }

// The point_<name> of each pointwise op, or nullptr.
PointFn point_fn(OpKind kind) {
  switch (kind) {
#define KILN_OP(name, ...)
#define KILN_POINTWISE_OP(name, ...) \
  case OpKind::name:                 \
    return &point_##name;
#include "ir/ops.def"
    default:
      return nullptr;
  }
}

// A pointwise op of `kind` on `in` with numpy broadcasting, into `dtype` and `shape`.
Tensor eval_pointwise(OpKind kind, const std::vector<const Tensor*>& in, DType dtype,
                      const Shape& shape, const std::string& where) {
  const PointFn fn = point_fn(kind);
  constexpr size_t kMaxOperands = 3;
  KILN_ASSERT(fn && in.size() == static_cast<size_t>(op_info(kind).min_operands) &&
                  in.size() <= kMaxOperands,
              fmt::format("{} is not a pointwise op of {} operands", op_name(kind), in.size()));
  // The operands' dtype: the last operand's (select's condition is bool, its branches not).
  const PointCtx ctx{in.back()->dtype, dtype, where};
  // expand broadcasts its operand to the declared shape.
  Shape broadcast = kind == OpKind::expand ? shape : in[0]->shape;
  for (size_t k = 0; k < in.size(); ++k) {
    KILN_ASSERT(in[k]->dtype == ctx.in || (op_info(kind).rule == TypeRule::select && k == 0),
                "pointwise operand dtypes differ");
    broadcast = broadcast_shapes(broadcast, in[k]->shape);
  }
  KILN_ASSERT(broadcast == shape, "pointwise result shape");
  // Each operand's flat index per result index; none for an operand of the result's shape.
  std::vector<std::vector<int64_t>> maps(in.size());
  for (size_t k = 0; k < in.size(); ++k)
    if (in[k]->shape != shape) maps[k] = broadcast_index_map(in[k]->shape, shape);
  Tensor r = Tensor::zeros(dtype, shape);
  const int64_t n = r.numel();
  Elem x[kMaxOperands];
  for (int64_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < in.size(); ++k) {
      const Tensor& t = *in[k];
      const int64_t at = maps[k].empty() ? i : maps[k][i];
      if (t.dtype == DType::f32)
        x[k].f = t.f[at];
      else
        x[k].i = t.ints[at];
    }
    const Elem y = fn(x, ctx);
    if (dtype == DType::f32)
      r.f[i] = y.f;
    else
      r.ints[i] = y.i;
  }
  return r;
}

Tensor eval_gather(const Tensor& table, const Tensor& ids, const Shape& shape,
                   const std::string& ids_name) {
  KILN_ASSERT(rank_of(table) >= 1 && is_integer(ids.dtype), "gather operands");
  Shape want = ids.shape;
  want.insert(want.end(), table.shape.begin() + 1, table.shape.end());
  KILN_ASSERT(want == shape, "gather result shape");
  const int64_t vocab = table.shape[0];
  const int64_t row = dims_product(table.shape, 1, rank_of(table));
  Tensor r = Tensor::zeros(table.dtype, shape);
  for (int64_t p = 0; p < ids.numel(); ++p) {
    const int64_t id = ids.ints[p];
    if (id < 0 || id >= vocab)
      fail("token id {} at {}{} is out of range [0, {})", id, ids_name,
           shape_str(unravel(p, ids.shape)), vocab);
    for (int64_t j = 0; j < row; ++j) {
      if (table.dtype == DType::f32)
        r.f[p * row + j] = table.f[id * row + j];
      else
        r.ints[p * row + j] = table.ints[id * row + j];
    }
  }
  return r;
}

// An element of t at flat position i, as double (integers beyond 2^53 are not expected).
double value_at(const Tensor& t, int64_t i) {
  return t.dtype == DType::f32 ? static_cast<double>(t.f[i]) : static_cast<double>(t.ints[i]);
}

// take_along_axis(x, ids) {axis}: result[i] = x[i with i[axis] = ids[i]].
Tensor eval_take_along_axis(const Op& op, const Tensor& x, const Tensor& ids, const Shape& shape,
                            const std::string& ids_name) {
  const int64_t rank = rank_of(x);
  const int64_t axis = axis_of(op.int_attr("axis"), rank);
  KILN_ASSERT(ids.shape == shape && rank_of(ids) == rank, "take_along_axis result shape");
  const Shape xs = strides_of(x.shape);
  const int64_t len = x.shape[axis];
  Tensor r = Tensor::zeros(x.dtype, shape);
  Shape index(shape.size(), 0);
  for (int64_t p = 0; p < r.numel(); ++p, next_index(index, shape)) {
    const int64_t id = ids.ints[p];
    if (id < 0 || id >= len)
      fail("index {} at {}{} is out of range [0, {})", id, ids_name, shape_str(index), len);
    int64_t at = 0;
    for (int64_t d = 0; d < rank; ++d) at += (d == axis ? id : index[d]) * xs[d];
    if (x.dtype == DType::f32)
      r.f[p] = x.f[at];
    else
      r.ints[p] = x.ints[at];
  }
  return r;
}

// scatter_add(base, ids, src) {axis}: base with result[j] += src[i], j = i with j[axis] =
// ids[i], in row-major order of i (f32 sums in float, integers wrapping).
Tensor eval_scatter_add(const Op& op, const Tensor& base, const Tensor& ids, const Tensor& src,
                        const Shape& shape, const std::string& ids_name) {
  const int64_t rank = rank_of(base);
  const int64_t axis = axis_of(op.int_attr("axis"), rank);
  KILN_ASSERT(base.shape == shape && ids.shape == src.shape && rank_of(src) == rank,
              "scatter_add shapes");
  const Shape bs = strides_of(base.shape);
  const int64_t len = base.shape[axis];
  Tensor r = base;
  Shape index(src.shape.size(), 0);
  for (int64_t p = 0; p < src.numel(); ++p, next_index(index, src.shape)) {
    const int64_t id = ids.ints[p];
    if (id < 0 || id >= len)
      fail("index {} at {}{} is out of range [0, {})", id, ids_name, shape_str(index), len);
    int64_t at = 0;
    for (int64_t d = 0; d < rank; ++d) at += (d == axis ? id : index[d]) * bs[d];
    if (r.dtype == DType::f32)
      r.f[at] = r.f[at] + src.f[p];
    else
      r.ints[at] = fit_int(wrap_add(r.ints[at], src.ints[p]), r.dtype);
  }
  return r;
}

// topk(x) {k}: per row of the last axis, the indices of the k largest elements, largest
// first, ties to the lower index, NaN above every number (torch.topk).
Tensor eval_topk(const Op& op, const Tensor& x, const Shape& shape, const std::string& where) {
  const int64_t k = op.int_attr("k");
  const int64_t len = x.shape.back();
  Shape want = x.shape;
  want.back() = k;
  KILN_ASSERT(want == shape, "topk result shape");
  if (k > len) fail("{}: k = {} exceeds the last axis of {}", where, k, x.type_string());
  const int64_t rows = len == 0 ? 0 : x.numel() / len;
  Tensor r = Tensor::zeros(DType::i64, shape);
  std::vector<int64_t> order(static_cast<size_t>(len));
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t j = 0; j < len; ++j) order[j] = j;
    auto before = [&](int64_t a, int64_t b) {
      const double va = value_at(x, row * len + a), vb = value_at(x, row * len + b);
      if (std::isnan(va) != std::isnan(vb)) return std::isnan(va);
      if (!std::isnan(va) && va != vb) return va > vb;
      return a < b;
    };
    std::stable_sort(order.begin(), order.end(), before);
    for (int64_t j = 0; j < k; ++j) r.ints[row * k + j] = order[j];
  }
  return r;
}

Tensor eval_transpose(const Op& op, const Tensor& x, const Shape& shape) {
  const std::vector<int64_t>& perm = op.ints_attr("perm");
  const int64_t rank = rank_of(x);
  KILN_ASSERT(
      static_cast<int64_t>(perm.size()) == rank && static_cast<int64_t>(shape.size()) == rank,
      "transpose rank");
  for (int64_t k = 0; k < rank; ++k)
    KILN_ASSERT(perm[k] >= 0 && perm[k] < rank && shape[k] == x.shape[perm[k]],
                "transpose result shape");
  const Shape in_strides = strides_of(x.shape);
  Tensor r = Tensor::zeros(x.dtype, shape);
  Shape out_index(rank, 0);
  for (int64_t flat = 0; flat < r.numel(); ++flat) {
    int64_t src = 0;  // in[..., out_index[k] at dim perm[k], ...]
    for (int64_t k = 0; k < rank; ++k) src += out_index[k] * in_strides[perm[k]];
    if (x.dtype == DType::f32)
      r.f[flat] = x.f[src];
    else
      r.ints[flat] = x.ints[src];
    next_index(out_index, shape);
  }
  return r;
}

Tensor eval_reshape(const Tensor& x, const Shape& shape) {
  KILN_ASSERT(shape_numel(shape) == x.numel(), "reshape element count");
  Tensor r = x;
  r.shape = shape;
  return r;
}

Tensor eval_slice(const Op& op, const Tensor& x, const Shape& shape, const std::string& where) {
  const int64_t rank = rank_of(x);
  const int64_t axis = axis_of(op.int_attr("axis"), rank);
  const int64_t start = op.int_attr("start");
  KILN_ASSERT(static_cast<int64_t>(shape.size()) == rank, "slice rank");
  for (int64_t i = 0; i < rank; ++i)
    KILN_ASSERT(i == axis || shape[i] == x.shape[i], "slice result shape");
  const int64_t extent = shape[axis];
  // The verifier only knows the symbols' maxima; the actual sizes are checked here.
  if (start < 0 || start + extent > x.shape[axis])
    fail("{}: slice [{}, {}) of axis {} exceeds its extent {}", where, start, start + extent, axis,
         x.shape[axis]);
  Tensor r = Tensor::zeros(x.dtype, shape);
  const int64_t outer = dims_product(shape, 0, axis);
  const int64_t inner = dims_product(shape, axis + 1, rank);
  const int64_t in_len = x.shape[axis];
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < extent; ++j) {
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t dst = (o * extent + j) * inner + i;
        const int64_t src = (o * in_len + start + j) * inner + i;
        if (x.dtype == DType::f32)
          r.f[dst] = x.f[src];
        else
          r.ints[dst] = x.ints[src];
      }
    }
  }
  return r;
}

Tensor eval_matmul(const Tensor& a, const Tensor& b, const Shape& shape) {
  const int64_t ra = rank_of(a), rb = rank_of(b);
  KILN_ASSERT(ra >= 2 && rb >= 2 && a.dtype == DType::f32 && b.dtype == DType::f32,
              "matmul operands");
  const int64_t m = a.shape[ra - 2], k = a.shape[ra - 1], n = b.shape[rb - 1];
  KILN_ASSERT(b.shape[rb - 2] == k, "matmul contraction dims differ");
  const Shape a_batch(a.shape.begin(), a.shape.end() - 2);
  const Shape b_batch(b.shape.begin(), b.shape.end() - 2);
  Shape batch = broadcast_shapes(a_batch, b_batch);
  Shape want = batch;
  want.push_back(m);
  want.push_back(n);
  KILN_ASSERT(want == shape, "matmul result shape");
  const std::vector<int64_t> amap = broadcast_index_map(a_batch, batch);
  const std::vector<int64_t> bmap = broadcast_index_map(b_batch, batch);
  Tensor r = Tensor::zeros(DType::f32, shape);
  for (int64_t bi = 0; bi < shape_numel(batch); ++bi) {
    const int64_t a0 = amap[bi] * m * k, b0 = bmap[bi] * k * n, c0 = bi * m * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p)
          sum +=
              static_cast<double>(a.f[a0 + i * k + p]) * static_cast<double>(b.f[b0 + p * n + j]);
        r.f[c0 + i * n + j] = static_cast<float>(sum);
      }
    }
  }
  return r;
}

Tensor eval_softmax(const Op& op, const Tensor& x, const Shape& shape) {
  KILN_ASSERT(x.dtype == DType::f32 && x.shape == shape, "softmax operand");
  const int64_t rank = rank_of(x);
  const int64_t axis = axis_of(op.int_attr("axis"), rank);
  const int64_t outer = dims_product(shape, 0, axis), len = shape[axis];
  const int64_t inner = dims_product(shape, axis + 1, rank);
  Tensor r = Tensor::zeros(DType::f32, shape);
  std::vector<float> lane(len);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      for (int64_t j = 0; j < len; ++j) lane[j] = x.f[(o * len + j) * inner + i];
      const std::vector<float> y = softmax_of(lane);
      for (int64_t j = 0; j < len; ++j) r.f[(o * len + j) * inner + i] = y[j];
    }
  }
  return r;
}

// layernorm over the last axis; `x` is the (already summed, for add_layernorm) input and
// `op` the layernorm or add_layernorm (its eps, unbiased and eps_outside).
// `beta` is null for an RMSNorm (rms = 1).
Tensor eval_layernorm(const Op& op, const Tensor& x, const Tensor& gamma, const Tensor* beta,
                      const Shape& shape) {
  KILN_ASSERT(x.dtype == DType::f32 && x.shape == shape && !shape.empty(), "layernorm operand");
  const int64_t d = shape.back();
  const bool rms = op.has_attr("rms") && op.int_attr("rms") == 1;
  KILN_ASSERT(gamma.shape == Shape{d} && (rms ? !beta : beta && beta->shape == Shape{d}),
              "layernorm gamma/beta shape");
  const double eps = op.float_attr("eps");
  const bool unbiased = op.has_attr("unbiased") && op.int_attr("unbiased") == 1;
  const bool eps_outside = op.has_attr("eps_outside") && op.int_attr("eps_outside") == 1;
  Tensor r = Tensor::zeros(DType::f32, shape);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  std::vector<float> row(d);
  for (int64_t i = 0; i < rows; ++i) {
    std::copy(x.f.begin() + i * d, x.f.begin() + (i + 1) * d, row.begin());
    const std::vector<float> y =
        rms ? rmsnorm_of(row, gamma.f, eps)
            : layernorm_of(row, gamma.f, beta->f, eps, unbiased, eps_outside);
    std::copy(y.begin(), y.end(), r.f.begin() + i * d);
  }
  return r;
}

Tensor eval_reduce(const Op& op, const Tensor& x, DType dtype, const Shape& shape) {
  const int64_t rank = rank_of(x);
  const bool keepdims = op.has_attr("keepdims") && op.int_attr("keepdims") != 0;
  std::vector<bool> reduced(rank, false);
  for (int64_t axis : op.ints_attr("axes")) reduced[axis_of(axis, rank)] = true;
  // The result with reduced dims kept as 1, and the result as declared.
  Shape kept = x.shape, want;
  for (int64_t i = 0; i < rank; ++i) {
    if (reduced[i]) kept[i] = 1;
    if (!reduced[i] || keepdims) want.push_back(kept[i]);
  }
  KILN_ASSERT(want == shape && x.dtype == dtype, "reduce result shape");
  const int64_t nout = shape_numel(kept);
  const int64_t count = nout == 0 ? 0 : x.numel() / nout;  // elements per result
  const Shape kept_strides = strides_of(kept);
  // Accumulators: double for f32 sums, float for f32 max, int64 for integers.
  std::vector<double> dsum(nout, 0.0);
  std::vector<float> fmax(nout, -std::numeric_limits<float>::infinity());
  std::vector<int64_t> iacc(
      nout, op.kind == OpKind::reduce_max ? std::numeric_limits<int64_t>::min() : 0);
  Shape index(rank, 0);
  for (int64_t flat = 0; flat < x.numel(); ++flat, next_index(index, x.shape)) {
    int64_t o = 0;
    for (int64_t i = 0; i < rank; ++i) o += (reduced[i] ? 0 : index[i]) * kept_strides[i];
    if (x.dtype == DType::f32) {
      dsum[o] += static_cast<double>(x.f[flat]);
      fmax[o] = max_f32(fmax[o], x.f[flat]);
    } else if (op.kind == OpKind::reduce_max) {
      iacc[o] = std::max(iacc[o], x.ints[flat]);
    } else {
      iacc[o] = wrap_add(iacc[o], x.ints[flat]);
    }
  }
  Tensor r = Tensor::zeros(dtype, shape);
  for (int64_t o = 0; o < nout; ++o) {
    if (dtype != DType::f32) {
      r.ints[o] = fit_int(iacc[o], dtype);
    } else if (op.kind == OpKind::reduce_max) {
      r.f[o] = fmax[o];
    } else if (op.kind == OpKind::reduce_sum) {
      r.f[o] = static_cast<float>(dsum[o]);
    } else {
      r.f[o] = static_cast<float>(dsum[o] / static_cast<double>(count));
    }
  }
  return r;
}

Tensor eval_argmax(const Op& op, const Tensor& x, const Shape& shape, const std::string& where) {
  const int64_t rank = rank_of(x);
  const int64_t axis = axis_of(op.int_attr("axis"), rank);
  Shape want = x.shape;
  want.erase(want.begin() + axis);
  KILN_ASSERT(want == shape, "argmax result shape");
  const int64_t outer = dims_product(x.shape, 0, axis), len = x.shape[axis];
  const int64_t inner = dims_product(x.shape, axis + 1, rank);
  Tensor r = Tensor::zeros(DType::i64, shape);
  if (len == 0 && r.numel() > 0) fail("{}: argmax over an empty axis", where);
  // Compares as double (exact for f32; integers beyond 2^53 are not expected here).
  auto value = [&](int64_t i) {
    return x.dtype == DType::f32 ? static_cast<double>(x.f[i]) : static_cast<double>(x.ints[i]);
  };
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      double best_v = value(o * len * inner + i);
      for (int64_t j = 1; j < len; ++j) {
        const double v = value((o * len + j) * inner + i);
        // The first maximum wins; a NaN counts as the maximum (as in PyTorch).
        if (std::isnan(best_v)) break;
        if (std::isnan(v) || v > best_v) {
          best = j;
          best_v = v;
        }
      }
      r.ints[o * inner + i] = best;
    }
  }
  return r;
}

// f32 rounded to bf16 as the bf16 kernels do (AVX512-BF16's vcvtne2ps2bf16, and vdpbf16ps
// reading bf16 subnormals as zero), kept as an f32: to the nearest bf16, ties to even; zero
// and subnormals (exponent 0) to a zero of their sign; NaN stays NaN.
float round_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return x;
  if ((bits & 0x7f800000u) == 0)
    bits &= 0x80000000u;
  else
    bits = ((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16) << 16;
  std::memcpy(&x, &bits, 4);
  return x;
}

enum class LinearRounding { none, bf16, int8 };

// One weight row of n f32 values quantized as support/int8.h does it; returns its scale.
float quantize_weight_row(const float* v, int64_t n, int8_t* q) {
  const float absmax = int8::absmax(v, n), inverse = int8::inverse_scale(absmax);
  for (int64_t i = 0; i < n; ++i) q[i] = int8::quantize(v[i], inverse);
  return int8::scale(absmax);
}

// One input row: its levels less the zero point (u − z), and its step.
float quantize_input_row(const float* v, int64_t n, int32_t* levels) {
  const int8::InputRow q = int8::input_row(v, n);
  for (int64_t i = 0; i < n; ++i)
    levels[i] = int8::quantize_input(v[i], q) - static_cast<int32_t>(q.zero);
  return q.step;
}

Tensor eval_linear(const Op& op, const Tensor& x, const Tensor& w, const Tensor* bias,
                   const Shape& shape, LinearRounding rounding) {
  const bool bf16 = rounding == LinearRounding::bf16, int8 = rounding == LinearRounding::int8;
  const int64_t rank = rank_of(x);
  KILN_ASSERT(rank >= 1 && rank_of(w) == 2 && w.shape[1] == x.shape.back(), "linear operands");
  const int64_t n = w.shape[0], k = w.shape[1];
  KILN_ASSERT(!bias || bias->shape == Shape{n}, "linear bias shape");
  Shape want = x.shape;
  want.back() = n;
  KILN_ASSERT(want == shape, "linear result shape");
  // The activation as its pointwise op computes it.
  const std::string& act_name = op.str_attr("act");
  const PointFn act = act_name == "none" ? nullptr : point_fn(*parse_op_kind(act_name));
  const std::string where;  // f32 activations cannot fail
  const PointCtx ctx{DType::f32, DType::f32, where};
  Tensor r = Tensor::zeros(DType::f32, shape);
  const int64_t rows =
      k == 0 ? shape_numel(Shape(x.shape.begin(), x.shape.end() - 1)) : x.numel() / k;
  // int8: the weight's rows quantized once, each input row in turn.
  std::vector<int8_t> wq;
  std::vector<int32_t> xq;
  std::vector<float> wscale;
  if (int8) {
    wq.resize(static_cast<size_t>(n * k));
    xq.resize(static_cast<size_t>(k));
    for (int64_t j = 0; j < n; ++j)
      wscale.push_back(quantize_weight_row(w.f.data() + j * k, k, wq.data() + j * k));
  }
  for (int64_t row = 0; row < rows; ++row) {
    const float xscale = int8 ? quantize_input_row(x.f.data() + row * k, k, xq.data()) : 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      if (int8) {
        int64_t exact = 0;
        for (int64_t p = 0; p < k; ++p)
          exact += int64_t{xq[static_cast<size_t>(p)]} * wq[static_cast<size_t>(j * k + p)];
        // As the kernel scales it: f32(Σ) · (x's step · the weight row's scale), in f32.
        sum = static_cast<float>(exact) * (xscale * wscale[static_cast<size_t>(j)]);
      } else if (bf16)
        for (int64_t p = 0; p < k; ++p)
          sum += static_cast<double>(round_to_bf16(x.f[row * k + p])) *
                 static_cast<double>(round_to_bf16(w.f[j * k + p]));
      else
        for (int64_t p = 0; p < k; ++p)
          sum += static_cast<double>(x.f[row * k + p]) * static_cast<double>(w.f[j * k + p]);
      float y = static_cast<float>(sum);  // as matmul rounds it
      if (bias) y = y + bias->f[j];       // as a separate add would
      if (act) {
        const Elem e = real(y);
        y = act(&e, ctx).f;
      }
      r.f[row * n + j] = y;
    }
  }
  return r;
}

// attention(q[B,Lq,H*Dk], k[B,Lk,KV*Dk], v[B,Lk,KV*Dv] [, key_pad bool[B,Lk]] [, query_pad
// bool[B,Lq]] [, bias f32[B',H',Lq',Lk']]) {heads, scale, causal, fill_inf, query_pad,
// kv_heads, bias, window, softcap}. Per batch b, head h (reading kv head h / (H / KV)) and
// query i: s_j = float(q·k in double) * float(scale) (in float), then tanh(s_j / softcap) *
// softcap (in float) with softcap, then + bias[b,h,i,j] (broadcast), replaced by the fill
// (-1e9, or -inf with fill_inf) where masked (causal and j > i, or window and i - j >= window,
// or key_pad[b,j], or query_pad[b,i]); p = softmax(s) (NaN for a row of -inf);
// out[b,i,h*Dv+e] = float(sum_j p_j v[b,j,g*Dv+e] in double), g the kv head.
// With `bf16` (InterpretOptions::bf16_attention), as the bf16 kernel computes it: q and k
// rounded to bf16 before the dot products; a row whose largest score is finite weighs key j
// by u_j = bf16(exp(s_j - max)) (in float) and divides by Σ u_j, v rounded to bf16.
Tensor eval_attention(const Op& op, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor* key_pad, const Tensor* query_pad, const Tensor* bias,
                      const Shape& shape, bool bf16) {
  const int64_t heads = op.int_attr("heads");
  const int64_t kv_heads = op.has_attr("kv_heads") ? op.int_attr("kv_heads") : heads;
  const float scale = static_cast<float>(op.float_attr("scale"));
  const bool causal = op.has_attr("causal") && op.int_attr("causal") != 0;
  const int64_t window = op.has_attr("window") ? op.int_attr("window") : 0;
  const float softcap = op.has_attr("softcap") ? static_cast<float>(op.float_attr("softcap")) : 0;
  const float fill = op.has_attr("fill_inf") && op.int_attr("fill_inf") != 0
                         ? -std::numeric_limits<float>::infinity()
                         : -1e9f;
  KILN_ASSERT(rank_of(q) == 3 && rank_of(k) == 3 && rank_of(v) == 3 && heads >= 1 &&
                  kv_heads >= 1 && heads % kv_heads == 0,
              "attention operand ranks");
  const int64_t batch = q.shape[0], lq = q.shape[1], lk = k.shape[1];
  const int64_t group = heads / kv_heads;
  KILN_ASSERT(k.shape[0] == batch && v.shape[0] == batch && v.shape[1] == lk &&
                  q.shape[2] % heads == 0 && v.shape[2] % kv_heads == 0 &&
                  k.shape[2] == q.shape[2] / heads * kv_heads,
              "attention operand shapes");
  KILN_ASSERT(!key_pad || key_pad->shape == (Shape{batch, lk}), "attention key_pad shape");
  KILN_ASSERT(!query_pad || query_pad->shape == (Shape{batch, lq}), "attention query_pad shape");
  KILN_ASSERT(!bias || rank_of(*bias) == 4, "attention bias rank");
  const int64_t dk = q.shape[2] / heads, dv = v.shape[2] / kv_heads;
  KILN_ASSERT(shape == (Shape{batch, lq, heads * dv}), "attention result shape");
  bf16 = bf16 && dk % 2 == 0;  // the bf16 kernel's condition (an odd dk stays f32)
  // The bias element of (b, h, i, j), broadcast over its dims of extent 1.
  auto bias_at = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    const Shape& bs = bias->shape;
    const int64_t idx[4] = {bs[0] == 1 ? 0 : b, bs[1] == 1 ? 0 : h, bs[2] == 1 ? 0 : i,
                            bs[3] == 1 ? 0 : j};
    return bias->f[((idx[0] * bs[1] + idx[1]) * bs[2] + idx[2]) * bs[3] + idx[3]];
  };
  Tensor r = Tensor::zeros(DType::f32, shape);
  std::vector<float> scores(lk);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < lq; ++i) {
        const bool row_masked = query_pad && query_pad->ints[b * lq + i] != 0;
        for (int64_t j = 0; j < lk; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < dk; ++d) {
            float qd = q.f[(b * lq + i) * heads * dk + h * dk + d];
            float kd = k.f[(b * lk + j) * kv_heads * dk + g * dk + d];
            if (bf16) qd = round_to_bf16(qd), kd = round_to_bf16(kd);
            dot += static_cast<double>(qd) * static_cast<double>(kd);
          }
          const bool masked = row_masked || (causal && j > i) || (window > 0 && i - j >= window) ||
                              (key_pad && key_pad->ints[b * lk + j] != 0);
          float s = static_cast<float>(dot) * scale;
          if (softcap > 0) s = std::tanh(s / softcap) * softcap;
          if (bias) s += bias_at(b, h, i, j);
          scores[j] = masked ? fill : s;
        }
        std::vector<float> p = softmax_of(scores);
        float row_max = -std::numeric_limits<float>::infinity();
        for (float x : scores) row_max = max_f32(row_max, x);
        const bool rounded = bf16 && std::isfinite(row_max);
        double total = 1;
        if (rounded) {  // unnormalized weights, rounded, and their sum
          total = 0;
          for (int64_t j = 0; j < lk; ++j) {
            p[j] = round_to_bf16(std::exp(scores[j] - row_max));
            total += p[j];
          }
        }
        for (int64_t e = 0; e < dv; ++e) {
          double sum = 0;
          for (int64_t j = 0; j < lk; ++j) {
            const float ve = v.f[(b * lk + j) * kv_heads * dv + g * dv + e];
            sum +=
                static_cast<double>(p[j]) * static_cast<double>(rounded ? round_to_bf16(ve) : ve);
          }
          r.f[(b * lq + i) * heads * dv + h * dv + e] = static_cast<float>(sum / total);
        }
      }
    }
  }
  return r;
}

// An index read from `ids` at flat position p, checked against [0, limit).
int64_t checked_index(const Tensor& ids, int64_t p, int64_t limit, const std::string& ids_name,
                      const char* what) {
  const int64_t id = ids.ints[p];
  if (id < 0 || id >= limit)
    fail("{} {} at {}{} is out of range [0, {})", what, id, ids_name,
         shape_str(unravel(p, ids.shape)), limit);
  return id;
}

// pos null: x [N, L, D] goes to rows 0..L-1 (a prompt pass); else x [N, 1, D] to row pos.
Tensor eval_cache_write(const Tensor& cache, const Tensor& x, const Tensor* pos, const Shape& shape,
                        const std::string& pos_name) {
  KILN_ASSERT(rank_of(cache) == 3 && rank_of(x) == 3 && (!pos || x.shape[1] == 1) &&
                  x.shape[2] == cache.shape[2] && (!pos || pos->numel() == 1) &&
                  shape == cache.shape,
              "cache_write operand shapes");
  const int64_t slots = cache.shape[1], d = cache.shape[2], len = x.shape[1];
  if (x.shape[0] > slots) fail("cache_write: {} rows for a cache of {} slots", x.shape[0], slots);
  if (len > cache.shape[0])
    fail("cache_write: {} positions for a cache of {}", len, cache.shape[0]);
  const int64_t t = pos ? checked_index(*pos, 0, cache.shape[0], pos_name, "position") : 0;
  Tensor r = cache;
  for (int64_t n = 0; n < x.shape[0]; ++n)
    for (int64_t l = 0; l < len; ++l)
      for (int64_t e = 0; e < d; ++e)
        r.f[((t + l) * slots + n) * d + e] = x.f[(n * len + l) * d + e];
  return r;
}

// cache_attention and memory_attention: one query row per sequence n; key j of row n is
// k[key_row(n, j), key_col(n, j)] (a row of the [A0, A1, H·dk] tensor k).
Tensor eval_step_attention(const Op& op, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& index, const Tensor* key_pad, const Tensor* bias,
                           const Shape& shape, const std::string& index_name) {
  const int64_t heads = op.int_attr("heads");
  const int64_t groups = op.has_attr("kv_heads") ? op.int_attr("kv_heads") : heads;
  const int64_t window = op.has_attr("window") ? op.int_attr("window") : -1;
  const float scale = static_cast<float>(op.float_attr("scale"));
  const bool cache = op.kind == OpKind::cache_attention;
  KILN_ASSERT(rank_of(q) == 3 && rank_of(k) == 3 && rank_of(v) == 3 && q.shape[1] == 1,
              "step attention operand ranks");
  const int64_t rows = q.shape[0], a1 = k.shape[1];
  const int64_t dk = q.shape[2] / heads, dv = v.shape[2] / groups, rep = heads / groups;
  KILN_ASSERT(shape == (Shape{rows, 1, heads * dv}), "step attention result shape");
  // Keys per row: P (the row table's width; at most the cache's T) or S.
  const int64_t lk = cache ? index.shape[1] : k.shape[1];
  if (cache && lk > k.shape[0])
    fail("cache_attention: {} has {} positions, more than the cache's {}", index_name, lk,
         k.shape[0]);
  Tensor r = Tensor::zeros(DType::f32, shape);
  std::vector<int64_t> key_at(lk);  // the row of k (flattened [A0·A1]) holding key j
  std::vector<float> scores(lk);
  for (int64_t n = 0; n < rows; ++n) {
    const int64_t b = cache ? 0 : checked_index(index, n, k.shape[0], index_name, "source row");
    // A cache row of -1 is a key to skip (a left-padded prompt's padding), as is a key
    // outside the window.
    std::vector<bool> skip(lk, false);
    for (int64_t j = 0; j < lk; ++j) {
      if (cache && index.ints[n * lk + j] == -1) {
        skip[j] = true;
        key_at[j] = 0;
      } else {
        key_at[j] = cache ? j * a1 + checked_index(index, n * lk + j, a1, index_name, "cache slot")
                          : b * a1 + j;
      }
      if (window > 0 && lk - 1 - j >= window) skip[j] = true;
    }
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / rep;  // its key/value head
      for (int64_t j = 0; j < lk; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < dk; ++d)
          dot += static_cast<double>(q.f[n * heads * dk + h * dk + d]) *
                 static_cast<double>(k.f[key_at[j] * groups * dk + g * dk + d]);
        const bool masked = key_pad && key_pad->ints[b * a1 + j] != 0;
        float score = static_cast<float>(dot) * scale;
        if (bias)  // f32 [N',H',1,P], broadcast over N' and H' of 1
          score += bias->f[((bias->shape[0] == 1 ? 0 : n) * bias->shape[1] +
                            (bias->shape[1] == 1 ? 0 : h)) *
                               lk +
                           j];
        scores[j] = skip[j] ? -std::numeric_limits<float>::infinity() : masked ? -1e9f : score;
      }
      const std::vector<float> p = softmax_of(scores);
      for (int64_t e = 0; e < dv; ++e) {
        double sum = 0;
        for (int64_t j = 0; j < lk; ++j)
          if (!skip[j])
            sum += static_cast<double>(p[j]) *
                   static_cast<double>(v.f[key_at[j] * groups * dv + g * dv + e]);
        r.f[n * heads * dv + h * dv + e] = static_cast<float>(sum);
      }
    }
  }
  return r;
}

// moe_ffn(x[..., D], ids[..., K], gates[..., K], (w1, w3, w2) per expert): per row t and
// slot k, e = ids[t, k], h[f] = silu(float(w1_e[f]·x[t] in double)) · float(w3_e[f]·x[t] in
// double) (in float), y = float(w2_e·h in double), result[t] = float(Σ_k double(gates[t, k]) ·
// y_k). Computed expert by expert over the rows routed to it (as compiled code does), so an
// expert no row chose is never evaluated; `counters` (if any) counts the rows and experts.
Tensor eval_moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& gates,
                    const std::vector<const Tensor*>& w, const Shape& shape,
                    const std::string& ids_name, InterpretCounters* counters) {
  KILN_ASSERT(x.shape == shape && w.size() % 3 == 0 && !w.empty(), "moe_ffn operands");
  const int64_t experts = static_cast<int64_t>(w.size() / 3);
  const int64_t d = x.shape.back(), k = ids.shape.back(), f = w[0]->shape[0];
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  // The (row, slot) pairs routed to each expert, in order.
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(experts));
  Shape index(ids.shape.size(), 0);
  for (int64_t p = 0; p < rows * k; ++p, next_index(index, ids.shape)) {
    const int64_t e = ids.ints[p];
    if (e < 0 || e >= experts)
      fail("expert id {} at {}{} is out of range [0, {})", e, ids_name, shape_str(index), experts);
    routed[static_cast<size_t>(e)].push_back(p);
  }
  std::vector<double> acc(static_cast<size_t>(rows * d), 0.0);
  std::vector<float> y(static_cast<size_t>(rows * k * d), 0.0f);
  std::vector<float> h(static_cast<size_t>(f));
  const std::string where;  // f32 silu cannot fail
  const PointCtx ctx{DType::f32, DType::f32, where};
  for (int64_t e = 0; e < experts; ++e) {
    if (routed[e].empty()) continue;
    if (counters) {
      ++counters->moe_experts_run;
      counters->moe_expert_rows += static_cast<int64_t>(routed[e].size());
    }
    const Tensor &w1 = *w[3 * e], &w3 = *w[3 * e + 1], &w2 = *w[3 * e + 2];
    for (int64_t p : routed[e]) {
      const float* xr = &x.f[(p / k) * d];
      for (int64_t j = 0; j < f; ++j) {
        double a = 0, b = 0;
        for (int64_t i = 0; i < d; ++i) {
          a += static_cast<double>(w1.f[j * d + i]) * static_cast<double>(xr[i]);
          b += static_cast<double>(w3.f[j * d + i]) * static_cast<double>(xr[i]);
        }
        const Elem g = real(static_cast<float>(a));
        h[j] = point_silu(&g, ctx).f * static_cast<float>(b);
      }
      for (int64_t i = 0; i < d; ++i) {
        double s = 0;
        for (int64_t j = 0; j < f; ++j)
          s += static_cast<double>(w2.f[i * f + j]) * static_cast<double>(h[j]);
        y[p * d + i] = static_cast<float>(s);
      }
    }
  }
  Tensor r = Tensor::zeros(DType::f32, shape);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < d; ++i) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j)
        s += static_cast<double>(gates.f[t * k + j]) * static_cast<double>(y[(t * k + j) * d + i]);
      r.f[t * d + i] = static_cast<float>(s);
    }
  return r;
}

// ---------------------------------------------------------------------------------

class Interpreter {
 public:
  Interpreter(const Module& module, const Function& function, const WeightMap& weights,
              const InterpretOptions& options)
      : m_(module), f_(function), weights_(weights), options_(options) {}

  std::vector<Tensor> run(const std::vector<Tensor>& inputs) {
    check_structure();
    name_values();
    values_.assign(f_.values.size(), std::nullopt);
    bind_inputs(inputs);
    const std::vector<size_t> last = last_uses();
    check_memory(inputs, last);
    for (size_t i = 0; i < f_.ops.size(); ++i) {
      try {
        run_op(static_cast<int>(i));
      } catch (const std::bad_alloc&) {
        fail(
            "{}: out of memory (the values live at the interpreter's peak need {} bytes; the "
            "machine could not give them)",
            where(static_cast<int>(i)), peak_bytes_);
      }
      // A value is freed after its last reader (results live to the end).
      for (ValueId v : reads(f_.ops[i]))
        if (last[v] == i) values_[v].reset();
      if (last[f_.ops[i].result] == i) values_[f_.ops[i].result].reset();
    }
    std::vector<Tensor> results;
    for (ValueId id : f_.results) {
      KILN_ASSERT(values_[id].has_value(), "result not computed");
      results.push_back(*values_[id]);
    }
    return results;
  }

 private:
  // How `linear` and `linear_rows` round (InterpretOptions).
  LinearRounding linear_rounding() const {
    return options_.int8_linear   ? LinearRounding::int8
           : options_.bf16_linear ? LinearRounding::bf16
                                  : LinearRounding::none;
  }

  // Throws unless the function is well formed enough to run: valid value ids, SSA
  // order, and every op obeying its type rule with the declared result type.
  void check_structure() const {
    const size_t nvalues = f_.values.size();
    std::vector<bool> defined(nvalues, false);
    auto invalid = [&](const std::string& what) {
      fail("function '{}' is not valid (run the verifier): {}", f_.name, what);
    };
    auto valid = [&](ValueId id) { return id >= 0 && static_cast<size_t>(id) < nvalues; };
    for (ValueId p : f_.params) {
      if (!valid(p) || defined[p]) invalid(fmt::format("bad parameter value {}", p));
      defined[p] = true;
    }
    for (size_t i = 0; i < f_.ops.size(); ++i) {
      const Op& op = f_.ops[i];
      std::vector<TensorType> operand_types;
      for (ValueId id : op.operands) {
        if (!valid(id) || !defined[id])
          invalid(fmt::format("op {} ({}) uses value {} before it is defined", i, op_name(op.kind),
                              id));
        operand_types.push_back(f_.type(id));
      }
      if (!valid(op.result) || defined[op.result])
        invalid(fmt::format("op {} ({}) defines bad value {}", i, op_name(op.kind), op.result));
      defined[op.result] = true;
      const TensorType& declared = f_.type(op.result);
      TypeResult r = infer_type(m_, op.kind, operand_types, op.attrs, &declared);
      if (!r.ok()) invalid(fmt::format("op {} ({}): {}", i, op_name(op.kind), r.error));
      if (!(r.type == declared))
        invalid(fmt::format("op {} ({}) is declared {} but gives {}", i, op_name(op.kind),
                            to_string(declared), to_string(r.type)));
    }
    for (ValueId id : f_.results)
      if (!valid(id) || !defined[id]) invalid(fmt::format("returns undefined value {}", id));
  }

  // Names values as the printer does, but a named value without its '%' ('src', '%3').
  void name_values() {
    names_ = value_names(f_);
    for (size_t i = 0; i < names_.size(); ++i)
      if (!f_.values[i].name.empty()) names_[i] = f_.values[i].name;
  }

  // 'src', or '%3' for an unnamed value.
  std::string label(ValueId id) const { return "'" + names_[id] + "'"; }

  // Names op `index` for error messages, after its source line when known.
  std::string where(int index) const {
    const Op& op = f_.ops[index];
    const std::string& n = names_[op.result];
    return fmt::format("{}function '{}', op {} ({}{} = {})", line_prefix(op.loc), f_.name, index,
                       n.starts_with('%') ? "" : "%", n, op_name(op.kind));
  }

  void bind_inputs(const std::vector<Tensor>& inputs) {
    if (inputs.size() != f_.params.size())
      fail("function '{}' takes {} input(s), got {}", f_.name, f_.params.size(), inputs.size());
    for (size_t n = 0; n < inputs.size(); ++n) {
      const ValueId p = f_.params[n];
      const TensorType& want = f_.type(p);
      const std::string who = "input " + label(p);
      Tensor t = inputs[n];
      const bool dtype_ok =
          t.dtype == want.dtype || (is_integer(t.dtype) && is_integer(want.dtype));
      if (!dtype_ok) fail("{} has type {}, expected {}", who, t.type_string(), to_string(want));
      if (rank_of(t) != want.rank())
        fail("{} has shape {}: rank {}, expected {} ({})", who, shape_str(t.shape), rank_of(t),
             want.rank(), to_string(want));
      check_tensor_data(t, who);
      for (int64_t d = 0; d < want.rank(); ++d) bind_dim(t, d, want.shape[d], who);
      // i32 and i64 data are interchangeable; the values must fit the declared dtype.
      if (want.dtype == DType::i32 && t.dtype == DType::i64) {
        for (int64_t i = 0; i < t.numel(); ++i)
          if (!fits_i32(t.ints[i]))
            fail("{} holds {} at {}, which does not fit in i32", who, t.ints[i],
                 shape_str(unravel(i, t.shape)));
      }
      t.dtype = want.dtype;
      values_[p] = std::move(t);
    }
  }

  void bind_dim(const Tensor& t, int64_t d, const Dim& dim, const std::string& who) {
    const int64_t size = t.shape[d];
    if (!dim.is_symbolic()) {
      if (size != dim.value)
        fail("{} has shape {}: dim {} is {}, expected {}", who, shape_str(t.shape), d, size,
             dim.value);
      return;
    }
    const Symbol* sym = m_.find_symbol(dim.symbol);
    if (!sym)
      fail("{} has shape {}: dim {} uses undeclared symbol '{}'", who, shape_str(t.shape), d,
           dim.symbol);
    const std::string name = to_string(dim);
    if (size < dim_min(dim))
      fail("{} has shape {}: dim {} ({}) is {}, below its minimum {}", who, shape_str(t.shape), d,
           name, size, dim_min(dim));
    if (size > dim.at(sym->max))
      fail("{} has shape {}: dim {} ({}) is {}, above its maximum {}", who, shape_str(t.shape), d,
           name, size, dim.at(sym->max));
    auto it = bindings_.find(dim.symbol);
    if (it == bindings_.end()) {
      // scale·S + offset = size: S from the size, when one S gives it.
      if ((size - dim.value) % dim.scale != 0)
        fail("{} has shape {}: dim {} ({}) is {}, which no value of {} gives", who,
             shape_str(t.shape), d, name, size, dim.symbol);
      bindings_[dim.symbol] = (size - dim.value) / dim.scale;
      bound_by_[dim.symbol] = fmt::format("dim {} of {}", d, who);
    } else if (dim.at(it->second) != size) {
      if (dim.is_bare_symbol())
        fail("{} has shape {}: dim {} ({}) is {}, but {} is {} from {}", who, shape_str(t.shape), d,
             dim.symbol, size, dim.symbol, it->second, bound_by_[dim.symbol]);
      fail("{} has shape {}: dim {} ({}) is {}, but {} is {} from {}, so {} is {}", who,
           shape_str(t.shape), d, name, size, dim.symbol, it->second, bound_by_[dim.symbol], name,
           dim.at(it->second));
    }
  }

  // The index of the last op that reads each value; the op count for results (and values
  // nothing reads: they are freed right away).
  std::vector<size_t> last_uses() const {
    std::vector<size_t> last(f_.values.size(), 0);
    for (size_t i = 0; i < f_.ops.size(); ++i) {
      last[f_.ops[i].result] = i;
      for (ValueId v : reads(f_.ops[i])) last[v] = i;
    }
    for (ValueId r : f_.results) last[r] = f_.ops.size();
    return last;
  }

  // The values op `op` reads: its operands and, for add_layernorm_sum, which recomputes the
  // sum of an add_layernorm, that op's operands too.
  std::vector<ValueId> reads(const Op& op) const {
    std::vector<ValueId> out = op.operands;
    if (op.kind == OpKind::add_layernorm_sum && !op.operands.empty()) {
      const int def = f_.defining_op(op.operands[0]);
      if (def >= 0) {
        const std::vector<ValueId>& more = f_.ops[static_cast<size_t>(def)].operands;
        out.insert(out.end(), more.begin(), more.end());
      }
    }
    return out;
  }

  static int64_t storage_bytes(DType dtype, const Shape& shape) {
    int64_t bytes = dtype == DType::f32 ? sizeof(float) : sizeof(int64_t);
    for (int64_t d : shape) bytes *= d;  // each below kMaxInterpreterTensorBytes
    return bytes;
  }

  // Refuses a run whose values would need more than options_.max_bytes at once, before
  // any op runs: the inputs, then each op's result while its operands are still live,
  // freed after their last reader (as run() does).
  void check_memory(const std::vector<Tensor>& inputs, const std::vector<size_t>& last) {
    int64_t live = 0, peak = 0;
    int peak_op = -1;
    std::vector<int64_t> bytes(f_.values.size(), 0);
    for (size_t i = 0; i < f_.params.size() && i < inputs.size(); ++i) {
      bytes[f_.params[i]] = storage_bytes(f_.type(f_.params[i]).dtype, inputs[i].shape);
      live += bytes[f_.params[i]];
    }
    peak = live;
    for (size_t i = 0; i < f_.ops.size(); ++i) {
      const Op& op = f_.ops[i];
      bytes[op.result] = storage_bytes(f_.type(op.result).dtype, result_shape(static_cast<int>(i)));
      live += bytes[op.result];
      if (live > peak) peak = live, peak_op = static_cast<int>(i);
      if (last[op.result] == i) live -= bytes[op.result];
      for (ValueId v : reads(op))
        if (last[v] == i && v != op.result) {
          live -= bytes[v];
          bytes[v] = 0;  // an op may read a value twice
        }
    }
    peak_bytes_ = peak;
    if (peak > options_.max_bytes)
      fail(
          "{}: the interpreter needs {} bytes for the values live at this op, above its limit "
          "of {} bytes (kiln run --max-memory raises it)",
          peak_op >= 0 ? where(peak_op) : fmt::format("function '{}'", f_.name), peak,
          options_.max_bytes);
  }

  // The concrete shape of op `index`'s declared result type.
  Shape result_shape(int index) const {
    const TensorType& type = f_.type(f_.ops[index].result);
    Shape shape;
    for (const Dim& d : type.shape) {
      if (!d.is_symbolic()) {
        shape.push_back(d.value);
        continue;
      }
      auto it = bindings_.find(d.symbol);
      if (it == bindings_.end())
        fail("{}: its type {} uses symbol '{}', which no input binds", where(index),
             to_string(type), d.symbol);
      shape.push_back(d.at(it->second));
    }
    // Refuse a result too large to hold before allocating it (a 64 GiB constant, say).
    const int64_t elem = type.dtype == DType::f32 ? sizeof(float) : sizeof(int64_t);
    int64_t bytes = elem;
    for (int64_t d : shape)
      if (__builtin_mul_overflow(bytes, d, &bytes) || bytes > kMaxInterpreterTensorBytes)
        fail(
            "{}: its result {} of shape {} needs more than {} bytes, the interpreter's limit "
            "per tensor",
            where(index), to_string(type), shape_str(shape), kMaxInterpreterTensorBytes);
    return shape;
  }

  const Tensor& operand(const Op& op, size_t i) const {
    KILN_ASSERT(i < op.operands.size() && values_[op.operands[i]].has_value(), "missing operand");
    return *values_[op.operands[i]];
  }

  Tensor load_weight(const Op& op, const Shape& shape) const {
    const std::string& name = op.str_attr("name");
    auto it = weights_.find(name);
    if (it == weights_.end()) fail("weight '{}' was not loaded", name);
    const Tensor& w = it->second;
    const TensorType& want = f_.type(op.result);
    if (w.dtype != want.dtype || w.shape != shape)
      fail("weight '{}' has type {}, expected {}", name, w.type_string(), to_string(want));
    check_tensor_data(w, fmt::format("weight '{}'", name));
    return w;
  }

  void run_op(int index) {
    const Op& op = f_.ops[index];
    const DType dtype = f_.type(op.result).dtype;
    const Shape shape = result_shape(index);
    const std::string at = where(index);
    Tensor r;
    switch (op.kind) {
      case OpKind::weight:
        r = load_weight(op, shape);
        break;
      case OpKind::constant:
        r = eval_constant(op, dtype, shape);
        break;
      case OpKind::sinusoid_table:
        r = eval_sinusoid_table(shape);
        break;
      case OpKind::iota:
        r = eval_iota(op, dtype, shape);
        break;
        // Every pointwise op, by its point_<name>.
#define KILN_OP(name, ...)
#define KILN_POINTWISE_OP(name, ...) case OpKind::name:
#include "ir/ops.def"
        {
          std::vector<const Tensor*> in;
          for (size_t i = 0; i < op.operands.size(); ++i) in.push_back(&operand(op, i));
          r = eval_pointwise(op.kind, in, dtype, shape, at);
          break;
        }
      case OpKind::gather:
        r = eval_gather(operand(op, 0), operand(op, 1), shape, label(op.operands[1]));
        break;
      case OpKind::transpose:
        r = eval_transpose(op, operand(op, 0), shape);
        break;
      case OpKind::reshape:
        r = eval_reshape(operand(op, 0), shape);
        break;
      case OpKind::slice:
        r = eval_slice(op, operand(op, 0), shape, at);
        break;
      case OpKind::concat: {
        std::vector<const Tensor*> parts;
        for (size_t i = 0; i < op.operands.size(); ++i) parts.push_back(&operand(op, i));
        r = concat_tensors(parts, axis_of(op.int_attr("axis"), rank_of(*parts[0])));
        break;
      }
      case OpKind::matmul:
        r = eval_matmul(operand(op, 0), operand(op, 1), shape);
        break;
      case OpKind::softmax:
        r = eval_softmax(op, operand(op, 0), shape);
        break;
      case OpKind::layernorm:
        r = eval_layernorm(op, operand(op, 0), operand(op, 1),
                           op.operands.size() > 2 ? &operand(op, 2) : nullptr, shape);
        break;
      case OpKind::add_layernorm: {
        // The sum is rounded to float first, exactly as a separate add would.
        const Tensor sum =
            eval_pointwise(OpKind::add, {&operand(op, 0), &operand(op, 1)}, DType::f32, shape, at);
        r = eval_layernorm(op, sum, operand(op, 2),
                           op.operands.size() > 3 ? &operand(op, 3) : nullptr, shape);
        break;
      }
      case OpKind::add_layernorm_sum: {
        // The add_layernorm's sum, recomputed from its addends (verified: V11).
        const int def = f_.defining_op(op.operands[0]);
        KILN_ASSERT(def >= 0 && f_.ops[static_cast<size_t>(def)].kind == OpKind::add_layernorm,
                    "add_layernorm_sum of a value no add_layernorm defines");
        const Op& norm = f_.ops[static_cast<size_t>(def)];
        r = eval_pointwise(OpKind::add, {&operand(norm, 0), &operand(norm, 1)}, DType::f32, shape,
                           at);
        break;
      }
      case OpKind::reduce_sum:
      case OpKind::reduce_max:
      case OpKind::reduce_mean:
        r = eval_reduce(op, operand(op, 0), dtype, shape);
        break;
      case OpKind::argmax:
        r = eval_argmax(op, operand(op, 0), shape, at);
        break;
      case OpKind::linear:
        r = eval_linear(op, operand(op, 0), operand(op, 1),
                        op.operands.size() == 3 ? &operand(op, 2) : nullptr, shape,
                        linear_rounding());
        break;
      case OpKind::linear_rows: {
        // The rows of W (and b) first, checked as a gather checks its ids; then the linear,
        // rounded as `linear` is (ops.def): in f32, bf16, or int8 (each row quantized alone),
        // so the outputs are the full linear's at those rows.
        const Tensor w =
            eval_gather(operand(op, 1), operand(op, 2),
                        {operand(op, 2).shape[0], operand(op, 1).shape[1]}, label(op.operands[2]));
        std::optional<Tensor> b;
        if (op.operands.size() == 4)
          b = eval_gather(operand(op, 3), operand(op, 2), {operand(op, 2).shape[0]},
                          label(op.operands[2]));
        r = eval_linear(op, operand(op, 0), w, b ? &*b : nullptr, shape, linear_rounding());
        break;
      }
      case OpKind::attention: {
        // Optional operands: key_pad, query_pad (query_pad = 1), bias (bias = 1).
        const ir::AttentionOperands at = ir::attention_operands(op.attrs, op.operands.size());
        auto opt = [&](int index) {
          return index >= 0 ? &operand(op, static_cast<size_t>(index)) : nullptr;
        };
        r = eval_attention(op, operand(op, 0), operand(op, 1), operand(op, 2), opt(at.key_pad),
                           opt(at.query_pad), opt(at.bias), shape, options_.bf16_attention);
        break;
      }
      case OpKind::take_along_axis:
        r = eval_take_along_axis(op, operand(op, 0), operand(op, 1), shape, label(op.operands[1]));
        break;
      case OpKind::scatter_add:
        r = eval_scatter_add(op, operand(op, 0), operand(op, 1), operand(op, 2), shape,
                             label(op.operands[1]));
        break;
      case OpKind::topk:
        r = eval_topk(op, operand(op, 0), shape, at);
        break;
      case OpKind::moe_ffn: {
        std::vector<const Tensor*> w;
        for (size_t i = 3; i < op.operands.size(); ++i) w.push_back(&operand(op, i));
        r = eval_moe_ffn(operand(op, 0), operand(op, 1), operand(op, 2), w, shape,
                         label(op.operands[1]), options_.counters);
        break;
      }
      case OpKind::cache_write:
        r = eval_cache_write(operand(op, 0), operand(op, 1),
                             op.operands.size() == 3 ? &operand(op, 2) : nullptr, shape,
                             op.operands.size() == 3 ? label(op.operands[2]) : std::string());
        break;
      case OpKind::cache_attention:
      case OpKind::memory_attention: {
        const bool five = op.operands.size() == 5, cache = op.kind == OpKind::cache_attention;
        r = eval_step_attention(op, operand(op, 0), operand(op, 1), operand(op, 2), operand(op, 3),
                                five && !cache ? &operand(op, 4) : nullptr,
                                five && cache ? &operand(op, 4) : nullptr, shape,
                                label(op.operands[3]));
      } break;
    }
    KILN_ASSERT(r.dtype == dtype && r.shape == shape,
                fmt::format("{} produced {}, declared {}", at, r.type_string(),
                            to_string(f_.type(op.result))));
    KILN_ASSERT(static_cast<int64_t>(dtype == DType::f32 ? r.f.size() : r.ints.size()) == r.numel(),
                at + " produced the wrong number of values");
    values_[op.result] = std::move(r);
  }

  const Module& m_;
  const Function& f_;
  const WeightMap& weights_;
  const InterpretOptions options_;
  std::vector<std::string> names_;               // by ValueId, as printed ("src", "%3")
  std::vector<std::optional<Tensor>> values_;    // by ValueId, once computed
  int64_t peak_bytes_ = 0;                       // check_memory's peak
  std::map<std::string, int64_t> bindings_;      // symbol -> size
  std::map<std::string, std::string> bound_by_;  // symbol -> "dim 0 of input 'src'"
};

}  // namespace

// ---------------------------------------------------------------------------------
// Tensor

int64_t Tensor::numel() const { return shape_numel(shape); }

Tensor Tensor::zeros(DType dtype, std::vector<int64_t> shape) {
  for (int64_t d : shape) KILN_ASSERT(d >= 0, "negative dim in Tensor::zeros");
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  if (dtype == DType::f32)
    t.f.assign(t.numel(), 0.0f);
  else
    t.ints.assign(t.numel(), 0);
  return t;
}

Tensor Tensor::from_f32(std::vector<int64_t> shape, std::vector<float> data) {
  Tensor t;
  t.dtype = DType::f32;
  t.shape = std::move(shape);
  t.f = std::move(data);
  KILN_ASSERT(
      static_cast<int64_t>(t.f.size()) == t.numel(),
      fmt::format("Tensor::from_f32: {} values for shape {}", t.f.size(), shape_str(t.shape)));
  return t;
}

Tensor Tensor::from_ints(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> data) {
  KILN_ASSERT(dtype != DType::f32, "Tensor::from_ints with dtype f32");
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.ints = std::move(data);
  KILN_ASSERT(
      static_cast<int64_t>(t.ints.size()) == t.numel(),
      fmt::format("Tensor::from_ints: {} values for shape {}", t.ints.size(), shape_str(t.shape)));
  return t;
}

std::string Tensor::type_string() const { return dtype_name(dtype) + shape_str(shape); }

// ---------------------------------------------------------------------------------

void materialize_weights(const Module& module, WeightMap& weights) {
  for (const Weight& w : module.weights) {
    if (!w.derivation) continue;
    const WeightDerivation& d = *w.derivation;
    if (d.op == "transpose") {
      // W[K, N] stored as [in, out] (GPT-2's Conv1D): its transpose [N, K].
      if (d.inputs.size() != 1) fail("weight '{}': transpose takes one weight", w.name);
      auto it = weights.find(d.inputs[0]);
      if (it == weights.end())
        fail("weight '{}' is built from '{}', which was not loaded", w.name, d.inputs[0]);
      const Tensor& t = it->second;
      check_tensor_data(t, fmt::format("weight '{}'", d.inputs[0]));
      if (t.dtype != DType::f32 || rank_of(t) != 2 || !w.type.shape[0].is_const(t.shape[1]) ||
          !w.type.shape[1].is_const(t.shape[0]))
        fail("weight '{}' is the transpose of {}, expected the transpose of {}", w.name,
             t.type_string(), to_string(w.type));
      const int64_t K = t.shape[0], N = t.shape[1];
      std::vector<float> data(static_cast<size_t>(K * N));
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n) data[n * K + k] = t.f[k * N + n];
      weights[w.name] = Tensor::from_f32({N, K}, std::move(data));
      continue;
    }
    if (d.op != "concat") fail("weight '{}' has an unknown derivation '{}'", w.name, d.op);
    if (d.inputs.empty()) fail("weight '{}' derives from no weights", w.name);
    auto axis_it = d.attrs.find("axis");
    const int64_t* axis_attr =
        axis_it == d.attrs.end() ? nullptr : std::get_if<int64_t>(&axis_it->second);
    if (!axis_attr) fail("weight '{}': concat needs an integer attribute 'axis'", w.name);
    // {transpose = 1}: each input [K, N_i] (an [in, out] weight) is transposed first.
    auto tr_it = d.attrs.find("transpose");
    const bool transposed = tr_it != d.attrs.end() && std::get_if<int64_t>(&tr_it->second) &&
                            std::get<int64_t>(tr_it->second) == 1;
    std::vector<Tensor> transposed_parts;
    transposed_parts.reserve(d.inputs.size());
    std::vector<const Tensor*> parts;
    for (const std::string& in : d.inputs) {
      auto it = weights.find(in);
      if (it == weights.end())
        fail("weight '{}' is built from '{}', which was not loaded", w.name, in);
      const Tensor& t = it->second;
      check_tensor_data(t, fmt::format("weight '{}'", in));
      if (const Weight* decl = module.find_weight(in)) {
        const TensorType& want = decl->type;
        bool same = t.dtype == want.dtype && rank_of(t) == want.rank();
        for (int64_t i = 0; same && i < want.rank(); ++i) same = want.shape[i].is_const(t.shape[i]);
        if (!same)
          fail("weight '{}' has type {}, expected {}", in, t.type_string(), to_string(want));
      }
      if (transposed) {
        if (t.dtype != DType::f32 || rank_of(t) != 2)
          fail("weight '{}': a transposed concat of {}, not f32 of rank 2", w.name,
               t.type_string());
        const int64_t K = t.shape[0], N = t.shape[1];
        std::vector<float> data(static_cast<size_t>(K * N));
        for (int64_t k = 0; k < K; ++k)
          for (int64_t n = 0; n < N; ++n) data[n * K + k] = t.f[k * N + n];
        transposed_parts.push_back(Tensor::from_f32({N, K}, std::move(data)));
        parts.push_back(&transposed_parts.back());
        continue;
      }
      parts.push_back(&t);
    }
    // Inputs must agree outside the axis (the verifier checks the declared types).
    const Tensor& first = *parts[0];
    const int64_t axis = normalize_axis(*axis_attr, rank_of(first));
    if (axis < 0)
      fail("weight '{}': concat axis {} out of range for rank {}", w.name, *axis_attr,
           rank_of(first));
    for (const Tensor* p : parts) {
      bool agree = p->dtype == first.dtype && rank_of(*p) == rank_of(first);
      for (int64_t i = 0; agree && i < rank_of(first); ++i)
        agree = i == axis || p->shape[i] == first.shape[i];
      if (!agree)
        fail("weight '{}': cannot concat {} and {} along axis {}", w.name, first.type_string(),
             p->type_string(), axis);
    }
    Tensor r = concat_tensors(parts, axis);
    bool same = r.dtype == w.type.dtype && rank_of(r) == w.type.rank();
    for (int64_t i = 0; same && i < w.type.rank(); ++i) same = w.type.shape[i].is_const(r.shape[i]);
    if (!same)
      fail("weight '{}' is built as {}, expected {}", w.name, r.type_string(), to_string(w.type));
    weights[w.name] = std::move(r);
  }
}

std::vector<Tensor> interpret(const Module& module, const Function& function,
                              const WeightMap& weights, const std::vector<Tensor>& inputs) {
  return Interpreter(module, function, weights, InterpretOptions{}).run(inputs);
}

std::vector<Tensor> interpret(const Module& module, const Function& function,
                              const WeightMap& weights, const std::vector<Tensor>& inputs,
                              const InterpretOptions& options) {
  return Interpreter(module, function, weights, options).run(inputs);
}

}  // namespace kiln::ir
