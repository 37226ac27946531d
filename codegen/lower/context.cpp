// Lowering's shared state and helpers (see lowering.h): views of memory, the module's
// weights, tables and kernels, and one function's parameters, results, copies and scratch.
#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "codegen/lower/lowering.h"
#include "ir/op_types.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::codegen::lowering {

using ir::OpKind;
using rt::DimExpr;
using ElemType = kiln_dtype;  // the plan's element types are the C ABI's
using rt::Storage;

ElemType elem_type(ir::DType d) {
  switch (d) {
    case ir::DType::f32:
      return KILN_F32;
    case ir::DType::i64:
      return KILN_I64;
    case ir::DType::boolean:
      return KILN_BOOL;
    case ir::DType::i32:
      break;
  }
  fail("compiled code does not support {} tensors yet", ir::dtype_name(d));
}

ElementwiseKernel::Dtype node_dtype(ElemType t) {
  switch (t) {
    case KILN_F32:
      return ElementwiseKernel::Dtype::f32;
    case KILN_I64:
      return ElementwiseKernel::Dtype::i64;
    case KILN_BOOL:
      return ElementwiseKernel::Dtype::u8;
    case KILN_I32:   // never a plan's type
    case KILN_BF16:  // weights only, never an elementwise node
      break;
  }
  return ElementwiseKernel::Dtype::f32;
}

ElementwiseKernel::Dtype node_dtype(ir::DType d) { return node_dtype(elem_type(d)); }

// elem_offset + add as one monomial, when it is one (both with the same symbols, or
// either zero).
std::optional<DimExpr> add_offsets(const DimExpr& a, const DimExpr& b) {
  // A constant is stored without symbol powers (as DimExpr::constant makes it).
  if (a.is_constant() && b.is_constant()) return DimExpr::constant(a.coeff + b.coeff);
  if (a.coeff == 0) return b;
  if (b.coeff == 0) return a;
  DimExpr unit_a = a, unit_b = b;
  unit_a.coeff = unit_b.coeff = 1;
  if (!(unit_a == unit_b)) return std::nullopt;
  DimExpr sum = a;
  sum.coeff = a.coeff + b.coeff;
  return sum;
}

bool View::dense() const {
  DimExpr expect = DimExpr::constant(1);
  for (size_t d = extents.size(); d-- > 0;) {
    if (!(strides[d] == expect)) return false;
    expect = expect * extents[d];
  }
  return true;
}

std::optional<View> View::reshaped(const std::vector<DimExpr>& to) const {
  const DimExpr one = DimExpr::constant(1);
  std::vector<size_t> src, dst;  // dims of extent other than 1
  for (size_t d = 0; d < extents.size(); ++d)
    if (!(extents[d] == one)) src.push_back(d);
  for (size_t d = 0; d < to.size(); ++d)
    if (!(to[d] == one)) dst.push_back(d);
  View v = *this;
  v.extents = to;
  v.strides.assign(to.size(), one);
  size_t i = 0, j = 0;
  while (i < src.size() && j < dst.size()) {
    size_t i_end = i + 1, j_end = j + 1;
    DimExpr ps = extents[src[i]], pd = to[dst[j]];
    // a divides b as monomials: b = a · (a monomial with a whole coefficient).
    auto divides = [](const DimExpr& a, const DimExpr& b) {
      if (a.coeff < 1 || b.coeff % a.coeff != 0) return false;
      for (size_t k = 0; k < a.pows.size(); ++k)
        if (a.pows[k] > (k < b.pows.size() ? b.pows[k] : 0)) return false;
      return true;
    };
    while (!(ps == pd)) {
      // Grow the smaller side: constants by value, symbolic sizes when one divides the other
      // ([B,T,4,16] -> [B,64·T] and back).
      bool grow_src = false;
      if (ps.is_constant() && pd.is_constant())
        grow_src = ps.coeff < pd.coeff;
      else if (divides(ps, pd))
        grow_src = true;
      else if (!divides(pd, ps))
        return std::nullopt;
      if (grow_src) {
        if (i_end == src.size()) return std::nullopt;
        ps = ps * extents[src[i_end++]];
      } else {
        if (j_end == dst.size()) return std::nullopt;
        pd = pd * to[dst[j_end++]];
      }
    }
    for (size_t k = i; k + 1 < i_end; ++k)
      if (!(strides[src[k]] == strides[src[k + 1]] * extents[src[k + 1]])) return std::nullopt;
    DimExpr stride = strides[src[i_end - 1]];
    for (size_t k = j_end; k-- > j;) {
      v.strides[dst[k]] = stride;
      stride = stride * to[dst[k]];
    }
    i = i_end;
    j = j_end;
  }
  if (i != src.size() || j != dst.size()) return std::nullopt;
  // Dims of extent 1: the stride of the next inner dim times its extent (any would do).
  for (size_t d = to.size(); d-- > 0;)
    if (to[d] == one) v.strides[d] = d + 1 < to.size() ? v.strides[d + 1] * to[d + 1] : one;
  // Kernels read the innermost dim with unit stride.
  if (!v.strides.empty() && !(v.strides.back() == one)) return std::nullopt;
  return v;
}

