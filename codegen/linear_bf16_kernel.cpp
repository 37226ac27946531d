// The `linear` kernel with bf16 weights (kernels.h, LinearKernel::bf16): the weight packed
// once at load time in panels of 64 columns, each column's consecutive pairs of K adjacent
// (oneDNN's BA16a64b2a; N and K zero-padded to a multiple of 64 and to even), the input
// rounded to bf16 as it is read, and the products summed
// in f32 by AVX512-BF16's `vdpbf16ps` (32 bf16 products into 16 f32 lanes per instruction,
// twice the FMA rate of f32). The bias and activation epilogue stays in f32.
//
// The schedule is the f32 kernel's (linear_kernel.cpp): parallel tiles of one panel × up to
// 1024 rows, register blocks of 4 vectors × `rows` rows over the whole reduction; for long
// reductions smaller tiles in chunks of rows (below). The update's reduction over a pair of K
// is vectorized atomically, which Halide 14 matches to `vdpbf16ps` (it needs the
// avx512_sapphirerapids feature: compile_kernel builds these kernels for LLVM's cooperlake
// CPU, see kernels.cpp). The input's bf16 copy is made once per chunk of rows (for most
// shapes one chunk: the whole call), before the chunk's products (M × K roundings in all).
//
// The FMA form (LinearKernel::bf16_fma, `kiln compile --bf16-products fma`): the same packed
// bytes read as int32 pairs, each widened to two f32 (pair << 16, pair & 0xffff0000: a bf16 is
// an f32's high half), x rounded to bf16 and kept in f32, the products on vfmadd231ps, 16 per
// instruction. On Intel Sapphire/Emerald Rapids without AMX, vdpbf16ps issues once per 2
// cycles and FMAs twice per cycle: there this form does twice the products per cycle (the base
// model's W2 at 0.91× the f32 build's speed instead of 0.57×; the widening costs 1 instruction
// per 6 FMAs); on AMD Zen 4 vdpbf16ps issues as often as an FMA and does twice the products.
#include <string>
#include <vector>

#include "codegen/halide_kernels.h"
#include "support/error.h"

