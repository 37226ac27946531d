// Lowering of the general path, for ops no fused kernel took: batched matmul, transpose
// (a copy kernel), concat (one copy per operand), softmax, the reductions over any axes,
// topk and scatter_add.
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "codegen/lower/lowering.h"
#include "ir/op_types.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::codegen::lowering {

using ir::OpKind;
using rt::DimExpr;
using rt::Storage;

void lower_general_matmul(FunctionLowering& L, const ir::Op& op, bool transpose_b) {
  const ir::Function& f = L.f;
  const ir::TensorType& type = f.type(op.result);
  View a = L.view_of(op.operands[0], op);
  const View& b = L.view_of(op.operands[1], op);
  const View out = L.output_view(op);
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
  // linear_rows (x, W, ids [, b]): column n is row ids(n) of W (MatmulKernel::gather_b).
  const bool rows = op.kind == OpKind::linear_rows;
  const size_t bias_operand = rows ? 3 : 2;
  MatmulKernel k;
  k.transpose_b = transpose_b;
  k.gather_b = rows;
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
    k.has_bias = op.operands.size() == bias_operand + 1;
    k.act = op.str_attr("act");
    k.a_broadcast.assign(static_cast<size_t>(k.a_rank - 2), false);
  } else {
    k.a_broadcast = flags(at, k.a_rank);
    k.b_broadcast = flags(bt, k.b_rank);
  }
  rt::StepDesc st{L.kernel_index(k), fmt::format("{} %{}", ir::op_name(op.kind), op.result), {}};
  st.args.push_back(a.halide());
  st.args.push_back(b.halide());
  if (rows) st.args.push_back(L.view_of(op.operands[2], op).halide());
  if (k.has_bias) st.args.push_back(L.view_of(op.operands[bias_operand], op).halide());
  st.args.push_back(o.halide());
  L.fd.steps.push_back(std::move(st));
  L.views[op.result] = out;
}

void lower_matmul(FunctionLowering& L, const ir::Op& op) {
  lower_general_matmul(L, op, /*transpose_b=*/false);
}

void lower_transpose(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& type = f.type(op.result);
  // A copy kernel reading the operand at permuted indices.
  const int rank = static_cast<int>(type.rank());
  ElementwiseKernel k;
  k.out_rank = rank;
  ElementwiseKernel::Node in;
  in.kind = ElementwiseKernel::Node::Kind::input;
  in.input = 0;
  in.dtype = node_dtype(type.dtype);
  in.rank = rank;
  in.broadcast.assign(static_cast<size_t>(rank), false);
  ElementwiseKernel::Node t = in;
  t.kind = ElementwiseKernel::Node::Kind::op;
  t.op = OpKind::transpose;
  t.input = -1;
  t.broadcast.clear();
  t.operands = {0};
  t.perm = op.ints_attr("perm");
  k.nodes = {in, t};
  View out = L.output_view(op);
  rt::StepDesc st{L.kernel_index(k), fmt::format("transpose %{}", op.result), {}};
  st.args.push_back(L.view_of(op.operands[0], op).halide());
  st.args.push_back(out.halide());
  L.fd.steps.push_back(std::move(st));
  L.views[op.result] = out;
}

void lower_concat(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& type = f.type(op.result);
  // One copy per operand into its stretch of the output along the axis, which starts at the
  // sum of the extents before it (an IR dim: 0, 1, T, T+1, ...; the type rule added them).
  View out = L.output_view(op);
  const int64_t axis = ir::normalize_axis(op.int_attr("axis"), type.rank());
  ir::Dim start = ir::Dim::constant(0);
  for (ir::ValueId operand : op.operands) {
    const View& from = L.view_of(operand, op);
    View to = out;
    to.extents[axis] = from.extents[axis];
    std::optional<DimExpr> offset = add_offsets(out.elem_offset, L.dim(start) * out.strides[axis]);
    // The output is dense (elem_offset 0) and start·stride one monomial.
    KILN_ASSERT(offset.has_value(), "lowering: concat offset is not a monomial");
    to.elem_offset = *offset;
    L.copy(from, to, fmt::format("concat %{} (operand %{})", op.result, operand));
    const std::optional<ir::Dim> next = ir::add_dims(start, f.type(operand).shape[axis]);
    KILN_ASSERT(next.has_value(), "lowering: concat extents do not add up");
    start = *next;
  }
  L.views[op.result] = out;
}