rt::BufferDesc View::halide() const {
  rt::BufferDesc b{storage, index, byte_offset, elem_offset, type, {}, {}};
  for (size_t d = extents.size(); d-- > 0;) {
    b.extents.push_back(extents[d]);
    b.strides.push_back(strides[d]);
  }
  return b;
}

ModuleLowering::ModuleLowering(const ir::Module& module, const LowerOptions& lower_options)
    : m(module), options(lower_options) {
  for (const ir::Symbol& s : m.symbols) out.plan.symbols.push_back({s.name, s.max, -1, 1, 0});
  out.plan.model = m.name;
  out.plan.config.assign(m.config.begin(), m.config.end());
}

DimExpr ModuleLowering::dim(const ir::Dim& d) {
  if (!d.is_symbolic()) return DimExpr::constant(d.value);
  size_t i = 0;
  while (i < m.symbols.size() && m.symbols[i].name != d.symbol) ++i;
  // The pipeline verified the module: every symbol in a type is declared [V7].
  KILN_ASSERT(i < m.symbols.size(),
              fmt::format("lowering: undeclared symbol '{}' in a verified module", d.symbol));
  // a·S is a monomial of S; a·S + b (b != 0) is g times the plan's derived symbol
  // (a/g)·S + b/g, g = gcd(a, |b|): so T+1 and 64·T+64 = 64·(T+1) share their symbol, and
  // views of [B,T+1,64] reshape to [B,64·T+64] by monomials.
  if (d.value == 0) return DimExpr::symbol(static_cast<int>(i), d.scale);
  const int64_t g = std::gcd(d.scale, d.value);
  const ir::Dim unit = ir::Dim::affine(d.symbol, d.scale / g, d.value / g);
  const std::string name = ir::to_string(unit);
  size_t k = m.symbols.size();
  while (k < out.plan.symbols.size() && out.plan.symbols[k].name != name) ++k;
  if (k == out.plan.symbols.size())
    out.plan.symbols.push_back(
        {name, ir::dim_max(m, unit), static_cast<int32_t>(i), unit.scale, unit.value});
  return DimExpr::symbol(static_cast<int>(k), g);
}

int64_t ModuleLowering::dim_max(const ir::Dim& d) const { return ir::dim_max(m, d); }

View ModuleLowering::dense_view(const ir::TensorType& t, Storage storage, int32_t index,
                                int64_t byte_offset) {
  View v;
  v.storage = storage;
  v.index = index;
  v.byte_offset = byte_offset;
  v.type = elem_type(t.dtype);
  for (const ir::Dim& d : t.shape) v.extents.push_back(dim(d));
  v.strides.assign(v.extents.size(), DimExpr::constant(1));
  for (size_t d = v.extents.size(); d-- > 1;) v.strides[d - 1] = v.strides[d] * v.extents[d];
  return v;
}

