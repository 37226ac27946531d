// The general path's kernels (kernels.h): reductions and argmax over any set of axes,
// softmax over any axis, and a batched matmul with broadcasting, for ops that no fused
// kernel computes. Correct for every extent and layout the IR allows; scheduled plainly.
//
// Indexing: IR dim i of a rank-n tensor is Halide dim n-1-i (dim 0 innermost).
//
// Schedules: the output's dims other than the innermost are fused and run in parallel;
// each reduction is computed per such row of the output (compute_at), so the region it
// computes is exactly the row the output needs (no reads past an input's extent), with
// the innermost dim in vectors (guarded tails) where it is not reduced. For a target with
// a GPU feature, the GPU schedules below (before build_reduce_gpu).
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

// ---- GPU schedules (the target has a GPU feature) ----
//
// Reductions and softmax: each block computes the reduction of one output row (the
// innermost dim reduced: kRowThreads threads over the reduced elements), or of
// kColumns neighbouring positions of the kept innermost dim (kColumnThreads threads over
// the reduced elements per position, so that neighbouring threads read neighbouring
// values). Thread u of a row adds, in order, the reduced elements u, u + T, u + 2T, ... of
// the flattened reduced dims (the innermost fastest) into its partial in shared memory;
// then one thread per row combines the T partials in order. Every index is clamped into
// the input and a partial skips the elements past the reduced extent, so any runtime
// extent works (rows of a block past the output are computed from clamped reads and never
// stored). The numerics are the CPU kernels' except that f32 sums (reduce_sum, reduce_mean,
// softmax's denominator) and softmax's exponentials are in f32, not double (an OpenCL device
// need not have doubles, and they are slow on most GPUs): each thread's partial sum, then the
// T partials in order. i64 sums wrap; NaN propagates through max; argmax finds the first
// maximum, a NaN counting as the maximum.
//
// Matmul: the linear kernel's GPU schedule (linear_kernel.cpp) over the batch dims: blocks of
// 64 (n) x 16 (m) outputs of one batch entry, 16 x 4 threads each with a 4 x 4 register
// block over the whole reduction, in the CPU kernel's order (k ascending, in f32).
//
// Per block: at most 1024 threads (256 here) and the shared memory of the partials and
// their combinations (gpu_shared_bytes, an upper bound: Halide may share one allocation
// between stages).

constexpr int kRowThreads = 256;
constexpr int kColumns = 32;
constexpr int kColumnThreads = 8;

// Bytes of a Halide scalar type.
int bytes_of(const Halide::Type& t) { return t.bits() / 8; }

// `x` clamped into dim `d` of `in`.
Expr clamp_into(const ImageParam& in, int d, const Expr& x) {
  return Halide::clamp(x, 0, Halide::max(in.dim(d).max(), 0));
}

// max(cur, x) with NaN propagating (the CPU kernels' max).
Expr max_keeping_nan(const Expr& cur, const Expr& x) {
  if (!x.type().is_float()) return Halide::max(cur, x);
  return Halide::select(nan_of(cur), cur, nan_of(x), x, Halide::max(cur, x));
}

// Whether value xv at index xi comes before (bv, bi) in argmax order: a NaN first, then the
// larger value, ties to the smaller index; bi == `none` marks no element yet.
Expr argmax_beats(const Expr& xv, const Expr& xi, const Expr& bv, const Expr& bi,
                  const Expr& none) {
  const Expr earlier = xi < bi;
  if (!xv.type().is_float()) return bi == none || xv > bv || (xv == bv && earlier);
  return bi == none || Halide::select(nan_of(bv), nan_of(xv) && earlier,
                                      nan_of(xv) || xv > bv || (xv == bv && earlier));
}

// The block loop of `out` for the row layout: dim 0 fused with the others (a rank-1 output:
// dim 0 itself). `out` has no thread loop of its own: one value per block.
Var fuse_all(Func& out, const std::vector<Var>& vars) {
  Var all = vars[0];
  for (size_t i = 1; i < vars.size(); ++i) {
    Var fused(fmt::format("all{}", i));
    out.fuse(all, vars[i], fused);
    all = fused;
  }
  return all;
}

// Fuses `outer` (the outer part of dim 0) with every var of `vars` except dim 0 and
// `skip` into the block var of the column layout.
Var fuse_blocks(Func& out, const Var& outer, const std::vector<Var>& vars, int skip) {
  Var block = outer;
  for (size_t i = 1; i < vars.size(); ++i) {
    if (static_cast<int>(i) == skip) continue;
    Var fused(fmt::format("blocks{}", i));
    out.fuse(block, vars[i], fused);
    block = fused;
  }
  return block;
}

