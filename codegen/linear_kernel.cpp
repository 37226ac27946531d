// The `linear` kernel: out(n, m) = act(Σ_k x(k, m) · wt(n, k) + bias(n)) as a Halide
// pipeline with a register-blocked GEMM schedule per x86 vector width. The schedule's
// shape follows /work/shared/HALIDE-NOTES.md: parallel outer tiles clamped to the matrix,
// a contiguous K × block strip of wt copied per block column, register blocks of
// `vectors` vectors × `rows` rows kept in registers over the whole (unrolled) reduction,
// and the bias + ReLU epilogue fused into the store.
#include <algorithm>

#include "codegen/halide_kernels.h"
#include "support/error.h"

namespace kiln::codegen {
namespace {

using Halide::Expr;
using Halide::Func;
using Halide::RDom;
using Halide::TailStrategy;
using Halide::Var;

// Schedule parameters of one target family; adapted to the spec's N and K by
// `fit_to_shape`.
struct GemmParams {
  int lanes = 16;     // f32 lanes per vector
  int vectors = 4;    // vectors per register block along n
  int rows = 6;       // rows (m) per register block: vectors · rows accumulators
  int tile_n = 64;    // outer tile along n (a multiple of lanes · vectors)
  int tile_m = 1024;  // largest outer tile along m
  int k_unroll = 4;   // reduction unroll factor
};

// AVX-512 has 32 vector registers: 4 × 6 = 24 accumulators, 4 loads of wt and a
// broadcast of x per k. AVX2 and SSE have 16: 2 × 6 = 12 accumulators.
// Tiles: the strided copy of a wt strip is the main overhead, so a strip serves up to
// 1024 rows; measured on the model's shapes (M = 2048, 1 and 2 threads), 64 × 1024 tiles
// ran 3–8% faster than 128 × 256 ones, and 64 × 2048 or 128 × 512 no faster.
GemmParams params_for(const Halide::Target& target) {
  GemmParams p;
  p.lanes = vector_lanes(target);
  if (p.lanes < 16) p.vectors = 2;
  return p;
}

// Shrinks the vector width and block to what N allows (every split of n shifts inwards,
// so a block must fit in N) and picks a reduction unroll that divides K.
GemmParams fit_to_shape(GemmParams p, int64_t K, int64_t N) {
  while (p.lanes > 1 && p.lanes > N) p.lanes /= 2;
  p.vectors = static_cast<int>(std::clamp<int64_t>(N / p.lanes, 1, p.vectors));
  const int block = p.lanes * p.vectors;
  p.tile_n = static_cast<int>(
      std::min<int64_t>(std::max(block, p.tile_n / block * block), N / block * block));
  while (p.k_unroll > 1 && K % p.k_unroll != 0) p.k_unroll /= 2;
  return p;
}

}  // namespace

KernelPipeline build_linear(const LinearKernel& spec, const Halide::Target& target) {
  KILN_ASSERT(spec.K >= 1 && spec.N >= 1, "linear kernel needs K >= 1 and N >= 1");
  KILN_ASSERT(spec.K <= (int64_t{1} << 30) && spec.N <= (int64_t{1} << 30),
              "linear kernel dims must fit in int32");
  const int K = static_cast<int>(spec.K), N = static_cast<int>(spec.N);
  const GemmParams p = fit_to_shape(params_for(target), K, N);
  const int block_n = p.lanes * p.vectors;

  Halide::ImageParam x(Halide::Float(32), 2, "x");
  Halide::ImageParam wt(Halide::Float(32), 2, "wt");
  Halide::ImageParam bias(Halide::Float(32), 1, "bias");
  Var n("n"), m("m"), k("k");
  RDom r(0, K, "r");

  // The K × block_n strip of wt that a column of register blocks reads, contiguous.
  Func wt_strip("wt_strip");
  wt_strip(n, k) = wt(n, k);
  // One register block's accumulators.
  Func acc("acc");
  acc(n, m) = 0.0f;
  acc(n, m) += x(r, m) * wt_strip(n, r);
  // As the interpreter rounds: the dot product, then + bias, then ReLU.
  Expr y = acc(n, m);
  if (spec.has_bias) y += bias(n);
  if (spec.relu) y = Halide::max(y, 0.0f);
  Func out("out");
  out(n, m) = y;

  // Shapes: K and N are constants, M is the only run-time extent. Every buffer starts at
  // 0; wt and out are dense, x may have any row stride.
  x.dim(0).set_bounds(0, K);
  x.dim(1).set_min(0);
  wt.dim(0).set_bounds(0, N);
  wt.dim(1).set_bounds(0, K).set_stride(N);
  bias.dim(0).set_bounds(0, N);
  Halide::OutputImageParam ob = out.output_buffer();
  ob.dim(0).set_bounds(0, N);
  ob.dim(1).set_min(0).set_stride(N);
  const Expr M = ob.dim(1).extent();
  x.set_estimates({{0, K}, {0, 2048}});
  wt.set_estimates({{0, N}, {0, K}});
  bias.set_estimates({{0, N}});
  out.set_estimates({{0, N}, {0, 2048}});

  // Loops of out, outermost first: t (fused tiles, parallel) > nb (block column of the
  // tile) > mb (register block row) > mr (rows, unrolled) > nv (vectors, unrolled).
  // Every split shifts inwards, so no block reads or writes outside the matrix as long as
  // the tile and block sizes do not exceed the extents: tile_n and block_n fit in N by
  // construction, the m tile is at most M, and the register block is `rows` ≤ the m tile.
  Var nt("nt"), mt("mt"), ni("ni"), mi("mi"), nb("nb"), nv("nv"), mb("mb"), mr("mr"), t("t");
  auto schedule_out = [&](Halide::Stage s, const Expr& tile_m, int rows) {
    s.split(n, nt, ni, p.tile_n, TailStrategy::ShiftInwards)
        .split(m, mt, mi, tile_m, TailStrategy::ShiftInwards)
        .split(ni, nb, nv, block_n, TailStrategy::ShiftInwards)
        .split(mi, mb, mr, rows, TailStrategy::ShiftInwards)
        .reorder(nv, mr, mb, nb, nt, mt)
        .fuse(nt, mt, t)
        .parallel(t)
        .vectorize(nv, p.lanes)
        .unroll(nv)
        .unroll(mr);
  };
  // Fewer rows than a register block (e.g. one token): one row at a time.
  Halide::Stage small_m = out.specialize(M < p.rows);
  schedule_out(small_m, M, 1);
  // Otherwise tiles of at most tile_m rows, balanced so the last one is not mostly overlap.
  const Expr tiles_m = (M + p.tile_m - 1) / p.tile_m;
  schedule_out(out, (M + tiles_m - 1) / tiles_m, p.rows);

  wt_strip.compute_at(out, nb).vectorize(n, p.lanes).unroll(n);
  acc.compute_at(out, mb).vectorize(n, p.lanes).unroll(n).unroll(m);
  Halide::RVar ko("ko"), ki("ki");
  acc.update()
      .split(r, ko, ki, p.k_unroll)
      .reorder(n, m, ki, ko)
      .vectorize(n, p.lanes)
      .unroll(n)
      .unroll(m)
      .unroll(ki);

  std::vector<Halide::Argument> args = {x, wt};
  if (spec.has_bias) args.push_back(bias);
  return KernelPipeline{Halide::Pipeline(out), args};
}

}  // namespace kiln::codegen