namespace kiln::codegen {

using Halide::Expr;
using Halide::Func;
using Halide::RDom;
using Halide::TailStrategy;
using Halide::Var;

Expr round_to_bf16_bits(const Expr& f) {
  // Round to nearest, ties to even, on the bits, as vcvtne2ps2bf16 does (and the runtime
  // rounds weights, rt::f32_to_bf16): zero and subnormals become a zero of their sign (an f32
  // subnormal just below 2^-126 would otherwise round up to the smallest normal, where the
  // instruction gives 0); NaN keeps a quiet NaN's top bits.
  Expr bits = Halide::reinterpret(Halide::UInt(32), f);
  Expr rounded = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
  Expr nan = (bits & 0x7fffffff) > 0x7f800000;
  Expr tiny = (bits & 0x7f800000) == 0;
  return Halide::cast(Halide::UInt(16), Halide::select(nan, (bits >> 16) | 0x40, tiny,
                                                       (bits >> 16) & 0x8000, rounded));
}

PackedLoops schedule_packed_linear(Func out, Func acc, const RDom& r, const Var& n, const Var& m,
                                   const Var& j, int N, int Np, int k_groups, bool long_k,
                                   bool group_atomic, bool rows_parallel, bool few_rows_parallel,
                                   int chunk) {
  constexpr int P = 64, lanes = 16;
  Halide::OutputImageParam ob = out.output_buffer();
  const Expr M = ob.dim(1).extent();
  // Loops of out: c (chunks of rows) > t (tiles: one panel × a tile of rows of the chunk) >
  // mb (register block rows) > mr > ni. The input's low-precision copy is made per chunk
  // (the caller computes it at c), just before the chunk's tiles read it (in L2/L3, not
  // written to memory and read back), in parallel. acc is computed per register block, its
  // reduction innermost over the group of K (vdpbf16ps: a pair, vpdpbusd: four), then the 4
  // vectors, then the rows.
  Var c("c"), mc("mc"), nt("nt"), ni("ni"), mt("mt"), mi("mi"), mb("mb"), mr("mr"), t("t");
  // N not a multiple of 64: the last panel's columns from N on are computed (on zero
  // weights) but not stored.
  const TailStrategy n_tail = N % P == 0 ? TailStrategy::RoundUp : TailStrategy::GuardWithIf;
  auto schedule_out = [&](Halide::Stage s, const Expr& chunk_m, const Expr& tile_m, int rows,
                          bool panels_fastest, int panels_per_tile = 1) {
    s.split(m, c, mc, chunk_m, TailStrategy::ShiftInwards)
        .split(n, nt, ni, P, n_tail)
        .split(mc, mt, mi, tile_m, TailStrategy::ShiftInwards)
        .split(mi, mb, mr, rows, TailStrategy::ShiftInwards);
    Var ntile = nt;
    if (panels_per_tile > 1) {  // a tile of several panels, one after the other
      Var np("np");
      s.split(nt, ntile, np, panels_per_tile).reorder(ni, mr, mb, np, ntile);
    }
    if (panels_fastest)
      s.reorder(ni, mr, mb, ntile, mt, c).fuse(ntile, mt, t);
    else
      s.reorder(ni, mr, mb, mt, ntile, c).fuse(mt, ntile, t);
    s.parallel(t).vectorize(ni, lanes).unroll(mr);
  };
  // Rows as the parallel tiles (c), each of `tile_m` rows running every panel.
  auto schedule_row_tiles = [&](Halide::Stage s, const Expr& tile_m, int block_rows) {
    s.split(m, c, mi, tile_m, TailStrategy::ShiftInwards)
        .split(n, nt, ni, P, n_tail)
        .split(mi, mb, mr, block_rows, TailStrategy::ShiftInwards)
        .reorder(ni, mr, mb, nt, c)
        .parallel(c)
        .vectorize(ni, lanes)
        .unroll(mr);
  };
  // Up to 64 rows: one chunk.
  constexpr int few_rows = 4, many_rows = 64, rows = 6;
  // With `chunk` (prefetch_chunk): one chunk of all the rows, each parallel task over `chunk`
  // consecutive panels (nto > nti), prefetching the next (prefetch_next_panels, which the
  // caller adds); no tiles of rows.
  auto schedule_chunks = [&](Halide::Stage s) {
    Var nto("nto"), nti("nti");
    s.split(m, c, mc, M, TailStrategy::ShiftInwards)
        .split(n, nt, ni, P, n_tail)
        .split(nt, nto, nti, chunk, TailStrategy::RoundUp)
        .split(mc, mb, mr, few_rows, TailStrategy::ShiftInwards)
        .reorder(ni, mr, mb, nti, nto, c)
        .parallel(nto)
        .vectorize(ni, lanes)
        .unroll(mr);
  };
  // One to 3 rows (a decoding step): reading the weights is the cost; a thread streams 4
  // consecutive panels per tile where N allows (W3's one-row GEMMs 8–10% faster than one
  // panel per tile, measured on the f32 kernel).
  schedule_out(out.specialize(M < few_rows), M, M, 1, false, one_row_panels_per_tile(Np / P));
  // With `few_rows_parallel` and fewer than 16 panels, 16 to 63 rows: two tiles of half the rows,
  // each converting its own and running every panel (kPanelsPerTileBytes).
  Expr small_tiles;
  if (few_rows_parallel && Np / P < 16) {
    small_tiles = M >= 16 && M < many_rows;
    schedule_row_tiles(out.specialize(small_tiles), (M + 1) / 2, few_rows);
  }
  // Fewer than 16 panels (without rows_parallel): two tiles of rows per panel, so that 2
  // threads share the work in pieces small enough to balance.
  if (Np / P < 16 && !small_tiles.defined())
    schedule_out(out.specialize(M >= 16 && M < many_rows), M, (M + 1) / 2, few_rows, false);
  if (chunk)
    schedule_chunks(out.specialize(M < many_rows));
  else
    schedule_out(out.specialize(M < many_rows), M, M, few_rows, false);
  // Long reductions (long_k: a panel of 128 KB and more): chunks of about 240 rows (x of a
  // chunk is 1.9 MB at K = 2048, its bf16 copy 0.9 MB), tiles of about 120 rows, whose
  // converted rows stay in L2 while a thread goes from panel to panel (the panels fastest).
  // Else one chunk, tiles of up to 1024 rows, the row tiles fastest: a panel is read once
  // per 1024 rows.
  // With `rows_parallel`, from 512 rows on: parallel over an even number of tiles of up to
  // 256 rows (c), each converting its own rows (they stay in its L2) and then running every
  // panel over them; no conversion loop of its own, one parallel loop instead of two or three
  // per chunk. int8 at K 2048 (Intel Emerald Rapids, 2 threads, paired A/B in one process):
  // M 512 1.11–1.13×, M 1024 1.15×, M 2048 1.07–1.14× the chunked schedule's speed; at K 512
  // within noise (1.01–1.06×), at 256 rows slower (0.98×), with an odd number of tiles 0.88×.
  // On AMD Zen 5 at K 512 it is the faster where the panels are small (kPanelsPerTileBytes):
  // the caller asks for it there too.
  Expr per_tile = rows_parallel ? M >= 512 : Expr();
  if (rows_parallel) {
    const Expr tiles = 2 * ((M + 511) / 512);
    schedule_row_tiles(out.specialize(per_tile), (M + tiles - 1) / tiles, rows);
  }
  auto schedule_rows = [&](Halide::Stage s, int block_rows) {
    if (long_k) {
      const Expr chunks = (M + 239) / 240, chunk_m = (M + chunks - 1) / chunks;
      schedule_out(s, chunk_m, (chunk_m + 1) / 2, block_rows, true);
    } else {
      const Expr tiles = (M + 1023) / 1024;
      schedule_out(s, M, (M + tiles - 1) / tiles, block_rows, false);
    }
  };
  // Up to 191 rows that 6-row blocks do not divide (a beam search's 128 hypotheses): 4-row
  // blocks, which compute no row twice (6-row blocks shifted inwards compute 132 rows for 128).
  // W5 (generate_bench, AMD Zen 5, 2 threads, 3 alternated runs, ms, this rule and the f32
  // kernel's against neither): f32 884, 913, 911 → 883, 897, 890; bf16 541, 547, 549 → 534,
  // 533, 536; int8 375, 380, 383 → 367, 372, 373.
  // With `chunk` and a short reduction, as above (the prefetch; a long one keeps its tiles).
  if (chunk && !long_k)
    schedule_chunks(out.specialize(M < kSmallBlockRows && M % rows != 0));
  else
    schedule_rows(out.specialize(M < kSmallBlockRows && M % rows != 0), few_rows);
  schedule_rows(out, rows);

  acc.compute_at(out, mb);
  schedule_packed_acc(acc, r, j, k_groups, group_atomic);
  if (small_tiles.defined()) per_tile = per_tile.defined() ? per_tile || small_tiles : small_tiles;
  return {c, per_tile};
}

void schedule_packed_acc(Func acc, const RDom& r, const Var& j, int k_groups, bool group_atomic) {
  constexpr int lanes = 16;
  const Var m = acc.args()[2];
  Var jv("jv"), ju("ju");
  Halide::RVar ko("ko"), ki("ki");
  int k_unroll = 4;  // groups of K per iteration, as the f32 kernel unrolls its reduction
  while (k_unroll > 1 && k_groups % k_unroll != 0) k_unroll /= 2;
  Var p = acc.args()[1];
  acc.vectorize(j, lanes).unroll(j).unroll(m);
  acc.update()
      .split(j, ju, jv, lanes)
      .split(r.y, ko, ki, k_unroll)
      .reorder(r.x, jv, ju, m, ki, ko, p);
  if (group_atomic)
    acc.update().atomic().vectorize(r.x);
  else  // bf16 on FMAs: one FMA per element of the group, each group's weights loaded once
    acc.update().reorder(jv, ju, m, r.x, ki, ko, p).unroll(r.x);
  acc.update().vectorize(jv).unroll(ju).unroll(m).unroll(ki);
}

Var schedule_packed_rows(Func out, Func acc, const RDom& r, const Var& n, const Var& m,
                         const Var& j, const Expr& M, int k_groups, bool group_atomic,
                         const std::vector<Func>& gathered) {
  constexpr int P = 64, lanes = 16;
  // Loops of out: c (one chunk of rows: x converted once, before the tiles) > t (tiles: a
  // block of 64 columns × a tile of rows, parallel) > mb (register block rows) > mr > ni; the
  // columns of the last block past R are guarded.
  Var c("c"), mc("mc"), nt("nt"), ni("ni"), mt("mt"), mi("mi"), mb("mb"), mr("mr"), t("t");
  auto schedule_out = [&](Halide::Stage s, const Expr& tile_m, int rows) {
    s.split(m, c, mc, M, TailStrategy::ShiftInwards)
        .split(n, nt, ni, P, TailStrategy::GuardWithIf)
        .split(mc, mt, mi, tile_m, TailStrategy::ShiftInwards)
        .split(mi, mb, mr, rows, TailStrategy::ShiftInwards)
        .reorder(ni, mr, mb, mt, nt, c)
        .fuse(mt, nt, t)
        .parallel(t)
        .vectorize(ni, lanes)
        .unroll(mr);
  };
  schedule_out(out.specialize(M < 4), M, 1);
  schedule_out(out.specialize(M < 64), M, 4);
  const Expr tiles = (M + 1023) / 1024;
  schedule_out(out, (M + tiles - 1) / tiles, 6);

  // One block of 64 columns of the gathered weight and of the accumulators (Halide's bounds of
  // n / 64 over a guarded block of n span two blocks), a whole one also for the last, guarded
  // block (their loops then have constant extents to unroll; the ids are clamped).
  const Var p = acc.args()[1];
  for (Func f : gathered) f.compute_at(out, t).bound_extent(j, P).bound_extent(p, 1);
  acc.compute_at(out, mb).bound_extent(j, P).bound_extent(p, 1);
  schedule_packed_acc(acc, r, j, k_groups, group_atomic);
  return c;
}

namespace {

// x as the bf16 products read it: rounded to bf16 (xb) for vdpbf16ps, or rounded and kept in
// f32 for the FMA form (xf); [0, Kp), the padding column 0 (so is the weight's).
// With x_bf16, x is bf16 already rounded: its bits widened (fma), itself (read in place: the
// caller leaves xb inlined where K is even), or 0 in the padding column.
Func bf16_input(const Halide::ImageParam& x, int K, bool fma, bool x_bf16, const Var& k,
                const Var& m) {
  constexpr int lanes = 16;
  Func xr(fma ? "xf" : "xb");
  if (x_bf16) {
    const Expr xk = x(Halide::min(k, K - 1), m);
    if (fma) {
      Expr bits = Halide::cast<uint32_t>(Halide::reinterpret(Halide::UInt(16), xk)) << 16;
      if (K % 2 != 0) bits = Halide::select(k < K, bits, Halide::cast<uint32_t>(0));
      xr(k, m) = Halide::reinterpret(Halide::Float(32), bits);
    } else if (K % 2 == 0) {
      xr(k, m) = x(k, m);
    } else {
      xr(k, m) = Halide::select(k < K, xk,
                                Halide::reinterpret(Halide::BFloat(16), Halide::cast<uint16_t>(0)));
    }
  } else if (fma) {
    Expr bits = Halide::cast<uint32_t>(round_to_bf16_bits(x(Halide::min(k, K - 1), m))) << 16;
    if (K % 2 != 0) bits = Halide::select(k < K, bits, Halide::cast<uint32_t>(0));
    xr(k, m) = Halide::reinterpret(Halide::Float(32), bits);
  } else if (K % 2 == 0 && K >= 2 * lanes) {
    // vcvtne2ps2bf16: 32 roundings per instruction (xb is vectorized by 32 and shifted
    // inwards within [0, K)), the same rounding as round_to_bf16_bits (subnormals to ±0).
    xr(k, m) = Halide::cast(Halide::BFloat(16), x(k, m));
  } else if (K % 2 == 0) {
    xr(k, m) = Halide::reinterpret(Halide::BFloat(16), round_to_bf16_bits(x(k, m)));
  } else {  // the padding column of the weight is 0; so is x's
    xr(k, m) = Halide::reinterpret(
        Halide::BFloat(16), Halide::select(k < K, round_to_bf16_bits(x(Halide::min(k, K - 1), m)),
                                           Halide::cast(Halide::UInt(16), 0)));
  }
  return xr;
}

// The products of both bf16 kernels, acc(j, p, m) (column p·64 + j) over r (pair member r.x,
// pair r.y), one definition so that linear_rows' sums are the full kernel's: `w` reads the
// weight in the packed layout, w(pair, j, kp, p) = W[p·64 + j, 2·kp + pair], or with `fma`
// w(j, kp, p) = that pair as an int32 (pair 0 in the low half), widened to two f32 by a
// shift and a mask (exact: a bf16 is an f32's high half); x as bf16_input gives it.
template <typename Weight>  // Halide::ImageParam or Halide::Func
void define_bf16_acc(Func acc, const Func& xr, bool fma, const RDom& r, const Var& j, const Var& p,
                     const Var& m, const Weight& w) {
  acc(j, p, m) = 0.0f;
  if (fma) {
    Expr pair = Halide::cast<uint32_t>(w(std::vector<Expr>{j, r.y, p}));
    Expr wf = Halide::select(r.x == 0, pair << 16, pair & Expr(uint32_t{0xffff0000u}));
    acc(j, p, m) += xr(2 * r.y + r.x, m) * Halide::reinterpret(Halide::Float(32), wf);
  } else {
    acc(j, p, m) += Halide::cast<float>(xr(2 * r.y + r.x, m)) *
                    Halide::cast<float>(w(std::vector<Expr>{r.x, j, r.y, p}));
  }
}

// out_bf16: rounded as a bf16 kernel rounds its input. Where every output is computed in
// vectors (`vectors`: N a multiple of the panel, no scalar tail), by vcvtneps2bf16 (Halide's
// vector f32 -> bf16 cast), one instruction for what round_to_bf16_bits does in eight; else by
// round_to_bf16_bits itself (Halide's scalar conversion keeps subnormals, the instruction
// flushes them).
Expr bf16_output(const Expr& acc, const Expr& bias, const std::string& act, bool out_bf16,
                 bool vectors) {
  Expr y = acc;
  if (bias.defined()) y += bias;
  if (act != "none") y = float_function(act, y);
  if (out_bf16)
    y = vectors ? Halide::cast(Halide::BFloat(16), y)
                : Halide::reinterpret(Halide::BFloat(16), round_to_bf16_bits(y));
  return y;
}

void set_packed_bf16_bounds(Halide::ImageParam& wt, bool fma, int Kp, int Np) {
  constexpr int P = 64;
  if (fma) {
    wt.dim(0).set_bounds(0, P);
    wt.dim(1).set_bounds(0, Kp / 2).set_stride(P);
    wt.dim(2).set_bounds(0, Np / P).set_stride(P * Kp / 2);
    wt.set_estimates({{0, P}, {0, Kp / 2}, {0, Np / P}});
  } else {
    wt.dim(0).set_bounds(0, 2);
    wt.dim(1).set_bounds(0, P).set_stride(2);
    wt.dim(2).set_bounds(0, Kp / 2).set_stride(2 * P);
    wt.dim(3).set_bounds(0, Np / P).set_stride(P * Kp);
    wt.set_estimates({{0, 2}, {0, P}, {0, Kp / 2}, {0, Np / P}});
  }
}

Halide::ImageParam packed_bf16_weight(bool fma) {
  return fma ? Halide::ImageParam(Halide::Int(32), 3, "wt")
             : Halide::ImageParam(Halide::BFloat(16), 4, "wt");
}

// x is rounded once per chunk of rows (c), not per register block of every panel: for the
// output projection (500 panels) that was one rounding per 64 products, about 12% of the
// instructions of the products themselves. In parallel blocks of 16 rows, or serially where
// `serial` holds (c is itself a parallel tile).
void schedule_bf16_input(Func xr, Func out, const Var& c, const Var& k, const Var& m, int Kp,
                         const Expr& serial = Expr()) {
  constexpr int lanes = 16;
  Var xo("xo");
  xr.compute_at(out, c);
  std::vector<Halide::Stage> stages = {xr};
  if (serial.defined()) stages.push_back(xr.specialize(serial));
  for (Halide::Stage s : stages) {
    s.split(m, xo, m, 16, TailStrategy::GuardWithIf);
    if (Kp >= 2 * lanes) s.vectorize(k, 2 * lanes);  // shifted inwards within [0, Kp)
  }
  xr.parallel(xo);
}

// linear_rows with bf16 weights (LinearKernel::rows): output column n is W's row ids(n), read
// from the packed bf16 weight the library's full linear reads, in the same product form, so
// its outputs are the full linear's at those columns, bit for bit. As the int8 rows kernel
// (linear_int8_kernel.cpp): per tile, the block's 64 rows gathered into a strip laid out as a
// panel (a pair of K, 4 bytes, per load), then the full kernel's register blocks on it.
KernelPipeline build_linear_bf16_rows(const LinearKernel& spec) {
  constexpr int P = 64;
  const int K = static_cast<int>(spec.K), V = static_cast<int>(spec.N);
  const int Kp = K + K % 2, Vp = (V + P - 1) / P * P;  // as packed
  const bool fma = spec.bf16_fma;

  Halide::ImageParam x(Halide::Float(32), 2, "x");
  Halide::ImageParam wt = packed_bf16_weight(fma);  // as build_linear_bf16's, over V rows
  Halide::ImageParam ids(Halide::Int(64), 1, "ids");
  Halide::ImageParam bias(Halide::Float(32), 1, "bias");
  Var n("n"), m("m"), k("k"), j("j"), p("p"), g("g"), kh("kh");
  const Expr id = packed_row_id(ids, p, j, V);
  Func strip("strip"), sbias("sbias");
  if (fma)
    strip(j, kh, p) = wt(id % P, kh, id / P);
  else
    strip(g, j, kh, p) = wt(g, id % P, kh, id / P);
  sbias(j, p) = spec.has_bias ? bias(id) : 0.0f;

  KILN_ASSERT(!spec.x_bf16 && !spec.out_bf16, "bf16 linear_rows kernel with bf16 activations");
  Func xr = bf16_input(x, K, fma, false, k, m);
  RDom r(0, 2, 0, Kp / 2, "r");
  Func acc("acc");
  define_bf16_acc(acc, xr, fma, r, j, p, m, strip);
  const Expr jn = n % P, pn = n / P;
  Func out("out");
  out(n, m) =
      bf16_output(acc(jn, pn, m), spec.has_bias ? sbias(jn, pn) : Expr(), spec.act, false, false);

  const Expr M = constrain_rows_buffers(x, ids, bias, out, K, V);
  set_packed_bf16_bounds(wt, fma, Kp, Vp);

  if (fma)
    strip.reorder(j, kh, p);
  else
    strip.reorder(g, j, kh, p).vectorize(g);
  sbias.vectorize(j, 16);
  const Var c = schedule_packed_rows(out, acc, r, n, m, j, M, Kp / 2, !fma, {strip, sbias});
  schedule_bf16_input(xr, out, c, k, m, Kp);

  std::vector<Halide::Argument> args = {x, wt, ids};
  if (spec.has_bias) args.push_back(bias);
  return KernelPipeline{Halide::Pipeline(out), args};
}

}  // namespace

KernelPipeline build_linear_bf16(const LinearKernel& spec, const Halide::Target& target) {
  constexpr int P = 64;
  KILN_ASSERT(spec.bf16 && spec.panel == P, "bf16 linear kernel needs 64-column panels");
  KILN_ASSERT(target.has_feature(Halide::Target::AVX512_SapphireRapids),
              "bf16 linear kernel needs a target with AVX512-BF16");
  KILN_ASSERT(spec.K <= (int64_t{1} << 30) && spec.N <= (int64_t{1} << 30),
              "linear kernel dims must fit in int32");
  if (spec.rows) return build_linear_bf16_rows(spec);
  const int K = static_cast<int>(spec.K), N = static_cast<int>(spec.N);
  const int Kp = K + K % 2, Np = (N + P - 1) / P * P;  // as packed (zero padding)

  const bool fma = spec.bf16_fma;
  Halide::ImageParam x(spec.x_bf16 ? Halide::BFloat(16) : Halide::Float(32), 2, "x");
  Halide::ImageParam wt = packed_bf16_weight(fma);
  Halide::ImageParam bias(Halide::Float(32), 1, "bias");
  Var n("n"), m("m"), k("k"), j("j"), p("p");

  Func xr = bf16_input(x, K, fma, spec.x_bf16, k, m);
  RDom r(0, 2, 0, Kp / 2, "r");
  Func acc("acc");
  define_bf16_acc(acc, xr, fma, r, j, p, m, wt);
  Func out("out");
  out(n, m) = bf16_output(acc(n % P, n / P, m), spec.has_bias ? bias(n) : Expr(), spec.act,
                          spec.out_bf16, N % P == 0);

  x.dim(0).set_bounds(0, K);
  x.dim(1).set_min(0);
  set_packed_bf16_bounds(wt, fma, Kp, Np);
  bias.dim(0).set_bounds(0, N);
  Halide::OutputImageParam ob = out.output_buffer();
  ob.dim(0).set_bounds(0, N);
  ob.dim(1).set_min(0).set_stride(N);
  x.set_estimates({{0, K}, {0, 2048}});
  bias.set_estimates({{0, N}});
  out.set_estimates({{0, N}, {0, 2048}});

  // A panel of 128 KB from K = 1024 on; there, and where the panels are small
  // (kPanelsPerTileBytes), rows are the parallel tiles, each rounding its own (the FMA form at K
  // 1024–2048, M 512–2048: 1.03–1.10× on Intel Emerald Rapids, vdpbf16ps 1.03–1.04×, paired in one
  // process).
  const bool long_k = Kp >= 1024;
  const bool small = int64_t{2} * Np * Kp <= kPanelsPerTileBytes;  // the panels' bytes
  // Where schedule_packed_linear runs the chunked loops (4 to 63 rows but where tiles of rows
  // are the parallel ones; 64 to 191 that 6 does not divide, with a short reduction): the next
  // panel prefetched (prefetch_next_panels).
  const int chunk = prefetch_chunk(target, Np / P);
  const PackedLoops loops = schedule_packed_linear(out, acc, r, n, m, j, N, Np, Kp / 2, long_k,
                                                   !fma, long_k || small, small, chunk);
  // x already bf16 (K even): read in place, no copy of its own.
  if (!spec.x_bf16 || fma || K % 2 != 0)
    schedule_bf16_input(xr, out, loops.c, k, m, Kp, loops.per_tile);

  std::vector<Halide::Argument> args = {x, wt};
  if (spec.has_bias) args.push_back(bias);
  KernelPipeline kp{Halide::Pipeline(out), args};
  if (chunk) prefetch_next_panels(kp, target, chunk, int64_t{2} * P * Kp, wt.type());
  return kp;
}

}  // namespace kiln::codegen
