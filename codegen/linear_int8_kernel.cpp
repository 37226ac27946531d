// The `linear` kernel with int8 weights (kernels.h, LinearKernel::int8): the weight quantized
// per output row at load time (support/int8.h: symmetric s8, q = round(w · 127 / max|row|),
// scale max|row| / 127) and packed in panels of 64 columns, each column's 4 consecutive K
// adjacent (as vpdpbusd reads them); each row of the input quantized as it is read
// (asymmetric u8 with a zero point z, step s: x ≈ s · (u − z)); the products summed in int32
// by AVX512-VNNI's `vpdpbusd` (64 u8 × s8 products into 16 int32 lanes per instruction, four
// times the FMA rate of f32); the zero point taken off exactly in int32 (Σ u·q_w − z·Σ q_w),
// then scaled by the two scales, the bias and activation applied in f32.
//
// Schedule: the bf16 kernel's (schedule_packed_linear), with groups of 4 instead of pairs:
// Halide 14 matches the atomically vectorized sum over a group of 4 of i32(u8) · i32(i8) to
// vpdpbusd (measured: it needs avx512_sapphirerapids in the Halide target, so these kernels
// are compiled as the bf16 ones, LLVM IR through llc for cooperlake; see kernels.cpp). The
// input is quantized once per chunk of rows, in one parallel loop over blocks of 16 rows
// (each block's ranges, then its u8 copy with the parameters after each row), or, where rows
// are the parallel tiles (long reductions, small panels: kPanelsPerTileBytes), by each tile for
// its own rows, serially, before it runs the panels. The inner loop is
// oneDNN's brgemm kernel's (6 rows × 4 vectors, per group of K 6 broadcasts, 4 loads, 24 vpdpbusd;
// bench/README.md "session 13"); smaller row tiles with the panels fastest, tried at K 512, ran
// slower with 2 threads.
#include <string>
#include <vector>

#include "codegen/halide_kernels.h"
#include "support/error.h"
#include "support/int8.h"