int32_t ModuleLowering::weight_index(const std::string& name, bool linear, int64_t panel, bool bf16,
                                     bool int8) {
  std::string key = name + (linear ? fmt::format("#t{}{}", panel,
                                                 bf16   ? "b"
                                                 : int8 ? "q"
                                                        : "")
                                   : "");
  auto it = weights_.find(key);
  if (it != weights_.end()) return it->second;
  const ir::Weight* w = m.find_weight(name);
  KILN_ASSERT(w, "weight op refers to an undeclared weight");
  rt::WeightDesc d;
  d.name = name;
  auto shape_of = [](const ir::TensorType& t) {
    std::vector<int64_t> s;
    for (const ir::Dim& dd : t.shape) s.push_back(dd.value);
    return s;
  };
  if (w->derivation && w->derivation->op == "transpose") {
    // transpose(@W) of an [in, out] weight W[K, N] (GPT-2's Conv1D, ONNX's MatMul by an
    // initializer), read only by linear kernels (lower_linear): the runtime transposes the
    // stored [K, N] at load time (WeightDesc::source_kn) into any linear layout.
    if (!linear)
      fail("weight '{}': a transposed [in, out] weight is supported only as a linear weight", name);
    const ir::Weight* src = m.find_weight(w->derivation->inputs.at(0));
    KILN_ASSERT(src, "weight_index: transpose of an undeclared weight");
    d.sources.push_back(src->name);
    d.source_shapes.push_back(shape_of(src->type));
    d.source_kn = true;
  } else if (w->derivation) {
    if (w->derivation->op != "concat" || (w->derivation->attrs.count("axis") &&
                                          std::get<int64_t>(w->derivation->attrs.at("axis")) != 0))
      fail("weight '{}': only concatenation along axis 0 is supported at load time", name);
    // {transpose = 1}: [in, out] sources [K, N_i] (merge-projections of imported or Conv1D
    // linears), each transposed at load time (WeightDesc::source_kn).
    if (auto it = w->derivation->attrs.find("transpose");
        it != w->derivation->attrs.end() && std::get<int64_t>(it->second) == 1) {
      if (!linear)
        fail(
            "weight '{}': a concatenation of transposed weights is supported only as a linear "
            "weight",
            name);
      d.source_kn = true;
    }
    for (const std::string& in : w->derivation->inputs) {
      d.sources.push_back(in);
      d.source_shapes.push_back(shape_of(m.find_weight(in)->type));
    }
  } else {
    d.sources.push_back(name);
    d.source_shapes.push_back(shape_of(w->type));
  }
  d.shape = shape_of(w->type);
  if (linear) {
    // The linear type rule takes W[N,K], and a weight op has its weight's type [V8].
    KILN_ASSERT(d.shape.size() == 2,
                fmt::format("lowering: weight '{}' of a linear is not 2-D", name));
    const int64_t N = d.shape[0], K = d.shape[1];
    d.shape = bf16    ? std::vector<int64_t>{(N + 63) / 64, (K + 1) / 2, 64, 2}
              : int8  ? std::vector<int64_t>{(N + 63) / 64, (K + 3) / 4, 64, 4}
              : panel ? std::vector<int64_t>{N / panel, K, panel}
                      : std::vector<int64_t>{K, N};
    d.transpose = true;
    d.panel = panel;
    d.bf16 = bf16;
    d.int8 = int8;
  }
  int32_t index = static_cast<int32_t>(out.plan.weights.size());
  out.plan.weights.push_back(std::move(d));
  weights_[key] = index;
  return index;
}

int32_t ModuleLowering::table_index(int64_t rows, int64_t dim) {
  for (size_t i = 0; i < out.plan.tables.size(); ++i)
    if (out.plan.tables[i].rows == rows && out.plan.tables[i].dim == dim)
      return static_cast<int32_t>(i);
  out.plan.tables.push_back({"sinusoid", rows, dim});
  return static_cast<int32_t>(out.plan.tables.size() - 1);
}

int32_t ModuleLowering::kernel_index(const KernelSpec& spec) {
  std::string name = kernel_name(spec);
  for (size_t i = 0; i < out.plan.kernel_names.size(); ++i)
    if (out.plan.kernel_names[i] == name) return static_cast<int32_t>(i);
  out.plan.kernel_names.push_back(name);
  out.kernels.push_back(spec);
  return static_cast<int32_t>(out.kernels.size() - 1);
}