// Schedules a per-thread partial (dims u, then the row's dims) and its combination `total`
// (the row's dims) at `block` of `out`, both in shared memory.
void schedule_partials(Func& partial, Func& total, const Func& out, const Var& block, const Var& u,
                       const Var& dim0, bool columns) {
  partial.compute_at(out, block).store_in(Halide::MemoryType::GPUShared);
  total.compute_at(out, block).store_in(Halide::MemoryType::GPUShared);
  if (columns) {
    // A block's share has a constant size (its last block computes past the output's end
    // from clamped reads).
    partial.bound_storage(dim0, kColumns);
    total.bound_storage(dim0, kColumns);
    partial.reorder(dim0, u).gpu_threads(dim0, u);
    partial.update().reorder(dim0, u).gpu_threads(dim0, u);
    total.gpu_threads(dim0);
    total.update().gpu_threads(dim0);
  } else {
    partial.gpu_threads(u);
    partial.update().gpu_threads(u);
  }
}

KernelPipeline build_reduce_gpu(const ReduceKernel& spec) {
  const int rank = static_cast<int>(spec.reduced.size());
  const Halide::Type type = spec.i64 ? Halide::Int(64) : Halide::Float(32);
  ImageParam in(type, rank, "input");
  std::vector<Var> vars = make_vars(rank);
  auto reduced = [&](int h) { return spec.reduced[static_cast<size_t>(rank - 1 - h)]; };
  std::vector<int> reduced_dims;
  for (int h = 0; h < rank; ++h)
    if (reduced(h)) reduced_dims.push_back(h);
  if (spec.op == ReduceKernel::Op::argmax)
    KILN_ASSERT(reduced_dims.size() == 1, "reduce: argmax over one dim");

  Func out("reduce");
  KernelPipeline kp{Halide::Pipeline(), {in}};
  if (reduced_dims.empty()) {
    // Over no axes: a copy, a thread per element.
    out(vars) = in(as_exprs(vars));
    kp.pipeline = Halide::Pipeline(out);
    if (rank == 0) {
      out.gpu_single_thread();
      kp.gpu_threads = 1;
    } else {
      Var block("block"), thread("thread");
      out.gpu_tile(fuse_all(out, vars), block, thread, kRowThreads, TailStrategy::GuardWithIf);
      kp.gpu_threads = kRowThreads;
    }
    return kp;
  }

  const bool columns = !reduced(0);
  const int T = columns ? kColumnThreads : kRowThreads;
  const int C = columns ? kColumns : 1;
  // The flattened reduced dims: j in [0, count), the innermost reduced dim fastest.
  Expr count = 1;
  for (int h : reduced_dims) count = count * in.dim(h).extent();
  Var u("u");
  RDom k(0, (count + (T - 1)) / T, "k");
  const Expr j = k * T + u;
  const Expr valid = j < count;
  std::vector<Expr> idx(static_cast<size_t>(rank));
  Expr rest = Halide::clamp(j, 0, Halide::max(count - 1, 0));
  for (size_t i = 0; i < reduced_dims.size(); ++i) {
    const int h = reduced_dims[i];
    if (i + 1 == reduced_dims.size()) {
      idx[h] = clamp_into(in, h, rest);
    } else {
      const Expr e = Halide::max(in.dim(h).extent(), 1);
      idx[h] = rest % e;
      rest = rest / e;
    }
  }
  for (int h = 0; h < rank; ++h)
    if (!reduced(h)) idx[h] = clamp_into(in, h, vars[h]);
  const Expr x = in(idx);

  std::vector<Var> pv = {u};
  pv.insert(pv.end(), vars.begin(), vars.end());
  RDom t(0, T, "t");
  std::vector<Expr> at_t = {t};
  for (const Var& v : vars) at_t.push_back(v);
  Func partial("reduce_partial"), acc("reduce_acc");
  int partial_bytes = 0;
  switch (spec.op) {
    case ReduceKernel::Op::sum:
    case ReduceKernel::Op::mean: {
      const Expr zero = Halide::Internal::make_zero(type);
      partial(pv) = zero;
      partial(pv) += Halide::select(valid, x, zero);
      acc(vars) = zero;
      acc(vars) += partial(at_t);
      Expr total = acc(vars);
      if (spec.op == ReduceKernel::Op::mean) total = total / Halide::cast(Halide::Float(32), count);
      out(vars) = total;
      partial_bytes = bytes_of(type);
      break;
    }
    case ReduceKernel::Op::max: {
      const Expr lowest = spec.i64 ? Expr(std::numeric_limits<int64_t>::min())
                                   : Expr(-std::numeric_limits<float>::infinity());
      partial(pv) = lowest;
      const Expr cur = partial(pv);
      partial(pv) = Halide::select(valid, max_keeping_nan(cur, x), cur);
      acc(vars) = lowest;
      acc(vars) = max_keeping_nan(acc(vars), partial(at_t));
      out(vars) = acc(vars);
      partial_bytes = bytes_of(type);
      break;
    }
    case ReduceKernel::Op::argmax: {
      const Expr none = Expr(std::numeric_limits<int64_t>::max());
      const Expr lowest = spec.i64 ? Expr(std::numeric_limits<int64_t>::min())
                                   : Expr(-std::numeric_limits<float>::infinity());
      partial(pv) = Halide::Tuple(none, lowest);
      const Expr xi = Halide::cast(Halide::Int(64), j);
      const Expr take = valid && argmax_beats(x, xi, partial(pv)[1], partial(pv)[0], none);
      partial(pv) = Halide::Tuple(Halide::select(take, xi, partial(pv)[0]),
                                  Halide::select(take, x, partial(pv)[1]));
      acc(vars) = Halide::Tuple(none, lowest);
      const Expr ci = partial(at_t)[0], cv = partial(at_t)[1];
      const Expr better = argmax_beats(cv, ci, acc(vars)[1], acc(vars)[0], none);
      acc(vars) = Halide::Tuple(Halide::select(better, ci, acc(vars)[0]),
                                Halide::select(better, cv, acc(vars)[1]));
      out(vars) = acc(vars)[0];
      partial_bytes = 8 + bytes_of(type);
      break;
    }
  }
  kp.pipeline = Halide::Pipeline(out);
  // The output's reduced dims have extent 1 (known, so that a block's share of each
  // reduction has a constant size).
  for (int h : reduced_dims) out.output_buffer().dim(h).set_bounds(0, 1);

  Var block;
  if (columns) {
    Var co("co"), ci("ci");
    out.split(vars[0], co, ci, C, TailStrategy::GuardWithIf);
    block = fuse_blocks(out, co, vars, /*skip=*/-1);
    out.gpu_blocks(block).gpu_threads(ci);
  } else {
    block = fuse_all(out, vars);
    out.gpu_blocks(block);
  }
  schedule_partials(partial, acc, out, block, u, vars[0], columns);
  kp.gpu_threads = T * C;
  kp.gpu_shared_bytes = static_cast<int64_t>(T + 1) * C * partial_bytes;
  return kp;
}

