// Lowering of an optimized module to an execution plan (see lower.h).
#include "codegen/lower.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "ir/op_types.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::codegen {
namespace {

using ir::OpKind;
using rt::DimExpr;
using rt::ElemType;
using rt::Storage;

ElemType elem_type(ir::DType d) {
  switch (d) {
    case ir::DType::f32:
      return ElemType::f32;
    case ir::DType::i64:
      return ElemType::i64;
    case ir::DType::boolean:
      return ElemType::u8;
    case ir::DType::i32:
      break;
  }
  fail("compiled code does not support {} tensors yet", ir::dtype_name(d));
}

ElementwiseKernel::Dtype node_dtype(ElemType t) {
  switch (t) {
    case ElemType::f32:
      return ElementwiseKernel::Dtype::f32;
    case ElemType::i64:
      return ElementwiseKernel::Dtype::i64;
    case ElemType::u8:
      return ElementwiseKernel::Dtype::u8;
    case ElemType::bf16:  // weights only, never an elementwise node
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

// A tensor in memory: storage plus a strided view, in IR dimension order.
struct View {
  Storage storage = Storage::arena;
  int32_t index = 0;
  int64_t byte_offset = 0;
  DimExpr elem_offset = DimExpr::constant(0);
  ElemType type = ElemType::f32;
  std::vector<DimExpr> extents, strides;

  bool dense() const {
    DimExpr expect = DimExpr::constant(1);
    for (size_t d = extents.size(); d-- > 0;) {
      if (!(strides[d] == expect)) return false;
      expect = expect * extents[d];
    }
    return true;
  }
  // The same memory seen with `extents` (same element count): strides of groups of dims
  // whose products match, where each group of this view's dims is contiguous within
  // itself (numpy's reshape without a copy). Dims of extent 1 are dropped first. nullopt
  // when the sizes cannot be matched as monomials or a group is not contiguous.
  std::optional<View> reshaped(const std::vector<DimExpr>& to) const {
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
      while (!(ps == pd)) {
        // Only constant sizes can be compared: grow the smaller side.
        if (!ps.is_constant() || !pd.is_constant()) return std::nullopt;
        if (ps.coeff < pd.coeff) {
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
  // The Halide buffer: dimensions reversed (innermost first).
  rt::BufferDesc halide() const {
    rt::BufferDesc b{storage, index, byte_offset, elem_offset, type, {}, {}};
    for (size_t d = extents.size(); d-- > 0;) {
      b.extents.push_back(extents[d]);
      b.strides.push_back(strides[d]);
    }
    return b;
  }
};

class Lowerer {
 public:
  Lowerer(const ir::Module& m, const LowerOptions& options) : m_(m), options_(options) {
    for (const ir::Symbol& s : m.symbols) out_.plan.symbols.push_back({s.name, s.max});
    out_.plan.model = m.name;
    out_.plan.config.assign(m.config.begin(), m.config.end());
  }

  LoweredModel run() {
    for (const ir::Function& f : m_.functions) lower_function(f);
    return std::move(out_);
  }

 private:
  DimExpr dim(const ir::Dim& d) const {
    if (!d.is_symbolic()) return DimExpr::constant(d.value);
    size_t i = 0;
    while (i < m_.symbols.size() && m_.symbols[i].name != d.symbol) ++i;
    // The pipeline verified the module: every symbol in a type is declared [V7].
    KILN_ASSERT(i < m_.symbols.size(),
                fmt::format("lowering: undeclared symbol '{}' in a verified module", d.symbol));
    return DimExpr::symbol(static_cast<int>(i));
  }

  int64_t dim_max(const ir::Dim& d) const {
    if (!d.is_symbolic()) return d.value;
    return m_.find_symbol(d.symbol)->max;
  }

  View dense_view(const ir::TensorType& t, Storage storage, int32_t index,
                  int64_t byte_offset) const {
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

  // The weight `name` as stored: as declared, or for a linear's weight (`linear`) laid
  // out as its kernel reads it, transposed or packed in panels of `panel` columns.
  int32_t weight_index(const std::string& name, bool linear, int64_t panel = 0, bool bf16 = false) {
    std::string key = name + (linear ? fmt::format("#t{}{}", panel, bf16 ? "b" : "") : "");
    auto it = weights_.find(key);
    if (it != weights_.end()) return it->second;
    const ir::Weight* w = m_.find_weight(name);
    KILN_ASSERT(w, "weight op refers to an undeclared weight");
    rt::WeightDesc d;
    d.name = name;
    auto shape_of = [](const ir::TensorType& t) {
      std::vector<int64_t> s;
      for (const ir::Dim& dd : t.shape) s.push_back(dd.value);
      return s;
    };
    if (w->derivation) {
      if (w->derivation->op != "concat" ||
          (w->derivation->attrs.count("axis") &&
           std::get<int64_t>(w->derivation->attrs.at("axis")) != 0))
        fail("weight '{}': only concatenation along axis 0 is supported at load time", name);
      for (const std::string& in : w->derivation->inputs) {
        d.sources.push_back(in);
        d.source_shapes.push_back(shape_of(m_.find_weight(in)->type));
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
                : panel ? std::vector<int64_t>{N / panel, K, panel}
                        : std::vector<int64_t>{K, N};
      d.transpose = true;
      d.panel = panel;
      d.bf16 = bf16;
    }
    int32_t index = static_cast<int32_t>(out_.plan.weights.size());
    out_.plan.weights.push_back(std::move(d));
    weights_[key] = index;
    return index;
  }

  int32_t table_index(int64_t rows, int64_t dim) {
    for (size_t i = 0; i < out_.plan.tables.size(); ++i)
      if (out_.plan.tables[i].rows == rows && out_.plan.tables[i].dim == dim)
        return static_cast<int32_t>(i);
    out_.plan.tables.push_back({"sinusoid", rows, dim});
    return static_cast<int32_t>(out_.plan.tables.size() - 1);
  }

  int32_t kernel_index(const KernelSpec& spec) {
    std::string name = kernel_name(spec);
    for (size_t i = 0; i < out_.plan.kernel_names.size(); ++i)
      if (out_.plan.kernel_names[i] == name) return static_cast<int32_t>(i);
    out_.plan.kernel_names.push_back(name);
    out_.kernels.push_back(spec);
    return static_cast<int32_t>(out_.kernels.size() - 1);
  }

  // A view collapsed to 2-D (inner, rows) for row-wise kernels, or nullopt when its
  // leading dims (those of extent 1 aside) are not evenly strided.
  static std::optional<rt::BufferDesc> rows_view(const View& v, const ir::Op& op) {
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

  void lower_function(const ir::Function& f) {
    rt::FunctionDesc fd;
    fd.name = f.name;
    if (f.arena_bytes < 0)
      fail("function '{}' has no memory plan: run the default pipeline before compiling", f.name);
    fd.arena_bytes = f.arena_bytes;
    const std::vector<int> defs = passes::def_index(f);
    const std::vector<int> uses = passes::use_counts(f);

    std::map<ir::ValueId, View> views;
    // The add_layernorm_sum op of each add_layernorm that has one, by the latter's result.
    std::map<ir::ValueId, int> sum_of;
    for (size_t i = 0; i < f.ops.size(); ++i)
      if (f.ops[i].kind == OpKind::add_layernorm_sum)
        sum_of[f.ops[i].operands[0]] = static_cast<int>(i);
    std::map<ir::ValueId, int32_t> result_index, param_index;
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
    // An index operand that is a parameter is checked at run time against `limit`.
    auto limit_param = [&](ir::ValueId v, const ir::Dim& limit, const char* what) {
      auto it = param_index.find(v);
      if (it == param_index.end()) return;
      fd.params[static_cast<size_t>(it->second)].id_limits.push_back({dim(limit), what});
    };
    auto check_le = [&](const ir::Dim& lhs, const ir::Dim& rhs, std::string what) {
      if (!lhs.is_symbolic() && !rhs.is_symbolic()) return;  // checked by the type rule
      fd.checks.push_back({dim(lhs), dim(rhs), std::move(what)});
    };

    // Where a computed value is written.
    auto output_view = [&](const ir::Op& op) {
      auto r = result_index.find(op.result);
      if (r != result_index.end())
        return dense_view(f.type(op.result), Storage::result, r->second, 0);
      if (op.arena_offset < 0)
        fail(
            "{}function '{}': {} ({}) has no arena offset: run the default pipeline before "
            "compiling",
            ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result),
            ir::op_name(op.kind));
      return dense_view(f.type(op.result), Storage::arena, 0, op.arena_offset);
    };
    auto view_of = [&](ir::ValueId v, const ir::Op& user) -> const View& {
      auto it = views.find(v);
      // Ops are lowered in order, and only a value evaluated inside its users' kernels
      // (inlined) has no view; a user that reads it from memory makes it not inlined.
      KILN_ASSERT(it != views.end(),
                  fmt::format("lowering: operand {} of {} {} in function '{}' is not in memory",
                              passes::value_label(f, v), ir::op_name(user.kind),
                              passes::value_label(f, user.result), f.name));
      return it->second;
    };
    // Scratch memory past the planned arena, for copies that the plan does not know of
    // (a strided view made dense for a kernel that needs it): each copy gets its own
    // bytes, never reused, so it overlaps nothing the plan placed.
    const int64_t scratch_base = (f.arena_bytes + 63) / 64 * 64;
    int64_t scratch_top = scratch_base;
    auto scratch = [&](const ir::TensorType& t) {
      View v = dense_view(t, Storage::arena, 0, scratch_top);
      scratch_top += (ir::max_numel(m_, t) * ir::dtype_size(t.dtype) + 63) / 64 * 64;
      return v;
    };
    // A copy kernel: `from` into `to` (same extents, any strides).
    auto copy = [&](const View& from, const View& to, const std::string& what) {
      const int rank = static_cast<int>(from.extents.size());
      ElementwiseKernel k;
      k.out_rank = rank;
      ElementwiseKernel::Node n;
      n.op = "input";
      n.input = 0;
      n.dtype = node_dtype(from.type);
      n.rank = rank;
      n.broadcast.assign(static_cast<size_t>(rank), false);
      k.nodes.push_back(std::move(n));
      rt::StepDesc st{kernel_index(k), what, {}};
      st.args.push_back(from.halide());
      st.args.push_back(to.halide());
      fd.steps.push_back(std::move(st));
    };
    // `v` (of type `t`) in dense memory: itself, or a copy in scratch memory.
    auto dense = [&](const View& v, const ir::TensorType& t, const std::string& what) {
      if (v.dense()) return v;
      View c = scratch(t);
      copy(v, c, what);
      return c;
    };
    // Operand `i` of `op` collapsed to rows for a row-wise kernel, copied to dense memory
    // first when its dims cannot be collapsed as they are.
    auto rows_arg = [&](const ir::Op& op, size_t i) {
      const View& v = view_of(op.operands[i], op);
      if (auto b = rows_view(v, op)) return *b;
      const View c = dense(
          v, f.type(op.operands[i]),
          fmt::format("copy %{} for {} %{}", op.operands[i], ir::op_name(op.kind), op.result));
      return *rows_view(c, op);
    };
    // The output view of `op` seen with the kept shape of a reduction (same bytes: dims
    // of extent 1 inserted).
    auto kept_output = [&](const ir::Op& op, const std::vector<bool>& reduced) {
      View out = output_view(op);
      const ir::TensorType& in = f.type(op.operands[0]);
      ir::TensorType kept{f.type(op.result).dtype, {}};
      for (size_t d = 0; d < reduced.size(); ++d)
        kept.shape.push_back(reduced[d] ? ir::Dim::constant(1) : in.shape[d]);
      View v = dense_view(kept, out.storage, out.index, out.byte_offset);
      v.elem_offset = out.elem_offset;
      return std::pair<View, View>(out, v);
    };

    // matmul, or a linear whose weight is computed (transpose_b: W[N,K], bias, act): the
    // general matmul kernel, on operands of any strides.
    auto lower_matmul = [&](const ir::Op& op, bool transpose_b) {
      const ir::TensorType& type = f.type(op.result);
      View a = view_of(op.operands[0], op);
      const View& b = view_of(op.operands[1], op);
      const View out = output_view(op);
      View o = out;
      // A rank-1 input of a linear is one row.
      auto add_row_dim = [](View& v) {
        v.strides.insert(v.strides.begin(), v.extents[0] * v.strides[0]);
        v.extents.insert(v.extents.begin(), DimExpr::constant(1));
      };
      if (a.extents.size() == 1) {
        add_row_dim(a);
        add_row_dim(o);
      }
      MatmulKernel k;
      k.transpose_b = transpose_b;
      k.a_rank = static_cast<int>(a.extents.size());
      k.b_rank = static_cast<int>(b.extents.size());
      k.out_rank = static_cast<int>(o.extents.size());
      const ir::TensorType& at = f.type(op.operands[0]);
      const ir::TensorType& bt = f.type(op.operands[1]);
      auto flags = [&](const ir::TensorType& t, int rank) {
        std::vector<bool> fl;
        for (int j = 0; j + 2 < rank; ++j) {
          const int64_t od = (type.rank() - 2) - (rank - 2) + j;
          fl.push_back(t.shape[static_cast<size_t>(j)].is_const(1) &&
                       !type.shape[static_cast<size_t>(od)].is_const(1));
        }
        return fl;
      };
      if (transpose_b) {
        k.has_bias = op.operands.size() == 3;
        k.act = op.str_attr("act");
        k.a_broadcast.assign(static_cast<size_t>(k.a_rank - 2), false);
      } else {
        k.a_broadcast = flags(at, k.a_rank);
        k.b_broadcast = flags(bt, k.b_rank);
      }
      rt::StepDesc st{kernel_index(k), fmt::format("{} %{}", ir::op_name(op.kind), op.result), {}};
      st.args.push_back(a.halide());
      st.args.push_back(b.halide());
      if (k.has_bias) st.args.push_back(view_of(op.operands[2], op).halide());
      st.args.push_back(o.halide());
      fd.steps.push_back(std::move(st));
      views[op.result] = out;
    };

    // Whether value v is computed inside its users' elementwise kernel (fuse-elementwise's
    // mark, Op::fused; the verifier's V12 bounds the depth of a group's tree).
    auto inlined = [&](ir::ValueId v) { return defs[v] >= 0 && f.ops[defs[v]].fused; };
    // A view (reshape, slice) that the function returns: copied into the caller's buffer
    // where it is defined (its operand is live there), e.g. one of the keys and values a
    // merged projection computes together.
    auto copy_if_result = [&](const ir::Op& op) {
      if (!result_index.count(op.result)) return;
      const ir::TensorType& t = f.type(op.result);
      ElementwiseKernel k;
      k.out_rank = static_cast<int>(t.rank());
      ElementwiseKernel::Node n;
      n.op = "input";
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
    };

    for (const ir::Op& op : f.ops) {
      const ir::TensorType& type = f.type(op.result);
      bool i32 = type.dtype == ir::DType::i32;
      for (ir::ValueId v : op.operands) i32 = i32 || f.type(v).dtype == ir::DType::i32;
      if (i32)
        fail(
            "{}function '{}': {} {} takes or makes an i32 tensor; compiled code supports f32, "
            "i64 and bool",
            ir::line_prefix(op.loc), f.name, ir::op_name(op.kind),
            passes::value_label(f, op.result));
      switch (op.kind) {
        case OpKind::weight:
          views[op.result] =
              dense_view(type, Storage::weight, weight_index(op.str_attr("name"), false), 0);
          continue;
        case OpKind::reshape: {
          // A view of the operand's memory when its strides allow (always when it is
          // dense), else of a dense copy of it.
          const View& src = view_of(op.operands[0], op);
          std::vector<DimExpr> to;
          for (const ir::Dim& d : type.shape) to.push_back(dim(d));
          std::optional<View> v;
          if (src.dense()) {
            v = dense_view(type, src.storage, src.index, src.byte_offset);
            v->elem_offset = src.elem_offset;
          } else {
            v = src.reshaped(to);
          }
          if (!v) {
            const View c =
                dense(src, f.type(op.operands[0]),
                      fmt::format("copy %{} for reshape %{}", op.operands[0], op.result));
            v = dense_view(type, c.storage, c.index, c.byte_offset);
          }
          views[op.result] = *v;
          copy_if_result(op);
          continue;
        }
        case OpKind::slice: {
          // A view of the operand: offset += start · stride[axis], extent from the type.
          // Offsets stay monomials, so a nonzero start needs a constant stride and offset.
          // Where the offset is not one monomial, a view of a dense copy of the operand.
          View v = view_of(op.operands[0], op);
          int64_t axis = op.int_attr("axis");
          if (axis < 0) axis += static_cast<int64_t>(v.extents.size());
          const int64_t start = op.int_attr("start");
          if (start != 0) {
            std::optional<DimExpr> offset =
                add_offsets(v.elem_offset, DimExpr::constant(start) * v.strides[axis]);
            if (!offset) {
              v = scratch(f.type(op.operands[0]));
              copy(view_of(op.operands[0], op), v,
                   fmt::format("copy %{} for slice %{}", op.operands[0], op.result));
              offset = DimExpr::constant(start) * v.strides[axis];
            }
            v.elem_offset = *offset;
          }
          v.extents[axis] = dim(type.shape[axis]);
          views[op.result] = v;
          copy_if_result(op);
          continue;
        }
        case OpKind::cache_write: {
          // In place: the cache is a parameter read only here, and the result is returned,
          // so the caller's cache buffer serves as both (the runtime insists on it).
          const ir::ValueId cache = op.operands[0];
          auto p = param_index.find(cache);
          auto r = result_index.find(op.result);
          if (p == param_index.end() || uses[cache] != 1 || r == result_index.end())
            fail(
                "{}function '{}': cache_write {} must update a parameter that nothing else "
                "reads and be a result of the function (compiled code writes the cache in place)",
                ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result));
          if (param_index.find(op.operands[2]) == param_index.end())
            fail("{}function '{}': cache_write {} must take its position from a parameter",
                 ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result));
          const View& x = view_of(op.operands[1], op);
          if (x.storage != Storage::param && x.storage != Storage::arena)
            fail("{}function '{}': cache_write {} writes rows of a weight or table",
                 ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result));
          const ir::TensorType& ct = f.type(cache);
          fd.results[static_cast<size_t>(r->second)].updates_param = p->second;
          limit_param(op.operands[2], ct.shape[0], "position");
          check_le(f.type(op.operands[1]).shape[0], ct.shape[1],
                   fmt::format("the rows of '{}' must fit in the slots of cache '{}'",
                               f.values[op.operands[1]].name.empty()
                                   ? passes::value_label(f, op.operands[1])
                                   : f.values[op.operands[1]].name,
                               f.values[cache].name));
          View out = output_view(op);
          rt::StepDesc st{
              -1, fmt::format("cache_write %{}", op.result), {}, rt::Builtin::cache_write};
          st.args.push_back(rows_arg(op, 1));
          st.args.push_back(view_of(op.operands[2], op).halide());
          st.args.push_back(out.halide());
          fd.steps.push_back(std::move(st));
          views[op.result] = out;
          continue;
        }
        case OpKind::cache_attention:
        case OpKind::memory_attention: {
          const bool memory = op.kind == OpKind::memory_attention;
          const ir::TensorType& q = f.type(op.operands[0]);
          const ir::TensorType& kt = f.type(op.operands[1]);
          const ir::TensorType& vt = f.type(op.operands[2]);
          const int64_t heads = op.int_attr("heads");
          StepAttentionKernel k{heads, q.shape[2].value / heads, vt.shape[2].value / heads, memory,
                                op.float_attr("scale")};
          const ir::ValueId index = op.operands[3];
          if (memory) {
            limit_param(index, kt.shape[0], "source row");
          } else {
            limit_param(index, kt.shape[1], "cache slot");
            check_le(
                f.type(index).shape[1], kt.shape[0],
                fmt::format("the positions of '{}' must fit in the cache", f.values[index].name));
          }
          View out = output_view(op);
          rt::StepDesc st{
              kernel_index(k), fmt::format("{} %{}", ir::op_name(op.kind), op.result), {}};
          st.args.push_back(rows_arg(op, 0));
          for (size_t i = 1; i < op.operands.size(); ++i)
            st.args.push_back(view_of(op.operands[i], op).halide());
          st.args.push_back(*rows_view(out, op));
          fd.steps.push_back(std::move(st));
          views[op.result] = out;
          continue;
        }
        case OpKind::sinusoid_table: {
          View v = dense_view(type, Storage::table,
                              table_index(dim_max(type.shape[0]), type.shape[1].value), 0);
          views[op.result] = v;
          continue;
        }
        case OpKind::linear: {
          const ir::Op* w = passes::def_op(f, defs, op.operands[1]);
          if (!w || w->kind != OpKind::weight) {
            // A weight computed at run time: the general matmul, reading W[N,K] as Wᵀ.
            lower_matmul(op, /*transpose_b=*/true);
            continue;
          }
          const ir::TensorType& wt = f.type(op.operands[1]);
          const int64_t N = wt.shape[0].value, K = wt.shape[1].value;
          LinearKernel k{K, N, op.str_attr("act"), op.operands.size() == 3, linear_panel_for(N)};
          if (options_.bf16_weights) {
            k.bf16 = true;
            k.panel = 64;
          }
          View out = output_view(op);
          rt::StepDesc s{kernel_index(k), fmt::format("linear %{}", op.result), {}};
          s.args.push_back(rows_arg(op, 0));
          // The weight as stored (weight_index lays it out): [K, N], [N/panel, K, panel] or
          // for bf16 [N/64, K/2, 64, 2].
          const int32_t wi = weight_index(w->str_attr("name"), true, k.panel, k.bf16);
          std::vector<ir::Dim> stored;
          for (int64_t d : out_.plan.weights[static_cast<size_t>(wi)].shape)
            stored.push_back(ir::Dim::constant(d));
          View wv = dense_view(ir::TensorType{ir::DType::f32, stored}, Storage::weight, wi, 0);
          if (k.bf16) wv.type = ElemType::bf16;
          s.args.push_back(wv.halide());
          if (k.has_bias) s.args.push_back(view_of(op.operands[2], op).halide());
          s.args.push_back(*rows_view(out, op));
          fd.steps.push_back(std::move(s));
          views[op.result] = out;
          continue;
        }
        case OpKind::attention: {
          const ir::TensorType& q = f.type(op.operands[0]);
          const ir::TensorType& v = f.type(op.operands[2]);
          int64_t heads = op.int_attr("heads");
          auto flag = [&](const char* name) { return op.has_attr(name) && op.int_attr(name) == 1; };
          const bool query_pad = flag("query_pad");
          AttentionKernel k{heads,
                            q.shape[2].value / heads,
                            v.shape[2].value / heads,
                            flag("causal"),
                            op.operands.size() == (query_pad ? 5u : 4u),
                            op.float_attr("scale"),
                            flag("fill_inf"),
                            query_pad};
          View out = output_view(op);
          rt::StepDesc s{kernel_index(k), fmt::format("attention %{}", op.result), {}};
          for (ir::ValueId operand : op.operands) s.args.push_back(view_of(operand, op).halide());
          s.args.push_back(out.halide());
          fd.steps.push_back(std::move(s));
          views[op.result] = out;
          continue;
        }
        case OpKind::add_layernorm_sum:
          // Written by its add_layernorm's kernel (below), which set its view.
          KILN_ASSERT(views.count(op.result), "lowering: add_layernorm_sum before its sum");
          continue;
        case OpKind::layernorm:
        case OpKind::add_layernorm: {
          bool with_add = op.kind == OpKind::add_layernorm;
          auto sum = sum_of.find(op.result);
          const bool with_sum = sum != sum_of.end();
          const bool broadcast_y = with_add && f.type(op.operands[1]).rank() < type.rank();
          LayerNormKernel k{type.shape.back().value, op.float_attr("eps"), with_add, with_sum,
                            broadcast_y};
          k.unbiased = op.has_attr("unbiased") && op.int_attr("unbiased") == 1;
          k.eps_outside = op.has_attr("eps_outside") && op.int_attr("eps_outside") == 1;
          View out = output_view(op);
          rt::StepDesc s{
              kernel_index(k), fmt::format("{} %{}", ir::op_name(op.kind), op.result), {}};
          s.args.push_back(rows_arg(op, 0));
          if (with_add) s.args.push_back(rows_arg(op, 1));
          for (size_t i = with_add ? 2 : 1; i < op.operands.size(); ++i)
            s.args.push_back(view_of(op.operands[i], op).halide());
          s.args.push_back(*rows_view(out, op));
          if (with_sum) {
            const ir::Op& sum_op = f.ops[static_cast<size_t>(sum->second)];
            View sv = output_view(sum_op);
            s.args.push_back(*rows_view(sv, sum_op));
            views[sum_op.result] = sv;
          }
          fd.steps.push_back(std::move(s));
          views[op.result] = out;
          continue;
        }
        case OpKind::matmul:
          lower_matmul(op, /*transpose_b=*/false);
          continue;
        case OpKind::transpose: {
          // A copy kernel reading the operand at permuted indices.
          const int rank = static_cast<int>(type.rank());
          ElementwiseKernel k;
          k.out_rank = rank;
          ElementwiseKernel::Node in;
          in.op = "input";
          in.input = 0;
          in.dtype = node_dtype(type.dtype);
          in.rank = rank;
          in.broadcast.assign(static_cast<size_t>(rank), false);
          ElementwiseKernel::Node t = in;
          t.op = "transpose";
          t.input = -1;
          t.broadcast.clear();
          t.operands = {0};
          t.perm = op.ints_attr("perm");
          k.nodes = {in, t};
          View out = output_view(op);
          rt::StepDesc st{kernel_index(k), fmt::format("transpose %{}", op.result), {}};
          st.args.push_back(view_of(op.operands[0], op).halide());
          st.args.push_back(out.halide());
          fd.steps.push_back(std::move(st));
          views[op.result] = out;
          continue;
        }
        case OpKind::concat: {
          // One copy per operand into its stretch of the output along the axis.
          View out = output_view(op);
          const int64_t axis = ir::normalize_axis(op.int_attr("axis"), type.rank());
          DimExpr start = DimExpr::constant(0);
          for (ir::ValueId operand : op.operands) {
            const View& from = view_of(operand, op);
            View to = out;
            to.extents[axis] = from.extents[axis];
            std::optional<DimExpr> offset = add_offsets(out.elem_offset, start * out.strides[axis]);
            // The output is dense and the axis constant unless there is a single operand,
            // so every offset is a multiple of the axis's stride.
            KILN_ASSERT(offset.has_value(), "lowering: concat offset is not a monomial");
            to.elem_offset = *offset;
            copy(from, to, fmt::format("concat %{} (operand %{})", op.result, operand));
            start = DimExpr::constant(start.coeff + from.extents[axis].coeff);
          }
          views[op.result] = out;
          continue;
        }
        case OpKind::softmax: {
          SoftmaxKernel k{static_cast<int>(type.rank()),
                          static_cast<int>(ir::normalize_axis(op.int_attr("axis"), type.rank()))};
          View out = output_view(op);
          rt::StepDesc st{kernel_index(k), fmt::format("softmax %{}", op.result), {}};
          st.args.push_back(view_of(op.operands[0], op).halide());
          st.args.push_back(out.halide());
          fd.steps.push_back(std::move(st));
          views[op.result] = out;
          continue;
        }
        case OpKind::reduce_sum:
        case OpKind::reduce_mean:
        case OpKind::reduce_max:
        case OpKind::argmax: {
          const ir::TensorType& in = f.type(op.operands[0]);
          ReduceKernel k;
          k.i64 = in.dtype == ir::DType::i64;
          k.reduced.assign(static_cast<size_t>(in.rank()), false);
          if (op.kind == OpKind::argmax) {
            k.op = ReduceKernel::Op::argmax;
            k.reduced[static_cast<size_t>(ir::normalize_axis(op.int_attr("axis"), in.rank()))] =
                true;
          } else {
            k.op = op.kind == OpKind::reduce_sum    ? ReduceKernel::Op::sum
                   : op.kind == OpKind::reduce_mean ? ReduceKernel::Op::mean
                                                    : ReduceKernel::Op::max;
            for (int64_t a : op.ints_attr("axes"))
              k.reduced[static_cast<size_t>(ir::normalize_axis(a, in.rank()))] = true;
          }
          if (in.dtype != ir::DType::f32 && in.dtype != ir::DType::i64)
            fail("{}function '{}': {} {} of {} is not supported in compiled code",
                 ir::line_prefix(op.loc), f.name, ir::op_name(op.kind),
                 passes::value_label(f, op.result), ir::to_string(in));
          const auto [out, kept] = kept_output(op, k.reduced);
          rt::StepDesc st{
              kernel_index(k), fmt::format("{} %{}", ir::op_name(op.kind), op.result), {}};
          st.args.push_back(view_of(op.operands[0], op).halide());
          st.args.push_back(kept.halide());
          fd.steps.push_back(std::move(st));
          views[op.result] = out;
          continue;
        }
        default:
          break;
      }
      if (!ir::is_elementwise_fusable(op.kind))
        fail(
            "{}function '{}': op {} ({}) has no kernel in compiled code; run the default "
            "pipeline, which fuses it, or extend codegen",
            ir::line_prefix(op.loc), f.name, ir::op_name(op.kind),
            passes::value_label(f, op.result));
      if (inlined(op.result)) continue;  // evaluated inside its user's kernel
      if (uses[op.result] == 0) continue;

      // A group root: build its expression tree.
      ElementwiseKernel k;
      k.out_rank = static_cast<int>(type.rank());
      std::vector<ir::ValueId> inputs;
      std::function<int(ir::ValueId, bool)> node = [&](ir::ValueId v, bool is_root) -> int {
        const ir::Op* d = passes::def_op(f, defs, v);
        const ir::TensorType& t = f.type(v);
        ElementwiseKernel::Node n;
        n.dtype = node_dtype(t.dtype);
        n.rank = static_cast<int>(t.rank());
        if (is_root || (d && inlined(v))) {
          n.op = ir::op_name(d->kind);
          if (d->kind == OpKind::constant) n.value = d->float_attr("value");
          if (d->kind == OpKind::iota) n.axis = d->int_attr("axis");
          if (d->kind == OpKind::gather) n.table_rows = f.type(d->operands[0]).shape[0].value;
          for (ir::ValueId o : d->operands) n.operands.push_back(node(o, false));
        } else {
          n.op = "input";
          auto it = std::find(inputs.begin(), inputs.end(), v);
          n.input = static_cast<int>(it - inputs.begin());
          if (it == inputs.end()) inputs.push_back(v);
          // Broadcast flags: a size-1 dim under a larger output dim (right-aligned).
          n.broadcast.assign(t.rank(), false);
          for (int64_t dd = 0; dd < t.rank(); ++dd) {
            int64_t od = type.rank() - t.rank() + dd;
            if (od >= 0 && t.shape[dd].is_const(1) && !type.shape[od].is_const(1))
              n.broadcast[dd] = true;
          }
        }
        k.nodes.push_back(std::move(n));
        return static_cast<int>(k.nodes.size() - 1);
      };
      node(op.result, true);
      View out = output_view(op);
      rt::StepDesc s{kernel_index(k), fmt::format("{} %{}", ir::op_name(op.kind), op.result), {}};
      for (ir::ValueId in : inputs) s.args.push_back(view_of(in, op).halide());
      s.args.push_back(out.halide());
      fd.steps.push_back(std::move(s));
      views[op.result] = out;
    }
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
    if (scratch_top > scratch_base) fd.arena_bytes = scratch_top;
    out_.plan.functions.push_back(std::move(fd));
  }

  const ir::Module& m_;
  const LowerOptions options_;
  LoweredModel out_;
  std::map<std::string, int32_t> weights_;
};

}  // namespace

LoweredModel lower_module(const ir::Module& module, const LowerOptions& options) {
  return Lowerer(module, options).run();
}

}  // namespace kiln::codegen