void lower_softmax(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& type = f.type(op.result);
  SoftmaxKernel k{static_cast<int>(type.rank()),
                  static_cast<int>(ir::normalize_axis(op.int_attr("axis"), type.rank()))};
  View out = L.output_view(op);
  rt::StepDesc st{L.kernel_index(k), fmt::format("softmax %{}", op.result), {}};
  st.args.push_back(L.view_of(op.operands[0], op).halide());
  st.args.push_back(out.halide());
  L.fd.steps.push_back(std::move(st));
  L.views[op.result] = out;
}

void lower_reduce(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& in = f.type(op.operands[0]);
  ReduceKernel k;
  k.i64 = in.dtype == ir::DType::i64;
  k.reduced.assign(static_cast<size_t>(in.rank()), false);
  if (op.kind == OpKind::argmax) {
    k.op = ReduceKernel::Op::argmax;
    k.reduced[static_cast<size_t>(ir::normalize_axis(op.int_attr("axis"), in.rank()))] = true;
  } else {
    k.op = op.kind == OpKind::reduce_sum    ? ReduceKernel::Op::sum
           : op.kind == OpKind::reduce_mean ? ReduceKernel::Op::mean
                                            : ReduceKernel::Op::max;
    for (int64_t a : op.ints_attr("axes"))
      k.reduced[static_cast<size_t>(ir::normalize_axis(a, in.rank()))] = true;
  }
  if (in.dtype != ir::DType::f32 && in.dtype != ir::DType::i64)
    fail("{}function '{}': {} {} of {} is not supported in compiled code", ir::line_prefix(op.loc),
         f.name, ir::op_name(op.kind), passes::value_label(f, op.result), ir::to_string(in));
  const auto [out, kept] = L.kept_output(op, k.reduced);
  rt::StepDesc st{L.kernel_index(k), fmt::format("{} %{}", ir::op_name(op.kind), op.result), {}};
  st.args.push_back(L.view_of(op.operands[0], op).halide());
  st.args.push_back(kept.halide());
  L.fd.steps.push_back(std::move(st));
  L.views[op.result] = out;
}

void lower_topk(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& in = f.type(op.operands[0]);
  if (in.dtype != ir::DType::f32 && in.dtype != ir::DType::i64)
    fail("{}function '{}': topk {} of {} is not supported in compiled code",
         ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result), ir::to_string(in));
  const TopkKernel k{op.int_attr("k"), in.dtype == ir::DType::i64};
  // A symbolic last axis: at least k long, checked when binding.
  L.check_le(ir::Dim::constant(k.k), in.shape.back(),
             fmt::format("topk {} needs at least k = {} elements along its last axis",
                         passes::value_label(f, op.result), k.k));
  View out = L.output_view(op);
  rt::StepDesc st{L.kernel_index(k), fmt::format("topk %{}", op.result), {}};
  st.args.push_back(L.rows_arg(op, 0));
  st.args.push_back(*L.rows_view(out, op));
  L.fd.steps.push_back(std::move(st));
  L.views[op.result] = out;
}

void lower_scatter_add(FunctionLowering& L, const ir::Op& op) {
  const ir::Function& f = L.f;
  const ir::TensorType& type = f.type(op.result);
  if (type.dtype != ir::DType::f32 && type.dtype != ir::DType::i64)
    fail("{}function '{}': scatter_add {} of {} is not supported in compiled code",
         ir::line_prefix(op.loc), f.name, passes::value_label(f, op.result), ir::to_string(type));
  const ScatterAddKernel k{static_cast<int>(type.rank()),
                           static_cast<int>(ir::normalize_axis(op.int_attr("axis"), type.rank())),
                           type.dtype == ir::DType::i64};
  View out = L.output_view(op);
  rt::StepDesc st{L.kernel_index(k), fmt::format("scatter_add %{}", op.result), {}};
  for (size_t i = 0; i < 3; ++i) st.args.push_back(L.view_of(op.operands[i], op).halide());
  st.args.push_back(out.halide());
  L.fd.steps.push_back(std::move(st));
  L.views[op.result] = out;
}

}  // namespace kiln::codegen::lowering