KernelPipeline build_softmax_gpu(const SoftmaxKernel& spec) {
  const int rank = spec.rank;
  ImageParam in(Halide::Float(32), rank, "input");
  std::vector<Var> vars = make_vars(rank);
  const int h = rank - 1 - spec.axis;  // the Halide dim normalized over
  std::vector<Var> others;
  for (int d = 0; d < rank; ++d)
    if (d != h) others.push_back(vars[d]);
  const bool columns = h != 0;
  const int T = columns ? kColumnThreads : kRowThreads;
  const int C = columns ? kColumns : 1;

  const Expr E = in.dim(h).extent();
  Var u("u");
  RDom k(0, (E + (T - 1)) / T, "k");
  const Expr j = k * T + u;
  const Expr valid = j < E;
  std::vector<Expr> idx(static_cast<size_t>(rank));
  for (int d = 0; d < rank; ++d) idx[d] = clamp_into(in, d, d == h ? j : Expr(vars[d]));
  const Expr x = in(idx);
  std::vector<Var> pv = {u};
  pv.insert(pv.end(), others.begin(), others.end());
  RDom t(0, T, "t");
  std::vector<Expr> at_t = {t};
  for (const Var& v : others) at_t.push_back(v);

  Func pmax("softmax_partial_max"), mx("softmax_max");
  pmax(pv) = -std::numeric_limits<float>::infinity();
  pmax(pv) = Halide::select(valid, max_keeping_nan(pmax(pv), x), pmax(pv));
  mx(others) = -std::numeric_limits<float>::infinity();
  mx(others) = max_keeping_nan(mx(others), pmax(at_t));
  const Expr m = mx(others);
  Func psum("softmax_partial_sum"), sum("softmax_sum");
  psum(pv) = 0.0f;
  psum(pv) += Halide::select(valid, Halide::exp(x - m), 0.0f);
  sum(others) = 0.0f;
  sum(others) += psum(at_t);
  Func out("softmax");
  out(vars) = Halide::exp(in(as_exprs(vars)) - m) / sum(others);

  Var block("block");
  if (columns) {
    // Blocks over kColumns positions of dim 0 and the other dims; threads over the
    // positions and the axis, which each thread writes T values apart.
    Var co("co"), ci("ci"), ao("ao"), ai("ai");
    out.split(vars[0], co, ci, C, TailStrategy::GuardWithIf)
        .split(vars[h], ao, ai, T, TailStrategy::GuardWithIf);
    block = fuse_blocks(out, co, vars, /*skip=*/h);
    out.reorder(ci, ai, ao, block).gpu_blocks(block).gpu_threads(ci, ai);
  } else {
    // A block per row, its threads across the row.
    Var row = vars[0], c("c"), co("co"), ci("ci");
    if (rank == 1) {
      // One row: a block of it (split by its own extent) to compute the statistics at.
      out.split(vars[0], block, c, out.output_buffer().dim(0).extent(), TailStrategy::GuardWithIf);
      row = c;
    } else {
      block = fuse_blocks(out, vars[1], vars, /*skip=*/1);
    }
    out.split(row, co, ci, T, TailStrategy::GuardWithIf)
        .reorder(ci, co, block)
        .gpu_blocks(block)
        .gpu_threads(ci);
  }
  const Var dim0 = columns ? vars[0] : u;  // unused in the row layout
  schedule_partials(pmax, mx, out, block, u, dim0, columns);
  schedule_partials(psum, sum, out, block, u, dim0, columns);
  KernelPipeline kp{Halide::Pipeline(out), {in}};
  kp.gpu_threads = T * C;
  kp.gpu_shared_bytes = static_cast<int64_t>(T + 1) * C * (4 + 4);
  return kp;
}