FunctionLowering::FunctionLowering(ModuleLowering& module_lowering, const ir::Function& function)
    : module(module_lowering),
      m(module_lowering.m),
      f(function),
      defs(passes::def_index(function)),
      uses(passes::use_counts(function)) {
  fd.name = f.name;
  if (f.arena_bytes < 0)
    fail("function '{}' has no memory plan: run the default pipeline before compiling", f.name);
  fd.arena_bytes = f.arena_bytes;
  for (size_t i = 0; i < f.ops.size(); ++i)
    if (f.ops[i].kind == OpKind::add_layernorm_sum)
      sum_of[f.ops[i].operands[0]] = static_cast<int>(i);
  for (ir::ValueId v : f.params)
    if (f.type(v).dtype == ir::DType::i32)
      fail("function '{}': parameter {} is i32; compiled code supports f32, i64 and bool", f.name,
           passes::value_label(f, v));
  for (ir::ValueId v : f.results)
    if (f.type(v).dtype == ir::DType::i32)
      fail("function '{}': result {} is i32; compiled code supports f32, i64 and bool", f.name,
           passes::value_label(f, v));
  for (size_t r = 0; r < f.results.size(); ++r) {
    ir::ValueId v = f.results[r];
    // A value returned twice is computed into the first result and copied to the other.
    if (!result_index.count(v)) result_index[v] = static_cast<int32_t>(r);
    rt::TensorDesc t;
    t.name = f.values[v].name.empty() ? fmt::format("result{}", r) : f.values[v].name;
    t.type = elem_type(f.type(v).dtype);
    for (const ir::Dim& d : f.type(v).shape) t.shape.push_back(dim(d));
    fd.results.push_back(std::move(t));
  }
  for (size_t p = 0; p < f.params.size(); ++p) {
    ir::ValueId v = f.params[p];
    rt::TensorDesc t;
    t.name = f.values[v].name;
    t.type = elem_type(f.type(v).dtype);
    for (const ir::Dim& d : f.type(v).shape) t.shape.push_back(dim(d));
    for (const ir::Op& op : f.ops)  // ids are checked against the smallest table they index
      if (op.kind == OpKind::gather && op.operands[1] == v &&
          !f.type(op.operands[0]).shape[0].is_symbolic()) {
        const int64_t rows = f.type(op.operands[0]).shape[0].value;
        if (t.id_limits.empty())
          t.id_limits.push_back({DimExpr::constant(rows), "token id"});
        else
          t.id_limits[0].limit.coeff = std::min(t.id_limits[0].limit.coeff, rows);
      }
    fd.params.push_back(std::move(t));
    views[v] = dense_view(f.type(v), Storage::param, static_cast<int32_t>(p), 0);
    param_index[v] = static_cast<int32_t>(p);
  }
  scratch_base_ = scratch_top_ = (f.arena_bytes + 63) / 64 * 64;
}

void FunctionLowering::limit_param(ir::ValueId v, const ir::Dim& limit, const char* what,
                                   bool allow_minus_one) {
  auto it = param_index.find(v);
  if (it == param_index.end()) return;
  // Once per distinct limit: every layer's cache_attention reads the same row table (a
  // 12-layer decoder would otherwise give it 12 equal limits; the plan format holds 16).
  std::vector<rt::TensorDesc::IdLimit>& limits =
      fd.params[static_cast<size_t>(it->second)].id_limits;
  const rt::TensorDesc::IdLimit want{dim(limit), what, allow_minus_one ? -1 : 0};
  for (const rt::TensorDesc::IdLimit& l : limits)
    if (l.limit == want.limit && l.what == want.what && l.lowest == want.lowest) return;
  limits.push_back(want);
}

void FunctionLowering::check_le(const ir::Dim& lhs, const ir::Dim& rhs, std::string what) {
  if (!lhs.is_symbolic() && !rhs.is_symbolic()) return;  // checked by the type rule
  fd.checks.push_back({dim(lhs), dim(rhs), std::move(what)});
}

View FunctionLowering::output_view(const ir::Op& op) const {
  auto r = result_index.find(op.result);
  if (r != result_index.end()) return dense_view(f.type(op.result), Storage::result, r->second, 0);
  if (op.arena_offset < 0)
    fail(
        "{}function '{}': {} ({}) has no arena offset: run the default pipeline before "
        "compiling",
        ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result), ir::op_name(op.kind));
  return dense_view(f.type(op.result), Storage::arena, 0, op.arena_offset);
}

const View& FunctionLowering::view_of(ir::ValueId v, const ir::Op& user) const {
  auto it = views.find(v);
  // Ops are lowered in order, and only a value evaluated inside its users' kernels
  // (inlined) has no view; a user that reads it from memory makes it not inlined.
  KILN_ASSERT(it != views.end(),
              fmt::format("lowering: operand {} of {} {} in function '{}' is not in memory",
                          passes::value_label(f, v), ir::op_name(user.kind),
                          passes::value_label(f, user.result), f.name));
  return it->second;
}

View FunctionLowering::scratch(const ir::TensorType& t) {
  View v = dense_view(t, Storage::arena, 0, scratch_top_);
  scratch_top_ += (ir::max_numel(m, t) * ir::dtype_size(t.dtype) + 63) / 64 * 64;
  return v;
}

void FunctionLowering::copy(const View& from, const View& to, const std::string& what) {
  const int rank = static_cast<int>(from.extents.size());
  ElementwiseKernel k;
  k.out_rank = rank;
  ElementwiseKernel::Node n;
  n.kind = ElementwiseKernel::Node::Kind::input;
  n.input = 0;
  n.dtype = node_dtype(from.type);
  n.rank = rank;
  n.broadcast.assign(static_cast<size_t>(rank), false);
  k.nodes.push_back(std::move(n));
  rt::StepDesc st{kernel_index(k), what, {}};
  st.args.push_back(from.halide());
  st.args.push_back(to.halide());
  fd.steps.push_back(std::move(st));
}

