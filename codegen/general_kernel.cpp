// The general path's kernels (kernels.h): reductions and argmax over any set of axes,
// softmax over any axis, and a batched matmul with broadcasting, for ops that no fused
// kernel computes. Correct for every extent and layout the IR allows; scheduled plainly.
//
// Indexing: IR dim i of a rank-n tensor is Halide dim n-1-i (dim 0 innermost).
//
// Schedules: the output's dims other than the innermost are fused and run in parallel;
// each reduction is computed per such row of the output (compute_at), so the region it
// computes is exactly the row the output needs (no reads past an input's extent), with
// the innermost dim in vectors (guarded tails) where it is not reduced.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "codegen/halide_kernels.h"
#include "support/error.h"

namespace kiln::codegen {

namespace {

using Halide::Expr;
using Halide::Func;
using Halide::ImageParam;
using Halide::RDom;
using Halide::TailStrategy;
using Halide::Var;

std::vector<Var> make_vars(int rank) {
  std::vector<Var> vars;
  for (int i = 0; i < rank; ++i) vars.emplace_back(fmt::format("dim{}", i));
  return vars;
}

std::vector<Expr> as_exprs(const std::vector<Var>& vars) {
  return std::vector<Expr>(vars.begin(), vars.end());
}

// Fuses dims 1.. of `f` (rank >= 2) into one var run in parallel, vectorizes dim 0 when
// `vector_dim0`; returns the var the row loop runs over (dim 0's var for rank 1, none for
// rank 0: then `has_row` is false).
Var schedule_rows(Func& f, const std::vector<Var>& vars, bool vector_dim0, int lanes,
                  bool& has_row) {
  const int rank = static_cast<int>(vars.size());
  has_row = rank >= 2;
  if (rank == 0) return Var("unused");
  if (vector_dim0) f.vectorize(vars[0], lanes, TailStrategy::GuardWithIf);
  if (rank == 1) return vars[0];
  Var rows = vars[1];
  for (int i = 2; i < rank; ++i) {
    Var fused(fmt::format("rows{}", i));
    f.fuse(rows, vars[i], fused);
    rows = fused;
  }
  f.parallel(rows);
  return rows;
}

// Whether an f32 is NaN (false for integers).
Expr nan_of(const Expr& x) {
  if (!x.type().is_float()) return Halide::Internal::const_false(x.type().lanes());
  return is_nan_bits(x);
}

}  // namespace

KernelPipeline build_reduce(const ReduceKernel& spec, const Halide::Target& target) {
  const int rank = static_cast<int>(spec.reduced.size());
  const Halide::Type type = spec.i64 ? Halide::Int(64) : Halide::Float(32);
  KILN_ASSERT(!(spec.op == ReduceKernel::Op::mean && spec.i64), "reduce: mean of i64");
  ImageParam in(type, rank, "input");
  std::vector<Var> vars = make_vars(rank);
  // Halide dim h is IR dim rank-1-h.
  auto reduced = [&](int h) { return spec.reduced[static_cast<size_t>(rank - 1 - h)]; };
  Halide::Region ranges;
  std::vector<int> reduced_dims;
  for (int h = 0; h < rank; ++h)
    if (reduced(h)) {
      reduced_dims.push_back(h);
      // argmax starts from element 0 and scans the rest.
      if (spec.op == ReduceKernel::Op::argmax)
        ranges.emplace_back(1, in.dim(h).extent() - 1);
      else
        ranges.emplace_back(0, in.dim(h).extent());
    }
  if (spec.op == ReduceKernel::Op::argmax)
    KILN_ASSERT(reduced_dims.size() == 1, "reduce: argmax over one dim");

  Func out("reduce");
  Func acc("reduce_acc");
  std::vector<Expr> at = as_exprs(vars);
  RDom r;
  if (!ranges.empty()) r = RDom(ranges, "r");
  if (reduced_dims.empty()) {
    // Over no axes: the input itself (argmax has exactly one axis).
    out(vars) = in(at);
  } else {
    std::vector<Expr> idx = at;
    for (size_t k = 0; k < reduced_dims.size(); ++k) idx[reduced_dims[k]] = r[static_cast<int>(k)];
    const Expr x = in(idx);
    switch (spec.op) {
      case ReduceKernel::Op::sum:
      case ReduceKernel::Op::mean: {
        const Halide::Type acc_type = spec.i64 ? Halide::Int(64) : Halide::Float(64);
        acc(vars) = Halide::Internal::make_zero(acc_type);
        acc(vars) += Halide::cast(acc_type, x);
        Expr total = acc(vars);
        if (spec.op == ReduceKernel::Op::mean) {
          Expr count = Halide::cast(Halide::Float(64), 1);
          for (int h : reduced_dims)
            count = count * Halide::cast(Halide::Float(64), in.dim(h).extent());
          total = total / count;
        }
        out(vars) = Halide::cast(type, total);
        break;
      }
      case ReduceKernel::Op::max: {
        const Expr lowest = spec.i64 ? Expr(std::numeric_limits<int64_t>::min())
                                     : Expr(-std::numeric_limits<float>::infinity());
        acc(vars) = lowest;
        const Expr cur = acc(vars);
        acc(vars) = spec.i64 ? Halide::max(cur, x)
                             : Halide::select(nan_of(cur), cur, nan_of(x), x, Halide::max(cur, x));
        out(vars) = acc(vars);
        break;
      }
      case ReduceKernel::Op::argmax: {
        std::vector<Expr> first = at;
        first[reduced_dims[0]] = 0;
        acc(vars) = Halide::Tuple(Expr(int64_t{0}), in(first));
        const Expr best = acc(vars)[1];
        const Expr take = !nan_of(best) && (nan_of(x) || x > best);
        acc(vars) =
            Halide::Tuple(Halide::select(take, Halide::cast(Halide::Int(64), r.x), acc(vars)[0]),
                          Halide::select(take, x, best));
        out(vars) = acc(vars)[0];
        break;
      }
    }
  }
  const int lanes = vector_lanes(target);
  bool has_row = false;
  const bool vector_dim0 = rank >= 1 && !reduced(0) && spec.op != ReduceKernel::Op::argmax;
  const Var row = schedule_rows(out, vars, vector_dim0, lanes, has_row);
  if (!reduced_dims.empty()) {
    if (rank >= 1) acc.compute_at(out, has_row ? row : vars[0]);
    if (vector_dim0) {
      acc.vectorize(vars[0], lanes, TailStrategy::GuardWithIf);
      acc.update().reorder(vars[0], r.x).vectorize(vars[0], lanes, TailStrategy::GuardWithIf);
    }
  }
  return KernelPipeline{Halide::Pipeline(out), {in}};
}

KernelPipeline build_softmax(const SoftmaxKernel& spec, const Halide::Target& target) {
  const int rank = spec.rank;
  KILN_ASSERT(rank >= 1 && spec.axis >= 0 && spec.axis < rank, "softmax axis");
  ImageParam in(Halide::Float(32), rank, "input");
  std::vector<Var> vars = make_vars(rank);
  const int h = rank - 1 - spec.axis;  // the Halide dim normalized over
  // The row statistics are functions of the other dims.
  std::vector<Var> others;
  for (int d = 0; d < rank; ++d)
    if (d != h) others.push_back(vars[d]);
  RDom r(0, in.dim(h).extent(), "r");
  std::vector<Expr> idx = as_exprs(vars);
  idx[h] = r;
  Func mx("softmax_max"), sum("softmax_sum"), out("softmax");
  mx(others) = -std::numeric_limits<float>::infinity();
  const Expr cur = mx(others), x = in(idx);
  mx(others) = Halide::select(nan_of(cur), cur, nan_of(x), x, Halide::max(cur, x));
  const Expr m = Halide::cast(Halide::Float(64), mx(others));
  sum(others) = Expr(0.0);
  sum(others) += Halide::exp(Halide::cast(Halide::Float(64), x) - m);
  const Expr e = Halide::exp(Halide::cast(Halide::Float(64), in(as_exprs(vars))) - m);
  out(vars) = Halide::cast(Halide::Float(32), e / sum(others));
  // Over the innermost dim: the statistics per row of the output, where it is computed.
  // Over another dim (whose loop the output's row loop contains): once for the tensor.
  const int lanes = vector_lanes(target);
  bool has_row = false;
  const Var row = schedule_rows(out, vars, /*vector_dim0=*/false, lanes, has_row);
  if (has_row && h == 0) {
    mx.compute_at(out, row);
    sum.compute_at(out, row);
  } else {
    mx.compute_root();
    sum.compute_root();
  }
  return KernelPipeline{Halide::Pipeline(out), {in}};
}

KernelPipeline build_matmul(const MatmulKernel& spec, const Halide::Target& target) {
  const int R = spec.out_rank;
  KILN_ASSERT(R >= 2 && spec.a_rank >= 2 && spec.b_rank >= 2 && spec.a_rank <= R &&
                  (spec.transpose_b ? spec.b_rank == 2 : spec.b_rank <= R),
              "matmul ranks");
  KILN_ASSERT(static_cast<int>(spec.a_broadcast.size()) == spec.a_rank - 2 &&
                  static_cast<int>(spec.b_broadcast.size()) == spec.b_rank - 2,
              "matmul broadcast flags");
  ImageParam a(Halide::Float(32), spec.a_rank, "a"), b(Halide::Float(32), spec.b_rank, "b");
  ImageParam bias(Halide::Float(32), 1, "bias");
  std::vector<Var> vars = make_vars(R);  // (n, m, batch...)
  RDom k(0, a.dim(0).extent(), "k");
  // Batch dims: Halide dim 2 + j of the output is batch dim j of a (and b) counted from
  // the innermost; flags are in IR order.
  auto batch = [&](int rank, const std::vector<bool>& flags) {
    std::vector<Expr> idx;
    const int nb = rank - 2;
    for (int j = 0; j < nb; ++j)
      idx.push_back(flags[static_cast<size_t>(nb - 1 - j)] ? Expr(0) : Expr(vars[2 + j]));
    return idx;
  };
  std::vector<Expr> ai = {k, vars[1]};
  for (const Expr& e : batch(spec.a_rank, spec.a_broadcast)) ai.push_back(e);
  std::vector<Expr> bi;
  if (spec.transpose_b) {
    bi = {k, vars[0]};
  } else {
    bi = {vars[0], k};
    for (const Expr& e : batch(spec.b_rank, spec.b_broadcast)) bi.push_back(e);
  }
  Func acc("matmul_acc"), out("matmul");
  acc(vars) = 0.0f;
  acc(vars) += a(ai) * b(bi);
  Expr y = acc(vars);
  if (spec.has_bias) y = y + bias(vars[0]);
  if (spec.act != "none") y = float_function(spec.act, y);
  out(vars) = y;
  const int lanes = vector_lanes(target);
  bool has_row = false;
  const Var row = schedule_rows(out, vars, /*vector_dim0=*/true, lanes, has_row);
  acc.compute_at(out, row);
  acc.vectorize(vars[0], lanes, TailStrategy::GuardWithIf);
  acc.update().reorder(vars[0], k.x).vectorize(vars[0], lanes, TailStrategy::GuardWithIf);
  std::vector<Halide::Argument> args = {a, b};
  if (spec.has_bias) args.push_back(bias);
  return KernelPipeline{Halide::Pipeline(out), args};
}

}  // namespace kiln::codegen