KernelPipeline build_matmul_gpu(const MatmulKernel& spec) {
  const int R = spec.out_rank;
  ImageParam a(Halide::Float(32), spec.a_rank, "a"), b(Halide::Float(32), spec.b_rank, "b");
  ImageParam bias(Halide::Float(32), 1, "bias");
  std::vector<Var> vars = make_vars(R);  // (n, m, batch...)
  const Var n = vars[0], m = vars[1];
  RDom k(0, a.dim(0).extent(), "k");
  auto batch = [&](int rank, const std::vector<bool>& flags) {
    std::vector<Expr> idx;
    const int nb = rank - 2;
    for (int j = 0; j < nb; ++j)
      idx.push_back(flags[static_cast<size_t>(nb - 1 - j)] ? Expr(0) : Expr(vars[2 + j]));
    return idx;
  };
  // Rows past M and columns past N of a block read the last row of a and column of b.
  std::vector<Expr> ai = {k, clamp_into(a, 1, m)};
  for (const Expr& e : batch(spec.a_rank, spec.a_broadcast)) ai.push_back(e);
  std::vector<Expr> bi;
  ImageParam ids(Halide::Int(64), 1, "ids");
  // gather_b: column n is row ids(n) of b (clamped into b like every read here).
  const Expr row_n =
      spec.gather_b ? clamp_into(b, 1, Halide::cast<int>(ids(clamp_into(ids, 0, n)))) : Expr(n);
  if (spec.transpose_b) {
    bi = {k, spec.gather_b ? row_n : clamp_into(b, 1, n)};
  } else {
    bi = {clamp_into(b, 0, n), k};
    for (const Expr& e : batch(spec.b_rank, spec.b_broadcast)) bi.push_back(e);
  }
  Func acc("matmul_acc"), out("matmul");
  acc(vars) = 0.0f;
  acc(vars) += a(ai) * b(bi);
  Expr y = acc(vars);
  if (spec.has_bias) y = y + bias(row_n);
  if (spec.act != "none") y = float_function(spec.act, y);
  out(vars) = y;

  // Blocks: x over the m tiles fused with the batch dims (up to 2^31 - 1 blocks), y over
  // the n tiles (up to 65535, CUDA's limit of a block grid's y).
  Var ni("ni"), mi("mi"), nr("nr"), mr("mr");
  out.tile(n, m, ni, mi, 64, 16, TailStrategy::GuardWithIf)
      .tile(ni, mi, nr, mr, 4, 4, TailStrategy::GuardWithIf);
  Var rows = m;
  for (int i = 2; i < R; ++i) {
    Var fused(fmt::format("batch{}", i));
    out.fuse(rows, vars[i], fused);
    rows = fused;
  }
  out.reorder(nr, mr, ni, mi, rows, n)
      .gpu_blocks(rows, n)
      .gpu_threads(ni, mi)
      .unroll(nr)
      .unroll(mr);
  // The 4 x 4 register block has a constant size also where the last block's guard
  // shortens its loops (else Halide keeps it in a global buffer sized at run time).
  acc.compute_at(out, ni).bound_storage(n, 4).bound_storage(m, 4).unroll(n).unroll(m);
  for (int i = 2; i < R; ++i) acc.bound_storage(vars[i], 1);
  acc.update().reorder(n, m, k).unroll(n).unroll(m);
  std::vector<Halide::Argument> args = {a, b};
  if (spec.gather_b) args.push_back(ids);
  if (spec.has_bias) args.push_back(bias);
  KernelPipeline kp{Halide::Pipeline(out), args};
  kp.gpu_threads = 16 * 4;
  return kp;
}

}  // namespace