namespace kiln::codegen {

using Halide::Expr;
using Halide::Func;
using Halide::RDom;
using Halide::TailStrategy;
using Halide::Var;

namespace {

// The input's rows quantized as support/int8.h does it (asymmetric, u8): quant(m) = (inverse,
// zero, step) and the u8 copy xq(k, m): k in [0, Kp) the row's values (the padding columns any
// value: their weights are 0), then the row's parameters as the epilogue reads them (zero_of,
// step_of): byte Kp the zero point, bytes Kp + 1 to Kp + 4 the step's bits (little-endian). The
// caller computes xq at its chunk of rows (compute_at), `schedule` the rest.
struct QuantizedInput {
  Func quant{"quant"}, xq{"xq"};
  Func lane_range{"lane_range"}, range{"range"};
  Var l{"l"};
  Halide::RVar rk;
  int Kp = 0;
  // The zero point and the step of row m, read back from the copy.
  Expr zero_of(const Expr& m) const { return Halide::cast<int32_t>(xq(Kp, m)); }
  Expr step_of(const Expr& m) const {
    Expr bits = Halide::cast<uint32_t>(xq(Kp + 1, m));
    for (int b = 1; b < 4; ++b)
      bits = bits | (Halide::cast<uint32_t>(xq(Kp + 1 + b, m)) << static_cast<uint32_t>(8 * b));
    return Halide::reinterpret<float>(bits);
  }
  // Per chunk of rows, one parallel loop over blocks of 16 rows (serially where `serial`
  // holds: the chunk is a parallel tile): a block's ranges and parameters, then its u8 copy
  // and parameters, while the block's x (16 rows, 32 KB at K 512, 128 KB at K 2048) is still in
  // L1 or L2. The parameters travel in the copy's rows so that the epilogue, outside the
  // block's loop, can read them: before, they were a Func of their own that both the copy and
  // the epilogue read, computed for the whole chunk in a parallel loop of its own before the
  // copy, which read the chunk's x a second time from L3 or memory (x is 4 MB at M 2048 K 512,
  // 16 MB at K 2048).
  // Before that, the ranges were one serial loop with a horizontal min and max per 16 values:
  // M2048 K512 N512 took 1466 µs, then 1345 µs; M32 K512 N512 23.8, then 21.7 µs (fastest of
  // 16 runs, 2 threads, AMD EPYC Zen 4). The lanes' ranges of a block (16 × 16 × 3 floats)
  // live on the stack: on the heap they were one halide_malloc per block of every call (384
  // at M 2048).
  void schedule(const Var& k, const Var& m, const Expr& serial = Expr()) {
    Var xo("xo");
    // The serial specialization first (a specialization copies the schedule made so far).
    std::vector<Halide::Stage> xqs = {xq};
    if (serial.defined()) xqs.push_back(xq.specialize(serial));
    for (Halide::Stage s : xqs) {
      s.split(m, xo, m, 16, TailStrategy::GuardWithIf);
      if (Kp >= 64) s.vectorize(k, 64, TailStrategy::ShiftInwards);
    }
    xq.parallel(xo).align_storage(k, 64);  // rows 64-byte aligned, as the products read them
    quant.compute_at(xq, xo);
    range.compute_at(xq, xo);
    lane_range.compute_at(xq, xo).store_in(Halide::MemoryType::Stack).vectorize(l);
    lane_range.update().reorder(l, rk, m).vectorize(l);
  }
};

QuantizedInput quantize_input(const Halide::ImageParam& x, int K, const Var& k, const Var& m) {
  // The range in 16 lanes first (lane l: the columns l, l + 16, …; past K the last column
  // again), then across the lanes: one vector min and max per 16 values, no horizontal
  // reduction in the loop.
  constexpr int L = 16;
  QuantizedInput q;
  const Var& l = q.l;
  RDom rk(0, (K + L - 1) / L, "rk");
  q.rk = rk.x;
  // The third value: 1 where the lane saw a NaN or an infinity (such a row gets step NaN, so
  // its outputs are NaN, as support/int8.h's input_row says; min and max alone would drop a
  // NaN).
  Func& lane_range = q.lane_range;
  lane_range(l, m) = {0.0f, 0.0f, 0.0f};
  {
    Expr col = K % L == 0 ? L * rk + l : Halide::min(L * rk + l, K - 1);
    Expr v = x(col, m);
    lane_range(l, m) = {Halide::min(lane_range(l, m)[0], v), Halide::max(lane_range(l, m)[1], v),
                        Halide::select(Halide::is_finite(v), lane_range(l, m)[2], 1.0f)};
  }
  RDom rl(0, L, "rl");
  Func& range = q.range;  // (lo, hi, bad): min(row, 0), max(row, 0), 1 if not all finite
  range(m) = {0.0f, 0.0f, 0.0f};
  range(m) = {Halide::min(range(m)[0], lane_range(rl, m)[0]),
              Halide::max(range(m)[1], lane_range(rl, m)[1]),
              Halide::max(range(m)[2], lane_range(rl, m)[2])};
  {
    const Expr bad = range(m)[2] > 0.0f;
    Expr width = range(m)[1] - range(m)[0];
    Expr inverse = Halide::select(width > 0.0f && !bad, 255.0f / width, 0.0f);
    Expr step = Halide::select(
        bad,
        Halide::reinterpret(Halide::Float(32), Halide::cast<uint32_t>(Halide::Expr(0x7fc00000))),
        width * (1.0f / 255.0f));
    q.quant(m) = {inverse, Halide::select(bad, 0.0f, Halide::round(-range(m)[0] * inverse)), step};
  }
  // u = clamp(round(x · inverse) + zero, 0, 255) (support/int8.h) in integers: y = x · inverse
  // is at most 255 (and a little) in magnitude, so y + 1.5 · 2^23 lies in [2^23, 2^24), where the
  // f32 spacing is 1: the addition rounds y to the nearest integer, ties to even, as `round`,
  // and that integer is the sum's bits minus those of 1.5 · 2^23. strict_float keeps the two
  // roundings (the product's, then the sum's) from being fused into one FMA, which would round
  // the exact product instead and could differ from the reference at a tie. Per 16 values: a
  // multiply, an add, three integer operations and the narrowing, where Halide 14's `round`
  // took two 256-bit vroundps, their extract and insert, and float clamps (M2048 K2048 N512,
  // paired against oneDNN, alternated: 84.5% → 87.6%; the other shapes 0–1% up).
  constexpr float kRound = 12582912.0f;  // 1.5 · 2^23
  constexpr int32_t kRoundBits = 0x4B400000;
  const Expr y = Halide::strict_float(x(Halide::min(k, K - 1), m) * q.quant(m)[0] + kRound);
  const Expr u =
      Halide::reinterpret<int32_t>(y) - (kRoundBits - Halide::cast<int32_t>(q.quant(m)[1]));
  const Expr value = Halide::cast<uint8_t>(Halide::clamp(u, 0, 255));
  // The parameters after the values (QuantizedInput): Halide partitions the loop at `likely`,
  // so the values' vectors carry no select.
  q.Kp = (K + 3) / 4 * 4;
  const Expr at = k - q.Kp;
  const Expr step_bits = Halide::reinterpret<uint32_t>(q.quant(m)[2]);
  const Expr param = Halide::select(
      at == 0, Halide::cast<uint8_t>(q.quant(m)[1]),
      Halide::cast<uint8_t>(step_bits >> Halide::cast<uint32_t>(8 * Halide::clamp(at - 1, 0, 3))));
  q.xq(k, m) = Halide::select(Halide::likely(k < q.Kp), value, param);
  return q;
}

// The epilogue of both int8 kernels, one expression so that linear_rows' outputs are the full
// kernel's bit for bit: the zero point taken off the int32 sum exactly, then the two scales,
// the bias and the activation in f32. `sum` and `scale` are the weight row's.
Expr int8_output(const Expr& acc, const QuantizedInput& q, const Var& m, const Expr& sum,
                 const Expr& scale, const Expr& bias, const std::string& act) {
  Expr exact = acc - q.zero_of(m) * sum;
  Expr y = Halide::cast<float>(exact) * (q.step_of(m) * scale);
  if (bias.defined()) y += bias;
  if (act != "none") y = float_function(act, y);
  return y;
}

void set_packed_bounds(Halide::ImageParam& wt, Halide::ImageParam& wscale, Halide::ImageParam& wsum,
                       int Kg, int Np) {
  constexpr int P = 64, G = 4;
  wt.dim(0).set_bounds(0, G);
  wt.dim(1).set_bounds(0, P).set_stride(G);
  wt.dim(2).set_bounds(0, Kg).set_stride(G * P);
  wt.dim(3).set_bounds(0, Np / P).set_stride(P * G * Kg);
  wscale.dim(0).set_bounds(0, Np);
  wsum.dim(0).set_bounds(0, Np);
  wt.set_estimates({{0, G}, {0, P}, {0, Kg}, {0, Np / P}});
  wscale.set_estimates({{0, Np}});
  wsum.set_estimates({{0, Np}});
}

// linear_rows with int8 weights (LinearKernel::rows): output column n is W's row ids(n), read
// from the packed int8 weight the library's full linear reads (no copy of W in any other
// layout), so its outputs are bit for bit the full linear's at those columns. Per tile (a
// block of 64 columns × the rows), the block's 64 rows are gathered into a strip laid out as
// a panel (4 bytes of a row per group of K, one 32-bit load each, a row's groups one after
// the other) with their scales, sums and biases; the register blocks then run the full
// kernel's loop on the strip. The gather is what costs: a row's groups lie 256 bytes apart,
// so ids spread over the vocabulary read about as many 64-byte lines as the whole weight has
// (each used for few bytes). Measured (a JIT microbenchmark, 2 threads, Intel Emerald Rapids,
// K 512, V 32000, 4096 sorted random ids, the weight in cache): M 128 914 µs against 3263 µs
// for the full kernel; M 1 421 against 312 µs (a decoding step of one row: the full kernel
// streams its panels, the gather does not).
KernelPipeline build_linear_int8_rows(const LinearKernel& spec) {
  constexpr int P = 64, G = 4;
  const int K = static_cast<int>(spec.K), V = static_cast<int>(spec.N);
  const int Kg = (K + G - 1) / G, Vp = (V + P - 1) / P * P;  // as packed

  Halide::ImageParam x(Halide::Float(32), 2, "x");
  Halide::ImageParam wt(Halide::Int(8), 4, "wt");  // as build_linear_int8's, over V rows
  Halide::ImageParam wscale(Halide::Float(32), 1, "wscale");
  Halide::ImageParam wsum(Halide::Int(32), 1, "wsum");
  Halide::ImageParam ids(Halide::Int(64), 1, "ids");
  Halide::ImageParam bias(Halide::Float(32), 1, "bias");
  Var n("n"), m("m"), k("k"), j("j"), p("p"), g("g"), kg("kg");
  QuantizedInput q = quantize_input(x, K, k, m);

  const Expr id = packed_row_id(ids, p, j, V);
  Func strip("strip"), sscale("sscale"), ssum("ssum"), sbias("sbias");
  strip(g, j, kg, p) = wt(g, id % P, kg, id / P);
  sscale(j, p) = wscale(id);
  ssum(j, p) = wsum(id);
  sbias(j, p) = spec.has_bias ? bias(id) : 0.0f;

  RDom r(0, G, 0, Kg, "r");
  Func acc("acc");  // acc(j, p, m): column p·64 + j
  acc(j, p, m) = 0;
  acc(j, p, m) +=
      Halide::cast<int32_t>(q.xq(G * r.y + r.x, m)) * Halide::cast<int32_t>(strip(r.x, j, r.y, p));
  const Expr jn = n % P, pn = n / P;
  Func out("out");
  out(n, m) = int8_output(acc(jn, pn, m), q, m, ssum(jn, pn), sscale(jn, pn),
                          spec.has_bias ? sbias(jn, pn) : Expr(), spec.act);

  const Expr M = constrain_rows_buffers(x, ids, bias, out, K, V);
  set_packed_bounds(wt, wscale, wsum, Kg, Vp);

  strip.reorder(g, j, kg, p).vectorize(g);
  for (Func f : {sscale, ssum, sbias}) f.vectorize(j, 16);
  const Var c =
      schedule_packed_rows(out, acc, r, n, m, j, M, Kg, true, {strip, sscale, ssum, sbias});
  q.xq.compute_at(out, c);
  q.schedule(k, m);

  std::vector<Halide::Argument> args = {x, wt, wscale, wsum, ids};
  if (spec.has_bias) args.push_back(bias);
  return KernelPipeline{Halide::Pipeline(out), args};
}

}  // namespace

KernelPipeline build_linear_int8(const LinearKernel& spec, const Halide::Target& target) {
  constexpr int P = 64, G = 4;
  KILN_ASSERT(spec.int8 && spec.panel == P, "int8 linear kernel needs 64-column panels");
  KILN_ASSERT(target.has_feature(Halide::Target::AVX512_SapphireRapids),
              "int8 linear kernel needs a target with AVX512-VNNI");
  KILN_ASSERT(spec.K >= 1 && spec.K <= int8::kMaxK && spec.N <= (int64_t{1} << 30),
              "int8 linear kernel: K must be in [1, 65536]");
  if (spec.rows) return build_linear_int8_rows(spec);
  const int K = static_cast<int>(spec.K), N = static_cast<int>(spec.N);
  const int Kg = (K + G - 1) / G, Kp = Kg * G, Np = (N + P - 1) / P * P;  // as packed

  Halide::ImageParam x(Halide::Float(32), 2, "x");
  // wt(g, j, kg, p) = q(W)[p·64 + j, 4·kg + g]; wscale(n): row n's scale; wsum(n) = Σ_k q(W)[n, k].
  Halide::ImageParam wt(Halide::Int(8), 4, "wt");
  Halide::ImageParam wscale(Halide::Float(32), 1, "wscale");
  Halide::ImageParam wsum(Halide::Int(32), 1, "wsum");
  Halide::ImageParam bias(Halide::Float(32), 1, "bias");
  Var n("n"), m("m"), k("k"), j("j"), p("p");
  QuantizedInput q = quantize_input(x, K, k, m);

  RDom r(0, G, 0, Kg, "r");
  Func acc("acc");  // acc(j, p, m): column p·64 + j
  acc(j, p, m) = 0;
  acc(j, p, m) +=
      Halide::cast<int32_t>(q.xq(G * r.y + r.x, m)) * Halide::cast<int32_t>(wt(r.x, j, r.y, p));
  Func out("out");
  out(n, m) = int8_output(acc(n % P, n / P, m), q, m, wsum(n), wscale(n),
                          spec.has_bias ? bias(n) : Expr(), spec.act);

  x.dim(0).set_bounds(0, K);
  x.dim(1).set_min(0);
  set_packed_bounds(wt, wscale, wsum, Kg, Np);
  bias.dim(0).set_bounds(0, N);
  Halide::OutputImageParam ob = out.output_buffer();
  ob.dim(0).set_bounds(0, N);
  ob.dim(1).set_min(0).set_stride(N);
  x.set_estimates({{0, K}, {0, 2048}});
  bias.set_estimates({{0, N}});
  out.set_estimates({{0, N}, {0, 2048}});

  // A panel of 128 KB from K = 2048 on, as for bf16 (K = 1024); there, and where the panels are
  // small (kPanelsPerTileBytes), rows are the parallel tiles, each quantizing its own.
  const bool long_k = Kp >= 2048;
  const bool small = int64_t{Np} * Kp <= kPanelsPerTileBytes;  // the panels' bytes
  // Where schedule_packed_linear runs the chunked loops (4 to 63 rows but where tiles of rows
  // are the parallel ones; 64 to 191 that 6 does not divide, with a short reduction): the next
  // panel prefetched (prefetch_next_panels).
  const int chunk = prefetch_chunk(target, Np / P);
  const PackedLoops loops = schedule_packed_linear(out, acc, r, n, m, j, N, Np, Kg, long_k, true,
                                                   long_k || small, small, chunk);
  q.xq.compute_at(out, loops.c);
  q.schedule(k, m, loops.per_tile);

  std::vector<Halide::Argument> args = {x, wt, wscale, wsum};
  if (spec.has_bias) args.push_back(bias);
  KernelPipeline kp{Halide::Pipeline(out), args};
  if (chunk) prefetch_next_panels(kp, target, chunk, int64_t{P} * Kp, wt.type());
  return kp;
}

}  // namespace kiln::codegen