View FunctionLowering::dense(const View& v, const ir::TensorType& t, const std::string& what) {
  if (v.dense()) return v;
  View c = scratch(t);
  copy(v, c, what);
  return c;
}

rt::BufferDesc FunctionLowering::rows_arg(const ir::Op& op, size_t i) {
  const View& v = view_of(op.operands[i], op);
  if (auto b = rows_view(v, op)) return *b;
  const View c =
      dense(v, f.type(op.operands[i]),
            fmt::format("copy %{} for {} %{}", op.operands[i], ir::op_name(op.kind), op.result));
  return *rows_view(c, op);
}

std::pair<View, View> FunctionLowering::kept_output(const ir::Op& op,
                                                    const std::vector<bool>& reduced) const {
  View out = output_view(op);
  const ir::TensorType& in = f.type(op.operands[0]);
  ir::TensorType kept{f.type(op.result).dtype, {}};
  for (size_t d = 0; d < reduced.size(); ++d)
    kept.shape.push_back(reduced[d] ? ir::Dim::constant(1) : in.shape[d]);
  View v = dense_view(kept, out.storage, out.index, out.byte_offset);
  v.elem_offset = out.elem_offset;
  return std::pair<View, View>(out, v);
}

void FunctionLowering::copy_if_result(const ir::Op& op) {
  if (!result_index.count(op.result)) return;
  const ir::TensorType& t = f.type(op.result);
  ElementwiseKernel k;
  k.out_rank = static_cast<int>(t.rank());
  ElementwiseKernel::Node n;
  n.kind = ElementwiseKernel::Node::Kind::input;
  n.input = 0;
  n.dtype = node_dtype(t.dtype);
  n.rank = static_cast<int>(t.rank());
  n.broadcast.assign(t.rank(), false);
  k.nodes.push_back(std::move(n));
  View out = output_view(op);
  rt::StepDesc st{kernel_index(k), fmt::format("copy %{}", op.result), {}};
  st.args.push_back(views.at(op.result).halide());
  st.args.push_back(out.halide());
  fd.steps.push_back(std::move(st));
  views[op.result] = out;
}

void FunctionLowering::finish() {
  // Results not computed into their own buffer: a parameter, weight or table returned as
  // is, or a value returned twice. None changes after its definition, so each is copied
  // into the result's buffer here, after the other steps.
  for (size_t r = 0; r < f.results.size(); ++r) {
    const ir::ValueId v = f.results[r];
    const ir::Op* d = passes::def_op(f, defs, v);
    auto it = views.find(v);
    if (it != views.end() && it->second.storage == Storage::result &&
        it->second.index == static_cast<int32_t>(r))
      continue;
    if (it == views.end() || it->second.storage == Storage::arena)
      fail("{}function '{}': result {} is not computed by a kernel",
           d ? ir::line_prefix(d->loc) : std::string(), f.name, passes::value_label(f, v));
    copy(it->second, dense_view(f.type(v), Storage::result, static_cast<int32_t>(r), 0),
         fmt::format("copy %{} to result {}", v, r));
  }
  if (scratch_top_ > scratch_base_) fd.arena_bytes = scratch_top_;
  module.out.plan.functions.push_back(std::move(fd));
}

std::optional<rt::BufferDesc> FunctionLowering::rows_view(const View& v, const ir::Op& op) {
  const size_t r = v.extents.size();
  const DimExpr one = DimExpr::constant(1);
  // Row-wise ops take rank >= 1 operands [V8], and every view keeps the unit stride of
  // the last dim (View::reshaped and the copies see to it).
  KILN_ASSERT(r > 0 && v.strides[r - 1] == one,
              fmt::format("lowering: an operand of {} is not contiguous in its last dim",
                          ir::op_name(op.kind)));
  DimExpr rows = one;
  std::vector<size_t> lead;  // leading dims of extent other than 1
  for (size_t d = 0; d + 1 < r; ++d) {
    rows = rows * v.extents[d];
    if (!(v.extents[d] == one)) lead.push_back(d);
  }
  for (size_t k = 0; k + 1 < lead.size(); ++k)
    if (!(v.strides[lead[k]] == v.strides[lead[k + 1]] * v.extents[lead[k + 1]]))
      return std::nullopt;
  DimExpr row_stride = lead.empty() ? v.extents[r - 1] : v.strides[lead.back()];
  rt::BufferDesc b{v.storage, v.index, v.byte_offset, v.elem_offset, v.type, {}, {}};
  b.extents = {v.extents[r - 1], rows};
  b.strides = {one, row_stride};
  return b;
}

}  // namespace kiln::codegen::lowering