KernelPipeline build_topk(const TopkKernel& spec, const Halide::Target& target) {
  KILN_ASSERT(spec.k >= 1, "topk: k >= 1");
  const Halide::Type type = spec.i64 ? Halide::Int(64) : Halide::Float(32);
  ImageParam in(type, 2, "input");  // (n, rows)
  Var j("j"), row("row");
  // best(t, row): the t-th pick, (index, value); the picks in order t = 0, 1, ..., each the
  // element ranked first among those ranked below pick t - 1 (ties to the lower index, a
  // NaN above every number). Index -1: none seen yet.
  RDom r(0, in.dim(0).extent(), 0, static_cast<int>(spec.k), "r");
  const Expr x = in(r.x, row), xi = Halide::cast(Halide::Int(64), r.x);
  const Expr none = Expr(int64_t{-1});
  const Expr lowest = spec.i64 ? Expr(std::numeric_limits<int64_t>::min())
                               : Expr(-std::numeric_limits<float>::infinity());
  // Whether (a, ai) ranks before (b, bi).
  auto before = [&](const Expr& a, const Expr& ai, const Expr& b, const Expr& bi) {
    const Expr earlier = ai < bi;
    const Expr by_value = a > b || (a == b && earlier);
    if (spec.i64) return by_value;
    return Halide::select(nan_of(a), !nan_of(b) || earlier, nan_of(b), Expr(false), by_value);
  };
  Func best("topk_best");
  best(j, row) = Halide::Tuple(none, lowest);
  const Expr prev_i = best(Halide::max(r.y - 1, 0), row)[0];
  const Expr prev_v = best(Halide::max(r.y - 1, 0), row)[1];
  const Expr cur_i = best(r.y, row)[0], cur_v = best(r.y, row)[1];
  const Expr eligible = r.y == 0 || before(prev_v, prev_i, x, xi);
  const Expr take = eligible && (cur_i == none || before(x, xi, cur_v, cur_i));
  best(r.y, row) = Halide::Tuple(Halide::select(take, xi, cur_i), Halide::select(take, x, cur_v));
  Func out("topk");
  out(j, row) = best(j, row)[0];
  out.output_buffer().dim(0).set_bounds(0, static_cast<int>(spec.k));
  KernelPipeline kp{Halide::Pipeline(out), {in}};
  if (target.has_gpu_feature()) {
    // A thread per row (blocks of 64 rows), its k picks in its own memory.
    Var block("block"), thread("thread");
    out.reorder(j, row).gpu_tile(row, block, thread, 64, TailStrategy::GuardWithIf);
    best.compute_at(out, thread);
    kp.gpu_threads = 64;
    return kp;
  }
  out.parallel(row);
  best.compute_at(out, row);
  return kp;
}

KernelPipeline build_scatter_add(const ScatterAddKernel& spec, const Halide::Target& target) {
  const int rank = spec.rank;
  KILN_ASSERT(rank >= 1 && spec.axis >= 0 && spec.axis < rank, "scatter_add axis");
  const Halide::Type type = spec.i64 ? Halide::Int(64) : Halide::Float(32);
  ImageParam base(type, rank, "base"), ids(Halide::Int(64), rank, "ids"), src(type, rank, "src");
  std::vector<Var> vars = make_vars(rank);
  const int h = rank - 1 - spec.axis;  // the Halide dim scattered along
  Func out("scatter_add");
  out(vars) = base(as_exprs(vars));
  RDom r(0, src.dim(h).extent(), "r");
  std::vector<Expr> at = as_exprs(vars);
  at[h] = r;
  const Expr id =
      Halide::clamp(ids(at), Expr(int64_t{0}), Halide::cast(Halide::Int(64), base.dim(h).max()));
  std::vector<Expr> to = as_exprs(vars);
  to[h] = Halide::cast(Halide::Int(32), id);
  out(to) += src(at);
  KernelPipeline kp{Halide::Pipeline(out), {base, ids, src}};
  if (target.has_gpu_feature()) {
    // The copy: a thread per element (blocks of 256). The update: a thread per position of
    // the other dims (fused, blocks of 256), adding its contributions in order of the axis;
    // one thread when there are no other dims.
    Var block("block"), thread("thread");
    out.gpu_tile(fuse_all(out, vars), block, thread, 256, TailStrategy::GuardWithIf);
    std::vector<Var> others;
    for (int d = 0; d < rank; ++d)
      if (d != h) others.push_back(vars[d]);
    if (others.empty()) {
      out.update().gpu_single_thread();
    } else {
      Var all = others[0];
      for (size_t i = 1; i < others.size(); ++i) {
        Var fused(fmt::format("others{}", i));
        out.update().fuse(all, others[i], fused);
        all = fused;
      }
      Var ublock("ublock"), uthread("uthread");
      out.update().gpu_tile(all, ublock, uthread, 256, TailStrategy::GuardWithIf);
    }
    kp.gpu_threads = 256;
    return kp;
  }
  // The copy: dim 0 in vectors, the rest in parallel. The update: each position of the
  // other dims adds its contributions in order of the axis; the outermost such dim in
  // parallel, dim 0 in vectors where it is not the axis.
  const int lanes = vector_lanes(target);
  bool has_row = false;
  schedule_rows(out, vars, /*vector_dim0=*/true, lanes, has_row);
  int outer = -1;
  for (int d = rank - 1; d >= 0 && outer < 0; --d)
    if (d != h) outer = d;
  if (outer > 0) out.update().parallel(vars[outer]);
  if (h != 0) out.update().vectorize(vars[0], lanes, TailStrategy::GuardWithIf);
  return kp;
}

KernelPipeline build_reduce(const ReduceKernel& spec, const Halide::Target& target) {
  KILN_ASSERT(!(spec.op == ReduceKernel::Op::mean && spec.i64), "reduce: mean of i64");
  if (target.has_gpu_feature()) return build_reduce_gpu(spec);
  const int rank = static_cast<int>(spec.reduced.size());
  const Halide::Type type = spec.i64 ? Halide::Int(64) : Halide::Float(32);
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
  if (target.has_gpu_feature()) return build_softmax_gpu(spec);
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
  if (target.has_gpu_feature()) return build_matmul_gpu(spec);
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
  ImageParam ids(Halide::Int(64), 1, "ids");
  // gather_b: column n is row ids(n) of b (the runtime checked the ids; the clamp keeps the
  // reads inside b whatever they hold).
  const Expr row_n =
      spec.gather_b ? Halide::clamp(Halide::cast<int>(ids(vars[0])), 0, b.dim(1).max()) : vars[0];
  if (spec.transpose_b) {
    bi = {k, row_n};
  } else {
    bi = {vars[0], k};
    for (const Expr& e : batch(spec.b_rank, spec.b_broadcast)) bi.push_back(e);
  }
  Func acc("matmul_acc"), out("matmul");
  acc(vars) = 0.0f;
  acc(vars) += a(ai) * b(bi);
  Expr y = acc(vars);
  if (spec.has_bias) y = y + bias(row_n);
  if (spec.act != "none") y = float_function(spec.act, y);
  out(vars) = y;
  const int lanes = vector_lanes(target);
  bool has_row = false;
  const Var row = schedule_rows(out, vars, /*vector_dim0=*/true, lanes, has_row);
  acc.compute_at(out, row);
  acc.vectorize(vars[0], lanes, TailStrategy::GuardWithIf);
  acc.update().reorder(vars[0], k.x).vectorize(vars[0], lanes, TailStrategy::GuardWithIf);
  std::vector<Halide::Argument> args = {a, b};
  if (spec.gather_b) args.push_back(ids);
  if (spec.has_bias) args.push_back(bias);
  return KernelPipeline{Halide::Pipeline(out), args};
}

}  // namespace kiln::codegen
